"""Replacing a file so that no reader ever sees it half written: the plan tuning cache
(registry/plans/tuning/tuning_file.py) and the plan store (registry/plans/store.py) both write this way."""

from __future__ import annotations

import contextlib
import os
import tempfile


def replace_atomically(path: str, data: bytes) -> None:
    """Write ``data`` to a temp file in ``path``'s directory, fsync it, then
    ``os.replace`` it over ``path``: a reader sees the old file or the new one, whole.
    Concurrent writers need no lock (the last replace wins). Raises what the file
    system raises; no temp file is left behind."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    descriptor, temp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temp)
        raise
