"""A reader of UBJSON (ubjson.org, draft 12), the subset nlohmann::json writes: the frontend's
serialized graph format (``pygraph.serialize(as_bytes=True)``), which the native path and
the plan store read."""

from __future__ import annotations

import struct
from typing import Any, Optional

__all__ = ["decode_ubjson"]

_FIXED = {
    ord("i"): struct.Struct(">b"),
    ord("U"): struct.Struct(">B"),
    ord("I"): struct.Struct(">h"),
    ord("l"): struct.Struct(">i"),
    ord("L"): struct.Struct(">q"),
    ord("d"): struct.Struct(">f"),
    ord("D"): struct.Struct(">d"),
}


class _Reader:
    """A decoder for UBJSON (ubjson.org, draft 12), the subset nlohmann::json writes."""

    def __init__(self, data: bytes):
        self.data = memoryview(data)
        self.at = 0

    def marker(self) -> int:
        while True:
            byte = self.data[self.at]
            self.at += 1
            if byte != ord("N"):  # no-op
                return byte

    def fixed(self, marker: int):
        layout = _FIXED[marker]
        (value,) = layout.unpack_from(self.data, self.at)
        self.at += layout.size
        return value

    def length(self) -> int:
        return int(self.fixed(self.marker()))

    def text(self) -> str:
        size = self.length()
        value = bytes(self.data[self.at : self.at + size]).decode("utf-8")
        self.at += size
        return value

    def value(self, marker: Optional[int] = None) -> Any:
        marker = self.marker() if marker is None else marker
        if marker in _FIXED:
            return self.fixed(marker)
        if marker == ord("Z"):
            return None
        if marker == ord("T"):
            return True
        if marker == ord("F"):
            return False
        if marker == ord("C"):
            value = chr(self.data[self.at])
            self.at += 1
            return value
        if marker in (ord("S"), ord("H")):
            return self.text()
        if marker in (ord("["), ord("{")):
            return self.container(marker == ord("{"))
        raise ValueError(f"UBJSON: unknown marker {chr(marker)!r} at byte {self.at - 1}")

    def container(self, is_object: bool):
        element_type = count = None
        if self.data[self.at] == ord("$"):
            self.at += 1
            element_type = self.marker()
        if self.data[self.at] == ord("#"):
            self.at += 1
            count = self.length()
        out = {} if is_object else []
        end = ord("}") if is_object else ord("]")
        index = 0
        while count is None or index < count:
            if count is None and self.data[self.at] == end:
                self.at += 1
                break
            key = self.text() if is_object else None
            item = self.value(element_type)
            if is_object:
                out[key] = item
            else:
                out.append(item)
            index += 1
        return out


def decode_ubjson(data: bytes) -> Any:
    """The one value UBJSON ``data`` holds (what ``graph.serialize(as_bytes=True)`` returns)
    as Python dicts, lists and scalars; a ValueError if bytes follow it."""
    reader = _Reader(bytes(data))
    value = reader.value()
    if reader.at != len(reader.data):
        raise ValueError(f"UBJSON: {len(reader.data) - reader.at} bytes after the value")
    return value


