"""Timing the candidates: build every plan the heuristics offer, time each on the GPU
(CUDA events, medians), keep the fastest allowed one selected in the graph."""

from __future__ import annotations

import contextlib
import statistics
import threading
from typing import Callable, Dict, Tuple

import cudnn
import torch
from torch._prims_common import compute_required_storage_length

from .choice import HEURISTICS, PlanChoice

WARMUP, SAMPLES, REPEATS = 3, 5, 10  # per plan: warm-up runs; median of SAMPLES batches of REPEATS runs
_SLEEP_CYCLES = 2_000_000  # ~1 ms GPU sleep before each timed batch (see _median_ms)


# One tuning at a time per process, so two builds on other threads never time each other's kernels.
_timing_lock = threading.Lock()


def time_candidates(graph, device, handle, layout, uids, deterministic, fresh_graph) -> Tuple[PlanChoice, bool]:
    """(the choice, whether it may be persisted). The graph ends built with that plan selected."""
    names = {i: _name_at(graph, i) for i in range(graph.get_execution_plan_count())}
    built, skipped = [], {}
    for index, plan in names.items():
        try:
            graph.build_plan_at_index(index)
            built.append(index)
        except Exception as error:  # noqa: BLE001 -- a plan that does not build is no candidate
            skipped[plan] = f"build: {error}"
    if not built:
        graph.build_plans()  # nothing builds: raises the frontend's own account of why
        return PlanChoice(plan=None, index=None, source="heuristic", reason="no plan built one by one", skipped=skipped), False
    heuristic = built[0]  # the plan the heuristics' walk (build()) selects

    timings: Dict[int, float] = {}
    with _timing_lock, torch.cuda.device(device):
        operands = [_random_operand(shape, stride, dtype, device, *host) for shape, stride, dtype, *host in layout]
        workspace_sizes = {}
        for index in built:
            try:
                workspace_sizes[index] = int(graph.get_workspace_size_plan_at_index(index))
            except Exception as error:  # noqa: BLE001
                skipped[names[index]] = f"workspace: {error}"
        largest = max(workspace_sizes.values(), default=0)
        workspace = torch.empty(largest, dtype=torch.uint8, device=torch.device("cuda", device)) if largest else None
        stream = torch.cuda.current_stream(device)
        cudnn.set_stream(handle, stream.cuda_stream)  # the plans run where the events are (a no-op when already there)
        for index in workspace_sizes:
            run = lambda index=index: graph.execute_plan_at_index(operands, workspace, index=index, handle=handle, tensor_uids=list(uids))  # noqa: E731
            try:
                timings[index] = _median_ms(run, stream)
            except Exception as error:  # noqa: BLE001 -- a plan that does not run is no candidate
                skipped[names[index]] = f"execute: {error}"

    allowed, persist, reason = set(timings), True, "fastest of the timed plans"
    if deterministic:
        try:
            keep = _deterministic_plan_names(fresh_graph, {names[i] for i in timings})
            reason = "fastest of the timed deterministic plans" if keep else "no timed plan is deterministic"
            skipped.update({names[i]: "nondeterministic (deterministic algorithms are on)" for i in timings if names[i] not in keep})
        except Exception as error:  # noqa: BLE001 -- then only the heuristics' choice is safe to keep
            keep, persist, reason = set(), False, f"could not tell which plans are deterministic ({error})"
        allowed = {i for i in timings if names[i] in keep}

    source = "tuned"
    if allowed:
        chosen = min(allowed, key=timings.__getitem__)
    else:  # fall back to what the untuned build would run
        chosen, source = heuristic, "heuristic"
        reason = (reason if timings else "no plan ran") + "; the heuristics' choice is kept"
        persist = persist and bool(timings)
    graph.build_plan_at_index(chosen)  # select it: execute() and serialize() follow
    choice = PlanChoice(
        plan=names[chosen], index=chosen, source=source, reason=reason, candidates=len(timings),
        fastest_ms=timings.get(chosen), heuristic_plan=names[heuristic], heuristic_ms=timings.get(heuristic),
        timings_ms={names[i]: ms for i, ms in timings.items()}, skipped=skipped,
    )
    return choice, persist


def _name_at(graph, index: int) -> str:
    try:
        return graph.get_plan_name_at_index(index)
    except Exception:  # noqa: BLE001 -- a plan without a name is still a candidate (never found in the cache)
        return f"plan #{index}"


def _deterministic_plan_names(fresh_graph, candidates: set) -> set:
    """The candidates the frontend's NONDETERMINISTIC filter keeps, read on a twin."""
    if fresh_graph is None:
        raise RuntimeError("no fresh_graph to read the plans' numerical notes on")
    twin = fresh_graph()
    twin.deselect_numeric_notes([cudnn.numerical_note.NONDETERMINISTIC])
    twin.build_operation_graph()
    twin.create_execution_plans(list(HEURISTICS))
    keep = set()
    for index in range(twin.get_execution_plan_count()):
        plan = twin.get_plan_name_at_index(index)
        if plan in candidates:
            with contextlib.suppress(Exception):  # barred by the filter (or does not build)
                twin.build_plan_at_index(index)
                keep.add(plan)
    return keep


def _random_operand(shape, stride, dtype: torch.dtype, device: int, host: bool = False) -> torch.Tensor:
    # Fill the whole span the strides reach, then view it: writing through an
    # overlapping (e.g. stride-0) view is refused by torch. A host scalar (a
    # pass-by-value operand) is a CPU tensor: cuDNN reads its value on the host.
    span = max(compute_required_storage_length(tuple(shape), tuple(stride), 0), 1)
    target = torch.device("cpu") if host else torch.device("cuda", device)
    if dtype.is_floating_point:
        flat = torch.randn(span, device=target).to(dtype)
    else:
        flat = torch.randint(0, 2 if dtype == torch.bool else 8, (span,), device=target).to(dtype)
    return flat.as_strided(tuple(shape), tuple(stride))


def _median_ms(run: Callable[[], None], stream) -> float:
    """Median GPU milliseconds of one ``run()`` on ``stream``."""
    for _ in range(WARMUP):
        run()
    stream.synchronize()
    samples = []
    for _ in range(SAMPLES):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # A short GPU sleep first, so the batch is queued before the GPU reaches it and
        # the events time the kernels, not Python's launch rate.
        torch.cuda._sleep(_SLEEP_CYCLES)
        start.record(stream)
        for _ in range(REPEATS):
            run()
        end.record(stream)
        end.synchronize()
        samples.append(start.elapsed_time(end) / REPEATS)
    return statistics.median(samples)
