"""``prebuild``: a module's plans built for a range of sizes before serving, into the plan store.

A server that meets a new size builds that size's plans in its first call (or serves a
stand-in while they build). ``prebuild(module, sizes, inputs)`` runs the module once at each
size, so every plan those calls need is built, and kept by the plan store (the
``plan_store`` setting, on by default) for this process and every later one: a server then
starts with every size warm. The calls are real calls, so what is built is exactly what
serving builds (the same graphs, layouts and routes).

``workers=N`` splits the sizes over N spawned processes, each building its share into the
same store (cuDNN's build holds a process's GIL, so threads would not overlap them;
processes do), with this process's settings. Their module and ``inputs`` travel by pickle,
so ``inputs`` must then be a module-level function. Progress goes to stderr, one line
rewritten per finished size.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import sys
import time
from typing import Callable, Iterable, List, Sequence

import torch

from . import registry, settings, stats
from .registry import Resolved

__all__ = ["prebuild", "Prebuilt"]

PREBUILD_WAIT_SECONDS = 3600.0  # the longest it waits for the builds its calls started off their path


@dataclasses.dataclass(frozen=True)
class Prebuilt:
    """What ``prebuild`` did: the sizes run, the plans built and the plans the store wrote
    (summed over its processes), and the seconds it took."""

    sizes: List
    builds: int
    stored: int
    seconds: float


def prebuild(module: torch.nn.Module, sizes: Iterable, inputs: Callable, *, backward: bool = False, workers: int = 1,
             progress: bool = True) -> Prebuilt:
    """Run ``module(*inputs(size))`` once for each of ``sizes`` (with ``backward=True`` also its
    backward, from the sum of its floating outputs), so that the plans those calls need are
    built and stored. ``inputs(size)`` returns the call's arguments, a tuple, on the device the
    module is to serve on; with ``backward=True`` its floating tensors get a gradient too, as a
    layer's input does in training. ``workers``: processes to spread the sizes over (1: this one)."""
    sizes = list(sizes)
    if not sizes:
        raise ValueError("prebuild: no sizes given; pass the sizes to build for, e.g. range(128, 4097, 128)")
    if not callable(inputs):
        raise TypeError(f"prebuild: inputs must be a function of a size returning the call's arguments, got {type(inputs).__name__}")
    if workers < 1:
        raise ValueError(f"prebuild: workers must be 1 or more, got {workers}")
    if not Resolved.now().plan_store:  # the routes' own reading of the setting
        raise ValueError("prebuild: the plan_store setting is off, so built plans would not outlive this process; "
                         "settings.set_plan_store(True) (or TORCH_CUDNN_HANDLE_PLAN_STORE=1) first")
    started = time.perf_counter()
    bar = _Progress(len(sizes), progress)
    if workers == 1:
        builds, stored = _run(module, sizes, inputs, backward, bar.step)
    else:
        builds, stored = _spread(module, sizes, inputs, backward, workers, bar.step)
    bar.close()
    return Prebuilt(sizes, builds, stored, time.perf_counter() - started)


def _run(module, sizes: Sequence, inputs: Callable, backward: bool, done: Callable[[], None]):
    """The calls, in this process: (plans built, plans stored) during them."""
    builds, stored = stats.graphs()["builds"], stats.plan_store()["writes"]
    for size in sizes:
        arguments = inputs(size)
        if not isinstance(arguments, tuple):
            raise TypeError(f"prebuild: inputs({size!r}) returned {type(arguments).__name__}; return the call's arguments as a tuple")
        if backward:  # as in training, where a layer's input carries a gradient too: its dX plan is built
            arguments = tuple(a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in arguments)
        with torch.set_grad_enabled(backward):
            outputs = module(*arguments)
            if backward:
                leaves = [t for t in _tensors(outputs) if t.requires_grad]
                if leaves:
                    torch.autograd.backward([t.float().sum() for t in leaves])
        done()
    registry.wait_for_builds(PREBUILD_WAIT_SECONDS)  # those a stand-in served build off the calls' path (stand_in_calls)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return stats.graphs()["builds"] - builds, stats.plan_store()["writes"] - stored


def _tensors(outputs) -> list:
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    if isinstance(outputs, dict):
        outputs = list(outputs.values())
    if isinstance(outputs, (list, tuple)):
        return [t for item in outputs for t in _tensors(item)]
    return []


def _spread(module, sizes: Sequence, inputs: Callable, backward: bool, workers: int, done: Callable[[], None]):
    """The sizes dealt round-robin to ``workers`` spawned processes; (builds, stored) summed."""
    context = multiprocessing.get_context("spawn")  # never fork a process that holds CUDA state
    finished = context.Queue()
    shares = [sizes[i::workers] for i in range(min(workers, len(sizes)))]
    chosen = {setting.name: settings.get(setting.name) for setting in settings.SETTINGS}  # this process's, setters' included
    processes = [context.Process(target=_worker, args=(module, share, inputs, backward, chosen, finished), daemon=True) for share in shares]
    for process in processes:
        process.start()
    builds = stored = 0
    results = 0
    while results < len(processes):
        kind, payload = finished.get()
        if kind == "size":
            done()
        elif kind == "error":
            for process in processes:
                process.terminate()
            raise RuntimeError(f"prebuild: a worker failed: {payload}")
        else:
            builds, stored, results = builds + payload[0], stored + payload[1], results + 1
    for process in processes:
        process.join()
    return builds, stored


def _worker(module, sizes, inputs, backward, chosen, finished) -> None:
    try:
        for name, chosen_value in chosen.items():
            settings.set(name, chosen_value)
        finished.put(("done", _run(module, sizes, inputs, backward, lambda: finished.put(("size", None)))))
    except BaseException as error:  # noqa: BLE001 -- told to the parent, which raises it
        finished.put(("error", f"{type(error).__name__}: {error}"))


class _Progress:
    """``prebuild: 12/200 sizes, 3.4 s`` on stderr, rewritten per size (nothing when off)."""

    def __init__(self, total: int, shown: bool):
        self.total, self.shown, self.count, self.started = total, shown, 0, time.perf_counter()

    def step(self) -> None:
        self.count += 1
        if self.shown:
            print(f"\rprebuild: {self.count}/{self.total} sizes, {time.perf_counter() - self.started:.1f} s", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.shown:
            print(file=sys.stderr, flush=True)
