"""Build processes: where a background build runs cuDNN's build, off this process's GIL.

Note [The build process]: the frontend's build calls hold the GIL for as long as cuDNN
takes (a fused linear's runtime-compiled plan held it 1.2 s on the H200, measured by a
thread counting beside the build), so a build on a background thread still stops every
Python thread of the process, the caller it meant to spare included (FusedLinear's
first calls took 3 to 977 ms under background builds). So a background build (Note
[Builds off the caller's path]) of a graph the cuDNN backend alone serves is sent, as
the frontend's JSON description, to a build process: a helper running
``build_worker.py`` (the frontend without torch), which builds it as the registry would
(``build([A, FALLBACK])``, the same cuDNN and GPU, hence the same plan) and sends back
the serialized plan. The build thread waits on the pipe without the GIL, then
deserializes the plan (about 4 ms, GIL held) as the plan store does a stored one.

Which builds: ``offer`` takes a description; a graph only the backend serves travels as the
backend's JSON. A graph a Python (frost) engine family may claim (sdpa, the norms) is
described by the frontend's own JSON until the frontend ranks its plans, and neither
that nor the backend's JSON of it loads again (measured: docs/plans.md), so it travels as
its recipe (``recipe_of``: its definition and specs, pickled), which the helper describes
itself, as the registry does, and builds with the frontend's own walk; where that walk
picks a Python engine (whose plan cannot travel), the helper says so and the caller
builds. A definition that does not pickle (a lambda or a closure for a builder, a builder
in ``__main__``), a ragged one, and every graph with the ``build_process`` setting off are
built in-process (``offer`` returns None). Untuned static builds with every output's
layout declared, under no deterministic algorithms (plans/__init__.py asks for no other).

Lifetime and threads: at most ``HELPERS`` helper processes, started at the first build
offered and kept, each serving one build at a time; a build thread takes an idle one.
Each holds a cuDNN handle and a CUDA context per device it built for (about 0.5 GiB of
GPU memory each). They exit when their stdin closes: idle ones are let go at this
process's exit (a busy one goes with its pipe when the process ends), a failed one at
once. A helper that fails to start turns the route off, with one warning saying why,
until the setting is set again; a build that fails in a helper is built in-process
(whose error, if any, is the one raised). A forked child never uses its parent's helpers.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import pickle
import select
import subprocess
import sys
import threading
import time
import warnings
from typing import Callable, Optional, Tuple

from ... import settings
from ..._extension import _C
from ..operand_views import described_specs
from .build_worker import read_message, write_message

__all__ = ["HELPERS", "BUILD_TIMEOUT_SECONDS", "offer", "recipe_of", "build_description", "backend_only", "rejected", "stats"]

HELPERS = 2  # build processes at most; the graph cache runs as many build threads (graph_cache.py)
BUILD_TIMEOUT_SECONDS = 600.0  # a helper silent this long is ended, and the build done in-process
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build_worker.py")  # the helpers' program


class _Helper:
    """One build process and its pipes; used by one thread at a time."""

    def __init__(self):
        self.process = subprocess.Popen([sys.executable, WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        hello = dict(libcudnn=_C.cudnn_library_path() if _C.with_cuda else None, backend_version=_backend_version())
        answer = self.call(hello, timeout=120.0)
        if not answer.get("ok"):
            self.close()
            raise RuntimeError(answer.get("error", "no answer"))

    def call(self, message, timeout: float) -> dict:
        write_message(self.process.stdin, message)
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)  # waits without the GIL
        answer = read_message(self.process.stdout) if ready else None
        if answer is None:
            self.close()
            raise RuntimeError(f"the build process {'ended' if ready else f'gave no answer in {timeout:.0f} s'}")
        return answer

    def close(self, grace_seconds: float = 0.0) -> None:
        """Close its pipes (it exits at the end of its stdin); killed if still running after ``grace_seconds``."""
        for stream in (self.process.stdin, self.process.stdout):
            stream.close()
        try:
            self.process.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_lock = threading.Lock()
_idle: list = []
_state = dict(started=0, disabled="", rejected="", last_error="", builds=0, failures=0, seconds=0.0)


def _forget_helpers() -> None:
    """In a forked child: its parent's helpers (and their pipes) are not its own."""
    _idle.clear()
    _state.update(started=0, disabled="")


os.register_at_fork(after_in_child=_forget_helpers)


@atexit.register
def _let_idle_helpers_go() -> None:
    """At exit, idle helpers are told to go (their stdin closes: they exit at once); one
    still in a build is left to exit with its pipe when this process ends."""
    with _lock:
        idle, _idle[:] = list(_idle), []
    for helper in idle:
        helper.close(grace_seconds=1.0)


def _rearm(on) -> None:
    """Setting ``build_process`` (again) gives a route that failed to start another try."""
    with _lock:
        _state["disabled"] = ""


settings.watch("build_process", _rearm)


def _backend_version() -> Optional[int]:
    """This process's cuDNN, which a helper must load too; None where no libcudnn loads
    (no GPU here: a helper then starts, and refuses every build)."""
    import cudnn

    try:
        return int(cudnn.backend_version())
    except Exception:  # noqa: BLE001 -- the frontend raises its own error types for a missing libcudnn
        return None


