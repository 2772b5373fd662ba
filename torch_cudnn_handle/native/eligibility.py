"""Which built graphs the native path can serve, and what it needs to: ``backend_plan_of``
reads a graph's serialized form (ubjson.py) and gives a ``NativePlanSpec`` (the backend
plan's JSON and what the frontend would add to each call) or the reason it cannot."""

from __future__ import annotations

import dataclasses
import struct
from typing import Optional, Tuple

import cudnn

from .. import settings
from .ubjson import decode_ubjson

__all__ = ["NativePlanSpec", "backend_plan_of"]

# What the frontend's serialized graph (``Graph::serialize``; json_version 2.0 in
# frontend 1.32, 1.0 before) may hold for a plan to run natively. Keys that only
# describe the graph, and keys whose per-call meaning the native path implements
# (``NativePlanSpec``). Any other key, or another json_version, means a frontend this
# was not written for: the Python path.
_JSON_VERSIONS = frozenset({"1.0", "2.0"})
_DESCRIPTIVE_KEYS = frozenset(
    {"context", "json_version", "cudnn_backend_version", "cudnn_frontend_version", "nodes", "tensors", "behavior_notes",
     "cudnn_backend_data", "variant_pack_uids", "gid", "aligned_operands"}
)
_PER_CALL_KEYS = frozenset({"pass_by_values", "workspace_modifications", "variant_pack_replacements", "fe_workspace_size", "tensors_to_dump"})

# pass_by_values_t = std::variant<int64_t, int32_t, half, float, double, nv_bfloat16>:
# serialized as {"index": i, "value": v}; float, half and bf16 values as float32 bit
# patterns in hex (the frontend's adl_serializer<float>).
_BY_VALUE_FORMATS = {0: "int64", 1: "int32", 2: "half", 3: "float", 4: "double", 5: "bfloat16"}
# workspace_modifications: {uid: [kind, offset, data]}, the tensor at workspace + offset
# in the frontend's region. Kind 0 copies `data` (floats) there first (not native),
# kind 1 zeroes data[0] bytes there first, kind 2 only places the tensor (the plan
# initializes it).
_WORKSPACE_MEMSET, _WORKSPACE_PLACED = 1, 2
# The alignment the native kernel guarantees every operand pointer (see OperandLayout).
_NATIVE_ALIGNMENT = 16


@dataclasses.dataclass(frozen=True)
class NativePlanSpec:
    """Everything ``_C.native_register`` needs besides the layouts: the backend plan's
    JSON and what the frontend would otherwise add to each call."""

    plan_json: str
    by_value: Tuple[Tuple[int, bytes], ...] = ()  # uid, the scalar's bytes
    fe_workspace_size: int = 0  # the frontend's region at the start of the workspace
    workspace_tensors: Tuple[Tuple[int, int, int], ...] = ()  # uid, offset, bytes zeroed before each call
    replacements: Tuple[Tuple[int, int, int], ...] = ()  # uid, source uid, byte offset
    cuda_graph: bool = False  # the engine supports cuDNN's native CUDA graph API: cuDNN populates its graphs (plan_graphs.h)


def _float_bits(value) -> float:
    return struct.unpack("<f", struct.pack("<I", int(value, 16)))[0] if isinstance(value, str) else float(value)


def _by_value_bytes(entry) -> bytes:
    kind, value = _BY_VALUE_FORMATS[int(entry["index"])], entry["value"]
    if kind == "int64":
        return struct.pack("<q", int(value))
    if kind == "int32":
        return struct.pack("<i", int(value))
    if kind == "double":
        return struct.pack("<d", float(value))
    as_float = _float_bits(value)
    if kind == "float":
        return struct.pack("<f", as_float)
    if kind == "half":
        return struct.pack("<e", as_float)
    return struct.pack("<f", as_float)[2:]  # bfloat16: the float32's high half (bf16 values are exact floats)


