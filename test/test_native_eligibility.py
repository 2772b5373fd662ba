"""The decoder of the frontend's serialized graphs (UBJSON), which the native path reads
the backend plan from. Byte strings below are UBJSON as nlohmann::json::to_ubjson writes it."""

import struct

import pytest

from torch_cudnn_handle.native import decode_ubjson


def key(text: str) -> bytes:
    return b"U" + bytes([len(text)]) + text.encode()


def test_scalars_of_every_width():
    cases = {
        b"Z": None,
        b"T": True,
        b"F": False,
        b"i\xff": -1,
        b"U\xc8": 200,
        b"I" + struct.pack(">h", -300): -300,
        b"l" + struct.pack(">i", 70000): 70000,
        b"L" + struct.pack(">q", 2**40): 2**40,
        b"d" + struct.pack(">f", 0.5): 0.5,
        b"D" + struct.pack(">d", -5.25): -5.25,
        b"Cx": "x",
        b"SU\x03abc": "abc",
        b"N" + b"U\x07": 7,  # a no-op before a value is skipped
    }
    for blob, expected in cases.items():
        assert decode_ubjson(blob) == expected, blob


def test_a_graph_like_document():
    plan = '{"engineId":9}\x00'
    blob = (
        b"{"
        + key("cudnn_backend_data") + b"S" + b"U" + bytes([len(plan)]) + plan.encode()
        + key("variant_pack_uids") + b"[U\x01U\x02U\x06]"
        + key("pass_by_values") + b"{}"
        + key("fe_workspace_size") + b"U\x00"
        + b"}"
    )
    document = decode_ubjson(blob)
    assert document == {"cudnn_backend_data": plan, "variant_pack_uids": [1, 2, 6], "pass_by_values": {}, "fe_workspace_size": 0}


def test_optimized_containers():
    assert decode_ubjson(b"[$U#U\x03\x01\x02\x03") == [1, 2, 3]
    assert decode_ubjson(b"[#U\x02TF") == [True, False]
    assert decode_ubjson(b"{#U\x01" + key("k") + b"SU\x01v") == {"k": "v"}


def test_an_unknown_marker_is_an_error():
    with pytest.raises(ValueError, match="unknown marker"):
        decode_ubjson(b"[X]")
