"""The native path: backend-served plans executed from C++, with no Python per call.

When the registry builds a graph whose selected plan is served by the cuDNN backend
(every plan on sm90), it hands the plan to the extension here; the CUDA kernel of
``cudnn_fe.execute`` then runs it directly: dispatcher -> pooled handle -> stream ->
context check -> ``cudnnBackendExecute``. Plans served by the frontend's Python
engines (frost), and backend plans that need the frontend's per-call help
(pass-by-value scalars, workspace modifications, variant-pack replacements, frontend
workspace), keep the Python path. The choice is per built graph and visible
(``BuiltGraph.native``, ``registry_stats()['native']``).

How the plan crosses over, and why that is safe: ``pygraph.serialize()`` of a backend
plan is the frontend's documented serialized form (UBJSON, written by its C++
``Graph::serialize``), whose ``cudnn_backend_data`` field is the backend's own JSON
representation of the execution plan (``CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION``).
The extension deserializes that JSON into a plan with the cuDNN backend C API alone
(``cudnnBackend*`` from the one libcudnn the frontend loaded; see
``csrc/backend/cudnn_library.h``), on a pooled handle of the device it will run on. No
frontend C++ header is compiled into the extension, so nothing depends on which of two
cudnn_frontend copies (the wheel's, libtorch_cuda's) the dynamic linker binds.
"""

from __future__ import annotations

import struct
from typing import Any, Optional, Tuple

__all__ = ["decode_ubjson", "backend_plan_of"]

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
    return _Reader(bytes(data)).value()


def backend_plan_of(graph, uids: Tuple[int, ...]) -> Tuple[Optional[str], str]:
    """``(plan_json, why)``: the backend plan's JSON when ``graph``'s selected plan can
    run natively with exactly the operands ``uids`` and nothing else, else
    ``(None, the reason)``."""
    if getattr(graph, "selected_engine", None) is not None:
        return None, f"served by the frontend's Python engine {graph.selected_engine.name!r}"
    try:
        document = decode_ubjson(graph.serialize(as_bytes=True))
    except Exception as error:  # noqa: BLE001 -- a graph the frontend cannot serialize keeps the Python path
        return None, f"not serializable ({type(error).__name__}: {error})"
    for field in ("pass_by_values", "workspace_modifications", "variant_pack_replacements"):
        if document.get(field):
            return None, f"needs the frontend per call ({field})"
    if document.get("fe_workspace_size", 0):
        return None, "needs the frontend per call (fe_workspace_size)"
    if sorted(document.get("variant_pack_uids", ())) != sorted(uids):
        return None, "its variant pack is not exactly the op's operands"
    plan_json = document.get("cudnn_backend_data")
    if not isinstance(plan_json, str) or not plan_json:
        return None, "no backend plan in the serialized graph"
    return plan_json, "backend plan"
