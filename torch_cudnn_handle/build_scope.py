"""``build_scope(device)``: build cuDNN frontend graphs for one device.

A graph build bakes device facts (SM count, arch, shared-memory budgets) into its
plans. The frontend reads them from its build-device scope
(``cudnn.frost.device.build_device``) and, for everything else, from the CUDA device
current at build time. Inside ``build_scope(d)`` both name ``d``: torch's current device
is ``d`` (``torch.cuda.device``), the frontend's build scope is ``d``, and the pooled
handle for ``d`` on this thread is what the scope yields, so a graph built with it is
lowered against the right device even when the caller's ambient device is another.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import cudnn
import torch
from cudnn.frost.device import build_device

from ._extension import _C
from .pool import current_handle

__all__ = ["build_scope"]


@contextlib.contextmanager
def build_scope(device=None) -> Iterator[cudnn.Handle]:
    """Scope a graph build to ``device`` (None = torch's current device) and yield
    this thread's pooled ``cudnn.Handle`` for it."""
    ordinal = _C.parse_device(device)
    with torch.cuda.device(ordinal), build_device(ordinal):
        yield current_handle(ordinal)
