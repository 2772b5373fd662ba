"""The tuning file: one JSON document of choices keyed by cuDNN and frontend
versions, GPU, graph, operand layout and determinism; merged and replaced atomically
under an advisory lock, so concurrent processes never lose or tear each other's entries."""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from typing import Any, Dict, Mapping, Sequence

from ....atomic_file import replace_atomically
from .choice import Spec


def cache_key(*, backend_version: int, frontend_version: str, device: str, graph_key: Any, layout: Sequence[Spec], deterministic: bool) -> str:
    """One JSON string: a choice is reused only for the same cuDNN, frontend, GPU, graph,
    operand layout and determinism requirement."""
    operands = [_operand_key(*spec) for spec in layout]
    return json.dumps([int(backend_version), str(frontend_version), str(device), str(graph_key), operands, bool(deterministic)], separators=(",", ":"))


def _operand_key(shape, stride, dtype, host: bool = False) -> list:
    key = [list(map(int, shape)), list(map(int, stride)), str(dtype).replace("torch.", "")]
    return key + ["host"] if host else key  # a device operand's key as before host scalars existed


def read_cache(path: str) -> Dict[str, dict]:
    """The file's entries; {} when it is missing, unreadable or corrupt (the next write replaces it)."""
    try:
        with open(path, encoding="utf-8") as file:
            document = json.load(file)
        entries = document.get("entries") if isinstance(document, dict) else None
    except Exception:  # noqa: BLE001 -- missing, unreadable or not JSON: a miss, never a failed build
        return {}
    if not isinstance(entries, dict):
        return {}
    return {key: entry for key, entry in entries.items() if isinstance(entry, dict) and isinstance(entry.get("plan"), str) and isinstance(entry.get("index"), int)}


@contextlib.contextmanager
def _exclusive(path: str):
    # Another process's read-merge-write must not interleave with ours: an advisory lock
    # on a side file (never deleted: removing a lock file lets two holders race).
    try:
        import fcntl
    except ImportError:  # no flock (Windows): os.replace still keeps the file whole
        yield
        return
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_cache_entries(path: str, entries: Mapping[str, dict]) -> bool:
    """Merge ``entries`` into the file: atomically (a temp file in the same directory,
    then os.replace), over what other processes wrote meanwhile. False, never an
    exception, when the file cannot be written."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with _exclusive(path):
            merged = read_cache(path)
            merged.update(entries)
            replace_atomically(path, json.dumps({"format": 1, "entries": merged}, indent=1, sort_keys=True).encode("utf-8"))
        return True
    except Exception as error:  # noqa: BLE001 -- a cache problem never fails a build
        warnings.warn(f"torch_cudnn_handle: could not write the plan tuning cache {path!r} ({error}); the choice is kept for this process only")
        return False
