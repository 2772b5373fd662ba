"""Built graphs in the plan store: the key of a description, and a stored plan loaded back, checked.

``store.py`` keeps bytes; this module knows what they are: ``pygraph.serialize()``
of a built graph whose selected plan the cuDNN backend serves (the frontend's UBJSON
graph format, the one the native path reads too). Frost (Python-engine) plans are never
stored: their serialized form is another format, and their compiled kernels are the
frontend's own business.

The key (``store.plan_key``) names the description by a fingerprint computed in
Python from the description itself (``pygraph.inspect()``: nodes, their parameters,
every tensor's dims, strides, dtype and uid; plus what inspect() leaves out: each
pass-by-value scalar, the intermediate type, the graph's plain options): ``graph.key()`` is the backend's hash and needs the graph
lowered first, and with dynamic shapes it drops dims and strides, so it cannot be what
a load is looked up by. A description or definition whose parameters print with a
memory address would get a key no other process can have: it has none (never loaded
nor stored, only built).

A loaded blob is not trusted because its file was whole: before a graph is made of it,
its cuDNN and frontend versions must be the running ones, and every operand uid of the
op must be in its variant pack and among its backend plan's tensors (their dims and
strides are the key's; a ragged offset counts where a tensor of the plan names it). Any
mismatch, or a deserialize that fails, rejects the entry (a warning, the file removed) and
the caller builds.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Optional, Sequence, Tuple

import cudnn
import torch

from ...native.ubjson import decode_ubjson
from . import store as plan_store

__all__ = ["description_fingerprint", "key_of", "device_identity", "check_blob", "fetch_blob", "deserialized", "serialized_plan", "store_blob"]

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def description_fingerprint(graph) -> str:
    """sha256 of everything a description says (see the module docstring)."""

    def encode(value):
        if hasattr(value, "uid") and hasattr(value, "dim"):  # a cudnn tensor named in a node's params
            return {"tensor": value.uid}
        return repr(value)

    document = graph.inspect()
    # What inspect() leaves out: pass-by-value scalars, the intermediate type and the
    # graph's plain constructor arguments (sm_count, dynamic shapes, ...).
    document["scalars"] = {
        str(t.uid): [repr(t.pass_by_value), repr(getattr(t, "scalar_type", None))]
        for t in graph._tensor_by_uid.values()
        if getattr(t, "pass_by_value", None) is not None
    }
    document["intermediate_data_type"] = str(graph._context.intermediate_data_type)
    document["graph_options"] = {k: v for k, v in graph._cpp_graph_kwargs.items() if isinstance(v, (str, int, float, bool))}
    text = json.dumps(document, sort_keys=True, default=encode)
    return hashlib.sha256(text.encode("utf-8")).hexdigest() + ("-unstable" if _ADDRESS.search(text) else "")


def device_identity(device: int) -> str:
    """The GPU a plan is built for: name, compute capability and SM count."""
    props = torch.cuda.get_device_properties(device)
    return f"{props.name} sm{props.major}{props.minor} {props.multi_processor_count}SMs"


def key_of(definition, device: int, graph, layout: Sequence[Tuple], deterministic: bool, dynamic_shapes: bool, tuned: bool) -> Optional[str]:
    """The store key of ``graph`` (a description of ``definition``) for ``device``, or
    None (then it is neither loaded nor stored) when it cannot be named reliably. A graph
    with packed (ragged) operands is keyed without its token counts, as its build is (one plan
    serves every count)."""
    try:
        fingerprint, params = description_fingerprint(graph), repr(sorted(definition.params.items()))
        if fingerprint.endswith("-unstable") or _ADDRESS.search(params):
            return None  # a key no other process can have: storing it would only fill the directory
        return plan_store.plan_key(
            backend_version=cudnn.backend_version(), frontend_version=cudnn.__version__, device=device_identity(device),
            graph=fingerprint, name=definition.name, params=params, layout=layout,
            deterministic=deterministic, dynamic_shapes=dynamic_shapes, tuned=tuned,
        )
    except Exception:  # noqa: BLE001 -- no key: the graph is built every time, as without the store
        return None


def check_blob(blob: bytes, uids: Sequence[int], *, backend_version: int, frontend_version: str) -> Optional[str]:
    """None when ``blob`` is a serialized backend plan of these operands (uids in the op's
    order) from this cuDNN and frontend; else why not."""
    try:
        document = decode_ubjson(blob)
    except Exception as error:  # noqa: BLE001 -- a blob that does not decode is the answer
        return f"not the frontend's serialized format ({type(error).__name__}: {error})"
    if not isinstance(document, dict):
        return "not the frontend's serialized format"
    for what, written, running in (
        ("cuDNN", document.get("cudnn_backend_version"), backend_version),
        ("frontend", document.get("cudnn_frontend_version"), frontend_version),
    ):
        if written is not None and not _version_forms(written) & _version_forms(running):  # absent: the key's versions stand
            return f"built by {what} {written!r}, this is {running!r}"
    pack = set(document.get("variant_pack_uids") or ())
    if not set(uids) <= pack:
        return f"its variant pack {sorted(pack)} lacks operands {sorted(set(uids) - pack)}"
    try:
        plan = json.loads(document.get("cudnn_backend_data") or "{}")
        tensors = _tensor_names(plan.get("operationGraph", {}), set())
    except (ValueError, AttributeError) as error:
        return f"its backend plan is not readable JSON ({error})"
    # Each operand must be one of the plan's tensors, or named by one (a ragged offset: a
    # bucket's, measured on an H100, is no tensor of the graph's own but its packed tensors'
    # attribute). Their dims and strides are not compared: the backend's JSON holds its own
    # view of some (sdpa's K as K^T, measured on the H200), and the store's key already pins
    # every operand's layout.
    for uid in uids:
        if str(uid) not in tensors:
            return f"operand {uid} is not in its backend plan"
    return None


def _tensor_names(value, names: set) -> set:
    """Every tensor name in a backend plan's operation graph (JSON), nested ones too, and every
    value a tensor names by uid or as its ragged offset."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "name" or "uid" in key.lower() or "ragged" in key.lower():
                if isinstance(item, (int, str)):
                    names.add(str(item))
            _tensor_names(item, names)
    elif isinstance(value, list):
        for item in value:
            _tensor_names(item, names)
    return names


