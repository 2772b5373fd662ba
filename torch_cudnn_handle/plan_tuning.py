"""Tuned plan choice: time the heuristics' candidate plans once, keep the fastest.

``graph.build([A, FALLBACK])`` takes the heuristics' first plan that builds. With
tuning on (``register_graph(..., tune=True)``, ``set_plan_tuning(True)`` or
``TORCH_CUDNN_HANDLE_TUNE=1``; a per-graph ``tune=`` wins over both), the build instead
builds every plan the frontend offers for this exact graph, times each on the GPU and
selects the fastest, so ``graph.execute`` and ``graph.serialize()`` (hence the native
path) both run it. Choices persist in a JSON file, so another process builds just the
chosen plan. Results can only differ within the engines' numerical notes; under
``torch.use_deterministic_algorithms(True)`` plans noted NONDETERMINISTIC are excluded.

Frontend calls relied on (``cudnn._pygraph.pygraph``, 1.32):
  * ``build_operation_graph`` (validates first if needed), ``create_execution_plans(modes)``,
    ``check_support``: ``build()``'s steps before its plan walk (``build_plans``);
  * ``get_execution_plan_count``, ``get_plan_name_at_index`` (the engine tag, stable);
  * ``build_plan_at_index(i)``: builds plan i and selects it, on both sides (the pygraph
    index that ``execute`` runs, and the C++ candidate ``serialize()`` writes);
  * ``get_workspace_size_plan_at_index``, ``execute_plan_at_index`` (leaves the selection);
  * ``deselect_numeric_notes([numerical_note.NONDETERMINISTIC])``: numerical notes cannot
    be read per plan from Python, only filtered, and a filter bars plans for good, so it
    is applied to a fresh twin of the graph whose surviving plan names are then allowed;
  * ``key()``: the backend's hash of the serialized graph (dims and strides are dropped
    in dynamic-shape mode, so the layout is added to the cache key too).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import statistics
import tempfile
import threading
import time
import warnings
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import cudnn
import torch

__all__ = ["PlanChoice", "build_graph", "set_plan_tuning", "tuning_stats", "tuning_enabled", "cache_path", "cache_key", "read_cache", "write_cache_entries"]

HEURISTICS = (cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK)
Spec = Tuple[Sequence[int], Sequence[int], torch.dtype]  # (shape, stride, dtype) of one operand
WARMUP, SAMPLES, REPEATS = 3, 5, 10  # per plan: warm-up runs; median of SAMPLES batches of REPEATS runs
_SLEEP_CYCLES = 2_000_000  # ~1 ms GPU sleep before each timed batch (see _median_ms)


@dataclasses.dataclass
class PlanChoice:
    """What a build selected and why. ``plan`` is None on the untuned path, which is
    exactly ``graph.build()`` and does not look the heuristics' choice up."""

    plan: Optional[str]
    index: Optional[int]
    source: str  # "heuristic" | "tuned" | "cache"
    reason: str = ""
    candidates: int = 0  # plans timed
    fastest_ms: Optional[float] = None  # the chosen plan's median time
    heuristic_plan: Optional[str] = None
    heuristic_ms: Optional[float] = None
    timings_ms: Dict[str, float] = dataclasses.field(default_factory=dict)  # plan name -> median ms
    skipped: Dict[str, str] = dataclasses.field(default_factory=dict)  # plan -> why it was not a candidate


# -- settings: per graph > set_plan_tuning() > environment ---------------------------

_process_enabled: Optional[bool] = None  # None: follow TORCH_CUDNN_HANDLE_TUNE
_process_cache_file: Optional[str] = None  # None: TORCH_CUDNN_HANDLE_TUNING_CACHE, else the default


def set_plan_tuning(enabled: bool, cache_file: Optional[str] = None) -> None:
    """Tune graphs built from now on (those registered with ``tune=False`` excepted);
    ``cache_file`` replaces the cache file's path (None keeps the current one)."""
    global _process_enabled, _process_cache_file
    _process_enabled = bool(enabled)
    if cache_file is not None:
        _process_cache_file = os.fspath(cache_file)


