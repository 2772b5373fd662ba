"""UBJSON documents written as the frontend's serialized graphs are (nlohmann::json::to_ubjson):
test_native_eligibility.py's, which test_plan_store.py uses too."""

import struct


def encode(value) -> bytes:
    """UBJSON as nlohmann::json::to_ubjson writes the types used here."""
    if isinstance(value, bool):
        return b"T" if value else b"F"
    if isinstance(value, int):
        return b"L" + struct.pack(">q", value)
    if isinstance(value, float):
        return b"D" + struct.pack(">d", value)
    if isinstance(value, str):
        return b"SL" + struct.pack(">q", len(value.encode())) + value.encode()
    if isinstance(value, list):
        return b"[" + b"".join(encode(v) for v in value) + b"]"
    if isinstance(value, dict):
        return b"{" + b"".join(b"L" + struct.pack(">q", len(k)) + k.encode() + encode(v) for k, v in value.items()) + b"}"
    raise TypeError(value)
