"""Tuned plan choice: time the heuristics' candidate plans once, keep the fastest.

``graph.build([A, FALLBACK])`` takes the heuristics' first plan that builds. With
tuning on (``register_graph(..., tune=True)``, or the ``plan_tuning`` setting:
``settings.set_plan_tuning(True)`` / ``TORCH_CUDNN_HANDLE_TUNE=1``; a per-graph ``tune=`` wins), the build instead
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

The package: ``choice.py`` (what a build selected), ``tuning_file.py`` (the JSON file of
choices), ``timing.py`` (building and timing the candidates); here the stats and
``build_graph``, which the registry's build calls.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable, Dict, Optional, Sequence

import cudnn
import torch

from .... import settings
from .tuning_file import cache_key, read_cache, write_cache_entries
from .choice import HEURISTICS, PlanChoice, Spec
from .timing import time_candidates

__all__ = ["PlanChoice", "build_graph", "tuning_stats", "cache_path", "cache_key", "read_cache", "write_cache_entries"]


# -- settings (settings.py: plan_tuning, tuning_file; a per-graph tune= wins) -----------


def cache_path() -> str:
    """The tuning file in use (the ``tuning_file`` setting)."""
    return settings.get("tuning_file")


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


# -- building -------------------------------------------------------------------------------


def build_graph(
    graph,
    *,
    tune: bool,
    device: int,
    handle,
    input_specs: Sequence[Spec],
    output_specs: Sequence[Spec],
    uids: Sequence[int],
    name: str = "graph",
    fresh_graph: Optional[Callable[[], Any]] = None,
    lap: Callable[[str], None] = lambda phase: None,
) -> PlanChoice:
    """Build ``graph`` (described, not built) for ``device``, tuned or not, and say what
    was selected. ``uids`` are the operands' uids in ``input_specs + output_specs`` order;
    ``handle`` is the caller's ``cudnn.Handle`` for ``device`` on torch's current stream
    there; ``fresh_graph()`` returns an unbuilt twin of ``graph`` (needed only under
    deterministic algorithms, to learn which plans are deterministic). ``lap(phase)``
    is called as each of cuDNN's build steps ends ("operation_graph", "heuristics",
    "support", then "plan" untuned or "tune" tuned), to time them (registry/build_timing.py)."""
    if not tune:
        # Exactly graph.build(HEURISTICS) (validated already), a step at a time so each is timed.
        graph.build_operation_graph()
        lap("operation_graph")
        graph.create_execution_plans(list(HEURISTICS))
        lap("heuristics")
        graph.check_support()
        lap("support")
        graph.build_plans()
        lap("plan")
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
    label = f"{name} on cuda:{device} for " + ", ".join(f"{str(d).replace('torch.', '')}{list(s)}:{list(t)}" for s, t, d, *_ in input_specs)
    deterministic = torch.are_deterministic_algorithms_enabled() or torch.backends.cudnn.deterministic
    graph.build_operation_graph()  # build()'s steps (validating first if needed), but its plan walk
    lap("operation_graph")
    graph.create_execution_plans(list(HEURISTICS))
    lap("heuristics")
    graph.check_support()
    lap("support")
    # An unusable tuning file's folder (one warning, settings.py): tune, but neither read nor persist.
    path = cache_path() if settings.usable_directory("tuning_file") is not None else None
    key = _key_of(graph, device, layout, deterministic) if path is not None else None

    cached = read_cache(path).get(key) if key is not None else None
    if cached is not None and _select_cached(graph, cached):
        choice = PlanChoice(
            plan=cached["plan"], index=cached["index"], source="cache", reason=f"from {path}", candidates=int(cached.get("candidates", 0)),
            fastest_ms=cached.get("fastest_ms"), heuristic_plan=cached.get("heuristic_plan"), heuristic_ms=cached.get("heuristic_ms"),
        )
        _record(label, choice, cache_hits=1)
        lap("tune")
        return choice

    choice, persist = time_candidates(graph, device, handle, layout, uids, deterministic, fresh_graph)
    saved = key is not None and persist and write_cache_entries(path, {key: _entry_of(choice)})
    _record(label, choice, time.perf_counter() - started, cache_misses=1, tuned=1 if choice.candidates else 0,
            fallbacks=1 if choice.source == "heuristic" else 0, cache_errors=1 if (key is not None and persist and not saved) else 0)
    lap("tune")
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