def resolve_tuning(per_graph: Optional[bool], process: Optional[bool], environ: Mapping[str, str]) -> bool:
    if per_graph is not None:
        return bool(per_graph)
    if process is not None:
        return process
    return environ.get("TORCH_CUDNN_HANDLE_TUNE", "0").strip() == "1"


def resolve_cache_path(process: Optional[str], environ: Mapping[str, str]) -> str:
    return process or environ.get("TORCH_CUDNN_HANDLE_TUNING_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "torch_cudnn_handle", "plan_tuning.json")


def tuning_enabled(per_graph: Optional[bool] = None) -> bool:
    return resolve_tuning(per_graph, _process_enabled, os.environ)


def cache_path() -> str:
    return resolve_cache_path(_process_cache_file, os.environ)


# -- stats (thread-safe) ---------------------------------------------------------------

_stats_lock = threading.Lock()
_counters = dict(tuned=0, cache_hits=0, cache_misses=0, fallbacks=0, cache_errors=0, tune_seconds=0.0)
_entries: Dict[str, dict] = {}  # "<graph> on cuda:<d> for <inputs>" -> the latest PlanChoice, as a dict


def _record(label: str, choice: PlanChoice, seconds: float = 0.0, **increments: int) -> None:
    with _stats_lock:
        for name, n in increments.items():
            _counters[name] += n
        _counters["tune_seconds"] += seconds
        _entries[label] = dataclasses.asdict(choice)


def tuning_stats() -> dict:
    """Counters (tuned: timings done, cache_hits, cache_misses, fallbacks, cache_errors,
    tune_seconds) and ``entries``: the latest choice per graph, device and layout."""
    with _stats_lock:
        return dict(_counters, entries={label: dict(entry) for label, entry in _entries.items()})


# -- the cache file ----------------------------------------------------------------------


def cache_key(*, backend_version: int, frontend_version: str, device: str, graph_key: Any, layout: Sequence[Spec], deterministic: bool) -> str:
    """One JSON string: a choice is reused only for the same cuDNN, frontend, GPU, graph,
    operand layout and determinism requirement."""
    operands = [[list(map(int, shape)), list(map(int, stride)), str(dtype).replace("torch.", "")] for shape, stride, dtype in layout]
    return json.dumps([int(backend_version), str(frontend_version), str(device), str(graph_key), operands, bool(deterministic)], separators=(",", ":"))


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
    temp = None
    try:
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        with _exclusive(path):
            merged = read_cache(path)
            merged.update(entries)
            descriptor, temp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".", suffix=".tmp")
            with os.fdopen(descriptor, "w", encoding="utf-8") as file:
                json.dump({"format": 1, "entries": merged}, file, indent=1, sort_keys=True)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temp, path)
            temp = None
        return True
    except Exception as error:  # noqa: BLE001 -- a cache problem never fails a build
        warnings.warn(f"torch_cudnn_handle: could not write the plan tuning cache {path!r} ({error}); the choice is kept for this process only")
        return False
    finally:
        if temp is not None:
            with contextlib.suppress(OSError):
                os.remove(temp)


# -- building -------------------------------------------------------------------------------


