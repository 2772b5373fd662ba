"""The plan store: built graphs, serialized, in a directory shared by processes.

One file per key (``<sha256 of the key>.plan``), so a second process loads the plans a
first one built instead of building them. What a file holds, and why it is safe:

  * a header line (JSON: the format, the full key, the blob's length and sha256, and
    a little metadata such as the engine's name), then the blob;
  * a load reads the whole file and trusts it only when the header parses, the key in
    it is exactly the key asked for (a hash collision, or a file copied under another
    name, is a rejection, not a hit) and the blob's length and sha256 match. Anything
    else is rejected with a warning and the file removed: the caller builds, and its
    store writes a good entry;
  * writers never lock: each writes a temp file in the same directory, fsyncs it and
    ``os.replace``s it onto the entry's name, which is atomic on POSIX. Concurrent
    writers of one key (threads or processes) each leave a whole file; the last
    rename wins, and a reader sees either the old whole file or the new one.
  * removing a rejected file checks that it is still the file that was read (same
    inode, size and mtime), so a reader does not delete a good entry another process
    has just put there (a narrow race remains: it costs one rebuild, never a wrong plan).

The store knows bytes and keys, not cuDNN: which key a graph has, and whether a
loaded blob fits the graph, is ``stored_graphs.py``'s job.

Settings: ``plan_store`` (on by default; whether a build consults the store is the call's
route, routes.py) and ``plan_store_dir`` (``~/.cache/torch_cudnn_handle/plans``, read at each
use); a directory that cannot be created or written turns the store off, with one warning.
Thread-safe.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import warnings
from typing import Any, Mapping, Optional, Tuple

from ... import settings
from ...atomic_file import replace_atomically

__all__ = ["PlanStore", "plan_key", "enabled", "store", "stats"]

_FORMAT = 1
_MAGIC = b"torch_cudnn_handle plan\n"
_SUFFIX = ".plan"


def plan_key(
    *, backend_version: int, frontend_version: str, device: str, graph: str, name: str, params: str, layout, deterministic: bool,
    dynamic_shapes: bool, tuned: bool,
) -> str:
    """One JSON string naming everything a stored plan depends on: cuDNN's and the
    frontend's versions, the GPU (name, compute capability, SM count), the graph (a
    fingerprint of its description, the definition's name and its params' repr), the
    operands' (shape, stride, dtype) in the op's order, determinism, whether it was
    described with dynamic shapes (which changes the heuristics' plan list) and whether
    its plan was tuned (plan_tuning/; an untuned process must get the heuristics' plan)."""
    operands = [[list(map(int, shape)), list(map(int, stride)), str(dtype).replace("torch.", "")] for shape, stride, dtype in layout]
    return json.dumps(
        dict(cudnn=int(backend_version), frontend=str(frontend_version), device=str(device), graph=str(graph), name=str(name),
             params=str(params), operands=operands, deterministic=bool(deterministic), dynamic_shapes=bool(dynamic_shapes), tuned=bool(tuned)),
        sort_keys=True, separators=(",", ":"),
    )


class PlanStore:
    """Blobs by key in one directory (see the module docstring). Counts what it did."""

    def __init__(self, directory: str):
        self.directory = os.fspath(directory)
        self._lock = threading.Lock()  # guards the counters only; files need none
        self.counters = dict(hits=0, misses=0, writes=0, rejected=0, write_errors=0)

    def path_of(self, key: str) -> str:
        return os.path.join(self.directory, hashlib.sha256(key.encode("utf-8")).hexdigest() + _SUFFIX)

    def load(self, key: str) -> Optional[Tuple[bytes, dict]]:
        """``(blob, metadata)`` stored under ``key``, or None (missing, or rejected with a warning)."""
        path = self.path_of(key)
        try:
            with open(path, "rb") as file:
                seen = os.fstat(file.fileno())
                data = file.read()
        except FileNotFoundError:
            self._count(misses=1)
            return None
        except OSError as error:
            self._count(misses=1)
            warnings.warn(f"torch_cudnn_handle: could not read the stored plan {path!r} ({error}); building it instead")
            return None
        problem, blob, metadata = _parse(data, key)
        if problem is None:
            self._count(hits=1)
            return blob, metadata
        self.reject(key, problem, seen=seen)
        return None

    def reject(self, key: str, why: str, *, seen: Optional[os.stat_result] = None) -> None:
        """Count, warn and remove the entry of ``key``: it is not to be trusted (``why``).
        ``seen``: the stat of the file that was read; a file replaced since is left alone."""
        path = self.path_of(key)
        self._count(rejected=1, misses=1)
        warnings.warn(f"torch_cudnn_handle: the stored plan {path!r} was rejected ({why}); building it instead")
        with contextlib.suppress(OSError):
            now = os.stat(path)
            if seen is None or (now.st_ino, now.st_size, now.st_mtime_ns) == (seen.st_ino, seen.st_size, seen.st_mtime_ns):
                os.remove(path)

    def store(self, key: str, blob: bytes, metadata: Optional[Mapping[str, Any]] = None) -> bool:
        """Write ``blob`` under ``key`` atomically. False, with a warning, never an
        exception, when it cannot be written (the plan is then only this process's)."""
        path = self.path_of(key)
        header = json.dumps(
            dict(format=_FORMAT, key=key, bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest(), metadata=dict(metadata or {})),
            sort_keys=True, separators=(",", ":"),
        ).encode("utf-8")
        try:
            replace_atomically(path, _MAGIC + header + b"\n" + bytes(blob))
            self._count(writes=1)
            return True
        except Exception as error:  # noqa: BLE001 -- a store problem never fails a build
            self._count(write_errors=1)
            warnings.warn(f"torch_cudnn_handle: could not store the plan {path!r} ({error}); it is kept for this process only")
            return False

    def stats(self) -> dict:
        with self._lock:
            return dict(self.counters)

    def _count(self, **increments: int) -> None:
        with self._lock:
            for name, n in increments.items():
                self.counters[name] += n


def _parse(data: bytes, key: str):
    """``(None, blob, metadata)`` for a whole entry of ``key``, else ``(why, None, None)``."""
    if not data.startswith(_MAGIC):
        return "not a plan file of this format", None, None
    end = data.find(b"\n", len(_MAGIC))
    if end < 0:
        return "truncated header", None, None
    try:
        header = json.loads(data[len(_MAGIC) : end].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        return f"unreadable header ({error})", None, None
    if not isinstance(header, dict) or header.get("format") != _FORMAT:
        return f"format {header.get('format') if isinstance(header, dict) else header!r}, expected {_FORMAT}", None, None
    if header.get("key") != key:
        return "written for another key (versions, device, graph or layout differ)", None, None
    blob = data[end + 1 :]
    if len(blob) != header.get("bytes") or hashlib.sha256(blob).hexdigest() != header.get("sha256"):
        return f"the blob is damaged ({len(blob)} bytes, header says {header.get('bytes')}; or its sha256 differs)", None, None
    metadata = header.get("metadata")
    return None, blob, metadata if isinstance(metadata, dict) else {}


# -- the process-wide store ---------------------------------------------------------

_stores_lock = threading.Lock()
_stores: dict = {}  # directory -> PlanStore, so counters survive a directory switch and back


def store() -> Optional[PlanStore]:
    """The store of the current directory, or None when it is unusable. Whether a build
    consults it at all is the call's route (the plan_store setting: routes.py)."""
    directory = settings.usable_directory("plan_store_dir")
    if directory is None:
        return None
    with _stores_lock:
        found = _stores.get(directory)
        if found is None:
            found = _stores[directory] = PlanStore(directory)
        return found


def stats() -> dict:
    """The store's counters summed over every directory this process used."""
    with _stores_lock:
        stores = list(_stores.values())
    total = dict(hits=0, misses=0, writes=0, rejected=0, write_errors=0)
    for each in stores:
        for name, n in each.stats().items():
            total[name] += n
    return total