def backend_plan_of(graph, uids: Tuple[int, ...], serialized: Optional[bytes] = None) -> Tuple[Optional[NativePlanSpec], str]:
    """``(spec, why)``: what ``_C.native_register`` needs when ``graph``'s selected plan
    can run natively with the operands ``uids`` and what the frontend adds per call,
    else ``(None, the reason)``. ``serialized``: ``graph.serialize(as_bytes=True)`` when
    the caller already has it (the plan store's blob), so it is not made twice."""
    if getattr(graph, "selected_engine", None) is not None:
        return None, f"served by the frontend's Python engine {graph.selected_engine.name!r}"
    try:
        document = decode_ubjson(serialized if serialized is not None else graph.serialize(as_bytes=True))
    except Exception as error:  # noqa: BLE001 -- a graph the frontend cannot serialize keeps the Python path
        return None, f"not serializable ({type(error).__name__}: {error})"
    if document.get("json_version") not in _JSON_VERSIONS:
        return None, f"serialized with json_version {document.get('json_version')!r}, not one of {sorted(_JSON_VERSIONS)}"
    unknown = sorted(set(document) - _DESCRIPTIVE_KEYS - _PER_CALL_KEYS)
    if unknown:
        return None, f"the serialized plan has fields the native path does not know: {unknown}"
    plan_json = document.get("cudnn_backend_data")
    if not isinstance(plan_json, str) or not plan_json:
        return None, "no backend plan in the serialized graph"
    if document.get("tensors_to_dump") and settings.frontend_dumps_tensors():
        return None, "the frontend's tensor dump is on (CUDNN_FRONTEND_LOG_INFO), which logs these tensors per call"
    try:  # a pass-by-value operand of the op itself (a host scalar input) is bound per call, never from here
        by_value = tuple(
            (int(uid), _by_value_bytes(entry)) for uid, entry in (document.get("pass_by_values") or {}).items() if int(uid) not in uids
        )
    except (KeyError, TypeError, ValueError, struct.error) as error:
        return None, f"a pass-by-value scalar the native path cannot read ({type(error).__name__}: {error})"
    workspace_tensors = []
    for uid, (kind, offset, data) in (document.get("workspace_modifications") or {}).items():
        if kind not in (_WORKSPACE_MEMSET, _WORKSPACE_PLACED):
            return None, f"needs the frontend per call (workspace_modifications of kind {kind})"
        zeroed = int(_float_bits(data[0])) if kind == _WORKSPACE_MEMSET else 0
        workspace_tensors.append((int(uid), int(offset), zeroed))
    for uid, alignment in (document.get("aligned_operands") or {}).items():  # {uid: [bytes, element size]}
        if int(alignment[0]) > _NATIVE_ALIGNMENT:
            return None, f"operand {uid} needs {alignment[0]}-byte alignment; the native path guarantees {_NATIVE_ALIGNMENT}"
    replacements = tuple(
        (int(uid), int(source), int(offset)) for uid, (source, offset) in _replacement_items(document.get("variant_pack_replacements"))
    )
    extra_uids = {uid for uid, _ in by_value} | {uid for uid, _, _ in workspace_tensors} | {uid for uid, _, _ in replacements}
    pack_uids = set(document.get("variant_pack_uids", ()))  # with or without the frontend's own tensors
    if set(uids) & extra_uids or pack_uids not in (set(uids), set(uids) | extra_uids):
        return None, "its variant pack is not exactly the op's operands and the frontend's per-call tensors"
    spec = NativePlanSpec(
        plan_json, by_value, int(document.get("fe_workspace_size", 0) or 0), tuple(workspace_tensors), replacements,
        cuda_graph=_supports_cuda_graphs(graph),
    )
    return spec, "backend plan"


def _supports_cuda_graphs(graph) -> bool:
    """Whether the selected plan's engine carries SUPPORTS_CUDA_GRAPH_NATIVE_API, so cuDNN
    can populate a CUDA graph with its call."""
    try:
        return cudnn.behavior_note.SUPPORTS_CUDA_GRAPH_NATIVE_API in graph.get_behavior_notes()
    except Exception:  # noqa: BLE001 -- a graph that cannot say is executed, never launched as a graph
        return False


def _replacement_items(replacements):
    """variant_pack_replacements: {uid: [source uid, offset]} (an unordered_map of pairs),
    which nlohmann may also write as [[uid, [source, offset]], ...]."""
    if not replacements:
        return []
    items = replacements.items() if isinstance(replacements, dict) else replacements
    return [(uid, tuple(value)) for uid, value in items]