def build_graph(
    graph,
    *,
    tune: Optional[bool],
    device: int,
    handle,
    input_specs: Sequence[Spec],
    output_specs: Sequence[Spec],
    uids: Sequence[int],
    name: str = "graph",
    fresh_graph: Optional[Callable[[], Any]] = None,
) -> PlanChoice:
    """Build ``graph`` (described, not built) for ``device``, tuned or not, and say what
    was selected. ``uids`` are the operands' uids in ``input_specs + output_specs`` order;
    ``handle`` is the caller's ``cudnn.Handle`` for ``device`` on torch's current stream
    there; ``fresh_graph()`` returns an unbuilt twin of ``graph`` (needed only under
    deterministic algorithms, to learn which plans are deterministic)."""
    if not tuning_enabled(tune):
        graph.build(list(HEURISTICS))
        return PlanChoice(plan=None, index=None, source="heuristic", reason="tuning off")
    with torch.cuda.device(device):
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"plan tuning of graph {name!r} on cuda:{device}: the current stream is capturing a CUDA graph, and "
                "tuning times plans on the GPU, which cannot happen in a capture. Build it before capture (run the "
                "same call once outside it), or register the graph with tune=False."
            )
    started = time.perf_counter()
    layout = [*input_specs, *output_specs]
    label = f"{name} on cuda:{device} for " + ", ".join(f"{str(d).replace('torch.', '')}{list(s)}:{list(t)}" for s, t, d in input_specs)
    deterministic = torch.are_deterministic_algorithms_enabled() or torch.backends.cudnn.deterministic
    graph.build_operation_graph()  # build()'s steps (validating first if needed), but its plan walk
    graph.create_execution_plans(list(HEURISTICS))
    graph.check_support()
    key, path = _key_of(graph, device, layout, deterministic), cache_path()

    cached = read_cache(path).get(key) if key is not None else None
    if cached is not None and _select_cached(graph, cached):
        choice = PlanChoice(
            plan=cached["plan"], index=cached["index"], source="cache", reason=f"from {path}", candidates=int(cached.get("candidates", 0)),
            fastest_ms=cached.get("fastest_ms"), heuristic_plan=cached.get("heuristic_plan"), heuristic_ms=cached.get("heuristic_ms"),
        )
        _record(label, choice, cache_hits=1)
        return choice

    choice, persist = _tune(graph, device, handle, layout, uids, deterministic, fresh_graph)
    saved = key is not None and persist and write_cache_entries(path, {key: _entry_of(choice)})
    _record(label, choice, time.perf_counter() - started, cache_misses=1, tuned=1 if choice.candidates else 0,
            fallbacks=1 if choice.source == "heuristic" else 0, cache_errors=1 if (key is not None and persist and not saved) else 0)
    return choice


def _key_of(graph, device: int, layout, deterministic: bool) -> Optional[str]:
    """None (tune, but do not persist) when the graph has no backend key or cuDNN's version is unknown."""
    try:
        props = torch.cuda.get_device_properties(device)
        gpu = f"{props.name} sm{props.major}{props.minor} {props.multi_processor_count}SMs"
        return cache_key(backend_version=cudnn.backend_version(), frontend_version=cudnn.__version__, device=gpu, graph_key=graph.key(), layout=layout, deterministic=deterministic)
    except Exception:  # noqa: BLE001 -- e.g. a python-engine-only graph, which key() refuses
        return None


def _select_cached(graph, entry: dict) -> bool:
    """Build and select the cached plan, if the heuristics still rank that plan at that index."""
    index = entry["index"]
    try:
        if not 0 <= index < graph.get_execution_plan_count() or graph.get_plan_name_at_index(index) != entry["plan"]:
            return False
        graph.build_plan_at_index(index)
        return True
    except Exception:  # noqa: BLE001 -- a stale entry means tuning again
        return False


def _entry_of(choice: PlanChoice) -> dict:
    fields = ("plan", "index", "candidates", "fastest_ms", "heuristic_plan", "heuristic_ms")
    return dict({field: getattr(choice, field) for field in fields}, recorded=time.strftime("%Y-%m-%dT%H:%M:%S"))


# One tuning at a time per process, so two builds on other threads never time each other's kernels.
_timing_lock = threading.Lock()


def _tune(graph, device, handle, layout, uids, deterministic, fresh_graph) -> Tuple[PlanChoice, bool]:
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
        operands = [_random_operand(shape, stride, dtype, device) for shape, stride, dtype in layout]
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


def _random_operand(shape, stride, dtype: torch.dtype, device: int) -> torch.Tensor:
    # Fill the whole span the strides reach, then view it: writing through an
    # overlapping (e.g. stride-0) view is refused by torch.
    span = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(n > 0 for n in shape) else 1
    target = torch.device("cuda", device)
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