def _version_forms(version) -> set:
    """The spellings of one version: cuDNN and the frontend write theirs as "9.19.0" or
    as the number 91900 (major * 10000 + minor * 100 + patch; 1.32.0 is 13200)."""
    text = str(version).strip()
    forms = {text}
    parts = text.split(".")
    if len(parts) == 3 and all(part.isdigit() for part in parts):
        forms.add(str(int(parts[0]) * 10000 + int(parts[1]) * 100 + int(parts[2])))
    elif text.isdigit():
        number = int(text)
        forms.add(f"{number // 10000}.{number % 10000 // 100}.{number % 100}")
    return forms


def fetch_blob(key: str, uids: Sequence[int]) -> Optional[Tuple[bytes, dict]]:
    """``(blob, metadata)`` stored under ``key`` and checked (``check_blob``), not yet
    deserialized; or None (not stored, or rejected with a warning)."""
    store = plan_store.store()
    loaded = store.load(key) if store is not None else None
    if loaded is None:
        return None
    why = check_blob(loaded[0], uids, backend_version=cudnn.backend_version(), frontend_version=cudnn.__version__)
    if why is None:
        return loaded
    store.reject(key, why)
    return None


def deserialized(blob: bytes, name: str, handle) -> Tuple[Optional[Any], str]:
    """``(graph, "")``: a checked blob deserialized on ``handle``; or ``(None, why not)``.
    cuDNN's deserialize captures a CUDA graph of its own (Note [A fetched plan is loaded by
    the call that takes it], registry/build.py)."""
    try:
        graph = cudnn.pygraph(name=name, handle=handle)
        graph.deserialize(handle, blob)
        return graph, ""
    except Exception as error:  # noqa: BLE001 -- a plan cuDNN will not take back is rejected and rebuilt
        return None, f"cuDNN could not deserialize it ({type(error).__name__}: {error})"


def serialized_plan(graph) -> Optional[bytes]:
    """A built graph's plan as the store keeps it (``graph.serialize(as_bytes=True)``), or
    None: a frost plan (another format, never stored) or one that does not serialize."""
    if getattr(graph, "selected_engine", None) is not None:
        return None
    try:
        return graph.serialize(as_bytes=True)
    except Exception:  # noqa: BLE001 -- not serializable: it stays this process's
        return None


def store_blob(key: str, blob: bytes, metadata: dict) -> None:
    """Write a serialized plan under ``key`` (when the store is on; a failed write warns)."""
    store = plan_store.store()
    if store is not None:
        store.store(key, blob, metadata)
