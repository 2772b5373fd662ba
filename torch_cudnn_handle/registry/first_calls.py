"""``FirstCalls``: builds off the caller's path, their threads, and which of a new layout's first calls a stand-in serves.

Note [A new layout's first calls]: a layout's first call builds its plan, which takes 0.1 to
1.5 s in cuDNN. Where its route names a stand-in (routes.py: the op's interpreter, nn.sdpa's
torch attention), the plan builds off the caller's path instead, and the stand-in serves:

  * ``stand_in_calls=N`` (the setting, or ``register_graph(stand_in_calls=N)``): exactly the
    layout's first N calls at each call site, whether its plan is built by then or not; the
    site's call N+1 gets the plan, and waits for its build when it is not done. A call site is
    an nn module (``at_site``): its forward's calls, and its backward's, which find the site
    on the forward's autograd node. A compiled frame the lowering made (``frame_runner``) has no
    modules left: there a layout's calls are numbered in each run of the frame, and its k-th
    call is a site of its own, and so in the run of a backward node that is no module's (a
    compiled frame's backward). Any other call is counted per layout. So a layer repeated in a
    model (or q, k, v and o projections of one shape, or a model's five RMSNorms once lowered)
    runs the first N steps at a new size on torch's ops, rather than waiting for the build at
    the third layer of the first step. Which implementation serves a call depends on the
    sequence of calls alone, never on how long a build took: two runs of one program give the
    same results. The plan goes native from the second call it serves, after which C++ serves
    every site. A capture's call gets the plan (waiting for it), never a stand-in.
  * ``serving_mode`` (timing-dependent): until the plan is ready, so which calls the
    stand-in serves depends on the build's time; for serving, where latency matters more than
    run-to-run equality.

Neither under deterministic algorithms: the call builds and waits, one implementation per run.
A build that fails off the caller's path is raised by the next call, which builds in its own.
The counts live here, per layout and site, guarded by the graph cache's lock, until the layout
is evicted or its build fails.

Note [A call's build on a thread of its own]: a build in the call (no stand-in) runs on a
call-build thread while the call waits (``build_for_caller``), because the frontend's
planning keeps a heuristic mode's not-supported exception in a local of its own frame
(``_create_backend_plans`` in cudnn/_pygraph.py, frontend 1.32): a frame and traceback
cycle that holds every frame above it until the garbage collector runs. On the caller's
thread those are the op's callers, a compiled graph's buffers among them; under
``mode="reduce-overhead"`` cudagraph trees' pool check then saw a warm-up's saved tensors
(attention's q, k, v, output and stats, on an H100) freed by its own ``gc.collect()``
and failed. A call-build thread's frames hold none of the caller's tensors. A tuned build
stays on the caller's thread (it times plans on the caller's stream).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
from typing import Dict, Optional

import torch

from .._extension import _C
from .plans import build_process

__all__ = ["FirstCalls", "CALL_BUILD_THREADS", "new_site", "at_site", "frame_runner", "call_site"]

CALL_BUILD_THREADS = 4  # builds in calls at once (each caller waits on its own); more callers queue
_SITE_KEY = "torch_cudnn_handle.call_site"  # an autograd node's metadata: the site its forward ran at
_RUN_KEY = "torch_cudnn_handle.run_calls"  # an autograd node's metadata: its run's calls per layout key (no module's node)
# .site: the call site of this thread's calls now; .asked: whether a first call read it;
# .frame: (site, calls per layout key so far) while a lowered compiled frame runs on this thread.
_sites = threading.local()
new_site = itertools.count(1).__next__  # a module's call site, one per instance, for the process


def at_site(site: int, fn, *args):
    """``fn(*args)`` (an nn module's op call) with ``site`` as its calls' site (Note [A new
    layout's first calls]). Where a first call read it, the first output's autograd node keeps
    it, so its backward's calls count at the same site. Traced: ``fn(*args)`` alone."""
    if torch.compiler.is_compiling():
        return fn(*args)
    previous = getattr(_sites, "site", None)
    _sites.site, _sites.asked = site, False
    try:
        result = fn(*args)
    finally:
        _sites.site = previous
    if _sites.asked:
        first = result[0] if isinstance(result, (list, tuple)) else result
        if isinstance(first, torch.Tensor) and first.grad_fn is not None:
            first.grad_fn.metadata[_SITE_KEY] = site
    return result


def frame_runner(site: int, compiled):
    """``compiled`` (a compiled frame's callable, boxed or not) as a callable whose every run
    numbers each layout's calls from 0: the k-th is site ``(site, k)`` (Note [A new layout's first calls])."""

    def run(*args):
        previous = getattr(_sites, "frame", None)
        _sites.frame = (site, {})
        try:
            return compiled(*args)
        finally:
            _sites.frame = previous

    if getattr(compiled, "_boxed_call", False):  # dynamo hands a boxed callable one list of arguments
        run._boxed_call = True
    return run


def call_site(asking: bool = True, key=None):
    """This call's site: the module's (``at_site``), the site of the forward whose backward
    runs now, the call's number in a lowered frame's run or a backward node's (``key``: its
    layout, counted here), or None (the layout's own count). ``asking``: a first call's count
    reads it (its forward's node then keeps it); a steady caller's own bookkeeping does not."""
    if asking:
        _sites.asked = True
    site = getattr(_sites, "site", None)
    if site is not None:
        return site
    frame = getattr(_sites, "frame", None)
    if frame is None:
        node = torch._C._current_autograd_node()
        if node is None:
            return None
        site = node.metadata.get(_SITE_KEY)
        if site is not None or key is None:
            return site
        frame = ("backward", node.metadata.setdefault(_RUN_KEY, {}))
    if key is None:
        return frame[0]
    calls = frame[1]
    number = calls.get(key, 0)
    calls[key] = number + 1
    return None if frame[0] == "backward" and number == 0 else (frame[0], number)


def _relaxed_build_thread() -> None:
    """A build thread is part of no CUDA-graph capture: cuDNN's allocations there must not
    end a capture another thread makes in global mode (one that waits for this build)."""
    if _C.with_cuda:
        _C.relax_capture_mode_for_this_thread()


class FirstCalls:
    """The build threads, made on first use, one per build process (each waits on one; the
    exit hook waits for their builds); the calls the stand-in served per layout and site, for a
    fixed count; the layouts whose background build failed. The counts are guarded by the
    graph cache's lock, held around every call but ``submit`` and the executors'."""

    def __init__(self):
        self._served: Dict[tuple, Dict[Optional[int], int]] = {}  # layout -> site -> calls the stand-in served
        self._failed: set = set()  # keys whose background build failed: built in the caller's path
        self._lock = threading.Lock()  # the executors', each made once
        self._threads: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._call_threads: Optional[concurrent.futures.ThreadPoolExecutor] = None  # Note [A call's build on a thread of its own]

    def _executor(self, attribute: str, workers: int, prefix: str) -> concurrent.futures.ThreadPoolExecutor:
        """The executor kept in ``attribute``, made on first use."""
        with self._lock:
            if getattr(self, attribute) is None:
                setattr(self, attribute, concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=prefix,
                                                                               initializer=_relaxed_build_thread))
            return getattr(self, attribute)

    def submit(self, fn, *args) -> None:
        """``fn(*args)`` on a build thread."""
        self._executor("_threads", build_process.HELPERS, "torch_cudnn_handle-build").submit(fn, *args)

    def build_for_caller(self, fn, *args):
        """``fn(*args)`` on a call-build thread, waited for: its result, or its error raised here."""
        return self._executor("_call_threads", CALL_BUILD_THREADS, "torch_cudnn_handle-call-build").submit(fn, *args).result()

    def failed_before(self, key) -> bool:
        """Whether ``key``'s background build failed (its next call builds in its own path and raises)."""
        return key in self._failed

    def first(self, key, route) -> None:
        """``key``'s plan starts building off the caller's path; this call is the stand-in's first at its site."""
        if route.stand_in_calls > 0:
            self._served[key] = {call_site(key=key): 1}

    def stands_in(self, key, route, future=None) -> bool:
        """Whether the stand-in serves this call of ``key``, still building (``future``) or built
        (None); counted at its site."""
        if route.stand_in_calls <= 0:
            return route.stand_in_calls < 0 and future is not None and not future.done()
        sites = self._served.setdefault(key, {})
        site = call_site(key=key)
        served = sites.get(site, 0)
        if served >= route.stand_in_calls:
            return False
        sites[site] = served + 1
        return True

    def forget(self, key, failed_off_path: bool = False) -> None:
        """``key``'s counts go: its build failed (off the caller's path: its next call builds in its own path) or it was evicted."""
        self._served.pop(key, None)
        if failed_off_path:
            self._failed.add(key)
