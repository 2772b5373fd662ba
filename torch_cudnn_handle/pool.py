"""The pool's Python face: ``current_handle``, ``pool_stats``, ``bind_context``.

The pool itself is C++ (``csrc/pool/``): one cuDNN handle per (device, thread), kept
in a thread-local window and returned to a per-device free list when the thread exits.
This module gives each pooled backend handle its ``cudnn.Handle`` (the frontend's
first-class handle object) and the public functions.

Who owns what:
  * the C++ pool owns every backend handle for the life of the process (never
    destroyed; see ``csrc/pool/device_thread_handle_pool.h``);
  * each backend handle owns exactly one :class:`PooledHandle` (made on first request,
    kept forever), so a thread asking twice for the same device gets the same object
    and the frontend's ``cudnn.set_stream`` short-circuit keeps working;
  * a thread holds its handle from its first request until it exits. Use a handle on
    the thread that got it: cuDNN forbids sharing one across threads.
"""

from __future__ import annotations

import cudnn  # noqa: F401  -- loads the libcudnn the pool takes its handles from
import torch  # noqa: F401  -- loads libc10/libtorch, which _C links against

from ._extension import _C

__all__ = ["PooledHandle", "current_handle", "pool_stats", "bind_context", "release_workspaces", "with_cuda"]

with_cuda: bool = _C.with_cuda


class PooledHandle(cudnn.Handle):
    """A ``cudnn.Handle`` lent by the pool to one thread for one device.

    Its ``stream`` is not an attribute of its own but the pool's record of the stream
    cuDNN has for this handle: the pool sets the stream on every ``current_handle()``
    call and on every ``cudnn_fe.execute`` without Python, and the frontend's
    ``cudnn.set_stream(handle, s)`` records into the same place, so the two can never
    disagree about where the handle's work goes. Never ``cudnn.destroy_handle`` it:
    the pool owns it.
    """

    def __init__(self, state):
        self._state = state  # _C.PooledHandleState, owned by the C++ pool
        super().__init__(state.backend_handle, state.device, state.stream)

    @property
    def stream(self) -> int:
        return self._state.stream

    @stream.setter
    def stream(self, value) -> None:
        # Called by cudnn.Handle.__init__ and by cudnn.set_stream after it has set the
        # backend's stream itself: record only.
        self._state.stream = 0 if value is None else int(value)

    @property
    def set_stream_calls(self) -> int:
        """How many times the pool called cudnnSetStream on this handle."""
        return self._state.set_stream_calls

    def __repr__(self) -> str:
        return f"PooledHandle(backend_handle=0x{self.backend_handle:x}, cuda:{self._ordinal}, stream=0x{self.stream:x})"


# The pool owns every handle it lends, for the life of the process: the frontend's
# destroy_handle refuses a pooled one (destroying it would leave the pool lending a
# freed cudnnHandle_t to the next thread) and destroys every other handle as before.
_frontend_destroy_handle = cudnn.destroy_handle


def _destroy_handle(handle):
    if isinstance(handle, PooledHandle):
        raise RuntimeError(
            "cudnn.destroy_handle: this handle belongs to torch_cudnn_handle's pool, which lends it to one thread at a "
            "time and never destroys it (the next thread to run on the device borrows it). Keep using it, or make a "
            "handle of your own with cudnn.create_handle() and destroy that one."
        )
    return _frontend_destroy_handle(handle)


_destroy_handle.__doc__ = _frontend_destroy_handle.__doc__
cudnn.destroy_handle = _destroy_handle


def release_workspaces() -> int:
    """Free the workspaces the native path keeps per pooled handle and stream (as torch
    keeps cuBLAS workspaces), e.g. before ``torch.cuda.empty_cache()``. Safe while other
    threads run: this thread's handles and the pool's idle ones free theirs at once, a
    handle another live thread holds frees its own on that thread's next call. Returns
    the bytes freed at once (they go back to torch's caching allocator, which
    ``torch.cuda.empty_cache()`` then returns to the driver). A later call allocates
    what it needs again."""
    return _C.release_native_workspaces() if with_cuda else 0


if with_cuda:
    _C._set_handle_factory(PooledHandle)

    current_handle = _C.current_handle
    pool_stats = _C.pool_stats
    bind_context = _C.bind_context
else:
    # This build has no pool: each function refuses or reports an empty pool, under the CUDA
    # build's docstring (csrc/pool/pool_docs.h). parse_device always raises in a CPU build
    # (csrc/pool/device_arguments.cpp): a bad device as such, any other with the rebuild to make.

    def current_handle(device=None, stream=None):
        _C.parse_device(device)

    def pool_stats():
        return {"devices": {}, "set_stream_calls": 0}

    def bind_context(device=None, stream=None):
        _C.parse_device(device)

    for _function in (current_handle, pool_stats, bind_context):
        _function.__doc__ = _C.pool_docs[_function.__name__] + (
            "\n\nThis build of torch_cudnn_handle has no CUDA, so no pool: "
            + ("it holds no handles." if _function is pool_stats else "this raises RuntimeError (after checking ``device``).")
        )
    del _function
