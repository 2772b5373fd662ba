"""What the native path reads from the frontend's serialized graphs: the UBJSON decoder
(byte strings below are UBJSON as nlohmann::json::to_ubjson writes it) and which plans
qualify to run from C++."""

import re
import struct

import pytest

import torch_cudnn_handle as tch
from support.ubjson import encode
from torch_cudnn_handle.native import backend_plan_of, decode_ubjson


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


# ---------------------------------------------------------------------------------
# Which serialized plans run natively: an allowlist of the document's fields.


class SerializedGraph:
    """Stands in for a built pygraph: what backend_plan_of reads (no GPU needed)."""

    selected_engine = None

    def __init__(self, document):
        self.blob = encode(document)

    def serialize(self, as_bytes):
        return self.blob


def document(**changes):
    base = {
        "json_version": "2.0", "gid": 1, "aligned_operands": {"1": [16, 2]}, "context": {"name": "g"}, "nodes": [], "tensors": {}, "behavior_notes": [],
        "cudnn_backend_version": "9.19.0", "cudnn_frontend_version": 13200, "cudnn_backend_data": '{"plan":1}',
        "variant_pack_uids": [1, 2, 3], "pass_by_values": {}, "workspace_modifications": {},
        "variant_pack_replacements": [], "fe_workspace_size": 0, "tensors_to_dump": [],
    }
    base.update(changes)
    return base


def test_a_plain_backend_plan_runs_natively():
    spec, why = backend_plan_of(SerializedGraph(document()), (1, 2, 3))
    assert spec is not None and spec.plan_json == '{"plan":1}' and why == "backend plan"


def test_what_the_frontend_adds_per_call_is_carried_over():
    doc = document(
        variant_pack_uids=[1, 2, 3, 7, 8],
        pass_by_values={"7": {"index": 3, "value": "3E000000"}},  # float 0.125, as the frontend writes it
        workspace_modifications={"8": [1, 0, ["44800000"]], "9": [2, 1024, []]},  # zero 1024 bytes at 0; place one at 1024
        fe_workspace_size=2048,
    )
    doc["variant_pack_uids"].append(9)
    spec, why = backend_plan_of(SerializedGraph(doc), (1, 2, 3))
    assert spec is not None, why
    assert spec.by_value == ((7, struct.pack("<f", 0.125)),)
    assert spec.workspace_tensors == ((8, 0, 1024), (9, 1024, 0)) and spec.fe_workspace_size == 2048


def test_tensors_to_dump_are_a_log_the_native_path_skips_unless_the_frontend_dumps(monkeypatch):
    doc = document(tensors_to_dump=[[1, "d"]])  # sdpa's ragged offsets, as the frontend lists them
    monkeypatch.delenv("CUDNN_FRONTEND_LOG_INFO", raising=False)
    spec, why = backend_plan_of(SerializedGraph(doc), (1, 2, 3))
    assert spec is not None, why
    for level in ("1", "9"):  # the frontend's tensor-dump levels
        monkeypatch.setenv("CUDNN_FRONTEND_LOG_INFO", level)
        spec, why = backend_plan_of(SerializedGraph(doc), (1, 2, 3))
        assert spec is None and "CUDNN_FRONTEND_LOG_INFO" in why, why
    monkeypatch.setenv("CUDNN_FRONTEND_LOG_INFO", "10")
    assert backend_plan_of(SerializedGraph(doc), (1, 2, 3))[0] is not None


def test_a_double_scalar_is_read_as_written():
    doc = document(variant_pack_uids=[1, 2, 3, 7], pass_by_values={"7": {"index": 4, "value": 1e-05}})  # rmsnorm's epsilon
    spec, why = backend_plan_of(SerializedGraph(doc), (1, 2, 3))
    assert spec is not None and spec.by_value == ((7, struct.pack("<d", 1e-05)),), why


@pytest.mark.parametrize(
    "changes, reason",
    [
        ({"json_version": "3.0"}, "json_version '3.0'"),
        ({"aligned_operands": {"1": [32, 2]}}, "operand 1 needs 32-byte alignment"),
        ({"a_new_field": 1}, "fields the native path does not know: \\['a_new_field'\\]"),
        ({"workspace_modifications": {"8": [0, 0, ["3F800000"]]}, "variant_pack_uids": [1, 2, 3, 8]}, "workspace_modifications of kind 0"),
        ({"variant_pack_uids": [1, 2]}, "not exactly the op's operands"),
        ({"cudnn_backend_data": ""}, "no backend plan"),
    ],
)
def test_anything_else_keeps_the_python_path_and_says_why(changes, reason):
    spec, why = backend_plan_of(SerializedGraph(document(**changes)), (1, 2, 3))
    assert spec is None
    assert re.search(reason, why), why


@pytest.mark.skipif(tch.with_cuda, reason="the CPU build's behaviour")
def test_without_cuda_graph_launch_stays_off(fresh_settings):
    assert tch.settings.set_native_cuda_graphs(True) is True  # the setting's previous value (on by default)
    assert tch.stats.native_cuda_graphs() == dict(populated=0, captured=0, launched=0, failed=0, kept=0, enabled=False)