def backend_only(graph) -> bool:
    """Whether only the cuDNN backend can serve ``graph`` (a validated description): no
    Python engine family of the frontend claims its kind of graph, so its description is
    the backend's JSON and the plan walk has backend plans alone."""
    from cudnn.engines import manifest  # the frontend's static table of its Python engines

    return not manifest.engines_for(graph)


def offer(graph, device: int, recipe: Optional[Callable[[], Optional[bytes]]] = None) -> Optional[Tuple[bytes, str]]:
    """``(serialized plan, engine name)`` of ``graph`` (a validated description, not built)
    built for ``device`` in a build process; None where the caller builds it itself. Offered
    where the call's route says (its build_process setting, routes.py). ``recipe()``: the
    graph's ``recipe_of``, asked for a graph a Python engine family may claim."""
    if not backend_only(graph):
        made = recipe() if recipe is not None else None
        return None if made is None else _ask({"device": device, "recipe": made})
    description = repr(graph)  # a lowered description prints as the backend's JSON
    if "cudnn_backend_version" not in description:
        return None
    return build_description(description, device)


def recipe_of(definition, specs) -> Optional[bytes]:
    """How a build process describes ``definition`` for ``specs`` itself: the definition less
    what describing does not read (its views, applied here: the specs its builder sees go
    instead; its stand-in, backward, buckets), pickled; None where it does not pickle (a
    lambda or a closure), its builder is ``__main__``'s (the helper's ``__main__`` is its own
    program) or it is ragged."""
    builder = definition.builder
    if builder is None or definition.ragged is not None or getattr(builder, "__module__", "__main__") == "__main__":
        return None
    as_written = definition.views is not None  # the registry describes a graph with views as written
    if as_written:
        specs = described_specs(definition.name, definition.views, specs)
    portable = dataclasses.replace(definition, views=None, stand_in=None, backward=None, output_shapes=None, buckets=None)
    try:
        return pickle.dumps((portable, tuple(specs), as_written), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 -- pickle raises several types for what it cannot take: built in-process
        return None


def build_description(description: str, device: int) -> Optional[Tuple[bytes, str]]:
    """The backend's JSON ``description`` built for ``device`` in a build process:
    ``(serialized plan, engine name)``, or None (no helper, or the build failed there:
    ``stats()["last_error"]`` says why)."""
    return _ask({"device": device, "description": description})


def _ask(request: dict) -> Optional[Tuple[bytes, str]]:
    helper = _take()
    if helper is None:
        return None
    started = time.perf_counter()
    try:
        answer = helper.call(request, timeout=BUILD_TIMEOUT_SECONDS)
    except (OSError, RuntimeError, EOFError) as error:
        _count(failures=1, started=-1, last_error=f"{type(error).__name__}: {error}")  # closed; the next build starts another
        return None
    _give_back(helper)
    if not answer.get("ok"):
        _count(failures=1, last_error=answer.get("error", "no answer"))
        return None
    _count(builds=1, seconds=time.perf_counter() - started)
    return answer["blob"], answer["engine"]


def rejected(why: str) -> None:
    """A plan a build process sent that this process would not take (plans/'s check, or
    cuDNN's deserialize): counted, warned about once, and built in-process."""
    _count(failures=1)
    with _lock:
        first, _state["rejected"] = not _state["rejected"], why
    if first:
        warnings.warn(f"torch_cudnn_handle: a plan from a build process was rejected ({why}); built in this process instead",
                      RuntimeWarning, stacklevel=3)


def _take() -> Optional[_Helper]:
    """An idle helper, or a new one while fewer than HELPERS run; None when the route is off."""
    with _lock:
        if _state["disabled"]:
            return None
        if _idle:
            return _idle.pop()
        if _state["started"] >= HELPERS:
            return None  # every helper is busy: build in-process rather than queue
        _state["started"] += 1
    try:
        return _Helper()
    except (OSError, RuntimeError) as error:
        with _lock:
            _state["started"] -= 1
            _state["disabled"] = str(error)
        warnings.warn(
            f"torch_cudnn_handle: a build process could not start ({error}); background builds run cuDNN's build in this "
            "process, which holds the GIL while it builds. settings.set_build_process(False) silences this.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def _give_back(helper: _Helper) -> None:
    with _lock:
        _idle.append(helper)


def _count(last_error: Optional[str] = None, **increments) -> None:
    with _lock:
        for name, value in increments.items():
            _state[name] += value
        if last_error is not None:
            _state["last_error"] = last_error


def stats() -> dict:
    """Helpers running, builds served and their seconds, failures (each built in-process
    instead) and the last one's error, why the last plan a helper sent was rejected, and
    why the route is off ("" when it is not)."""
    with _lock:
        return dict(running=_state["started"], builds=_state["builds"], seconds=_state["seconds"], failures=_state["failures"],
                    last_error=_state["last_error"], rejected=_state["rejected"], disabled=_state["disabled"])
