"""The main job's report in words: per subsystem, what it holds and did (the handle pool,
the graphs and where they came from and run, the plan store, plan tuning, the native CUDA
graphs, verify mode), from ``stats.everything()`` and the settings now. ``--json`` prints the same
dicts as they are."""

from __future__ import annotations

from . import settings, stats
from .pool import with_cuda

__all__ = ["current_stats", "current_settings", "summary_rows"]


def current_stats() -> dict:
    """Every stats dict of the library, by subsystem (``--json`` prints them as they are)."""
    return stats.everything()


def current_settings() -> dict:
    """Every setting's value now, by name (settings.py)."""
    return {setting.name: settings.get(setting.name) for setting in settings.SETTINGS}


def _counted(pairs, none: str = "none") -> str:
    """"2 built, 1 loaded" from (count, words) pairs, leaving out zero counts (all zero: ``none``)."""
    return ", ".join(f"{n} {words}" for n, words in pairs if n) or none


def _handle_rows(pool: dict) -> list:
    if not with_cuda:
        return [("handles", "none: this build has no CUDA, so it has no cuDNN handle pool")]
    devices = pool["devices"]
    if not devices:
        return [("handles", "none yet: the pool makes one per device and thread on first use")]
    rows = []
    for ordinal, counts in sorted(devices.items()):
        rows.append(("handles" if not rows else "", f"cuda:{ordinal}: {counts['created']} made, {counts['in_use']} held by "
                                                    f"live threads, {counts['free']} free for the next thread"))
    label, value = rows[0]
    rows[0] = (label, f"{value}; {pool['set_stream_calls']} cudnnSetStream calls" + (" (all devices)" if len(rows) > 1 else ""))
    return rows


SOURCE_WORDS = {
    "static": "built", "kernel_cache": "built from a kernel cache (dynamic shapes)", "plan_store": "loaded from the plan store",
    "reference": "run on the torch interpreter instead (reference=True or the reference_path setting)",
}


def _graph_rows(graphs: dict) -> list:
    sources = graphs["plan_sources"]
    obtained = sum(sources.values())
    if not obtained and not graphs["cached"]:
        return [("graphs", f"{graphs['definitions']} registered, none built yet (each is built on its first call, "
                           "per device and input layout)")]
    where = _counted((n, SOURCE_WORDS.get(source, f"via {source}")) for source, n in sorted(sources.items(), key=lambda item: item[0] != "static"))
    rows = [("graphs", f"{graphs['definitions']} registered; {obtained} obtained in {graphs['plan_seconds']:.2f} s: {where}")]
    pending = graphs["native_pending"]
    on_python = "on the Python path" + (f" ({pending} of them go native at their next call)" if pending else "")
    paths = _counted([(graphs["native"], "run natively (C++)"), (graphs["python_path"], on_python)])
    rows.append(("  in the cache", f"{graphs['cached']} of at most {graphs['capacity']}: {paths}"
                                   + (f"; {graphs['evictions']} evicted" if graphs["evictions"] else "")))
    return rows


def _plan_store_row(store: dict, now: dict, active_only: bool) -> list:
    counts = _counted([(store["hits"], "plans loaded"), (store["writes"], "written"),
                       (store["rejected"], "rejected (stale or damaged)"), (store["write_errors"], "failed to write")], none="")
    if active_only and not counts:
        return []
    if not now["plan_store"]:
        return [("plan store", "off (TORCH_CUDNN_HANDLE_PLAN_STORE=0 or settings.set_plan_store(False)): every graph is built"
                 + (f"; {counts}" if counts else ""))]
    return [("plan store", f"on, {now['plan_store_dir']}: " + (counts or "nothing loaded or written yet"))]


def _tuning_row(tuning: dict, now: dict, active_only: bool) -> list:
    counts = _counted([(tuning["tuned"], "graphs timed"), (tuning["cache_hits"], "choices from the tuning cache"),
                       (tuning["fallbacks"], "fell back to the heuristics' plan"), (tuning["cache_errors"], "tuning-cache errors")],
                      none="")
    if active_only and not counts:
        return []
    if not now["plan_tuning"]:
        return [("plan tuning", "off: heuristics pick each plan (TORCH_CUDNN_HANDLE_TUNE=1 or settings.set_plan_tuning(True) times them)"
                 + (f"; {counts}" if counts else ""))]
    timed = f"{counts} in {tuning['tune_seconds']:.2f} s" if counts else "nothing timed yet"
    return [("plan tuning", f"on, choices in {now['tuning_file']}: {timed}")]


def _cuda_graph_row(graphs: dict, active_only: bool) -> list:
    counts = _counted([(graphs["populated"] + graphs["captured"], "made"), (graphs["launched"], "launches"),
                       (graphs["failed"], "could not be made"), (graphs["kept"], "kept")], none="")
    if active_only and not counts:
        return []
    if not with_cuda:
        return [("native CUDA graphs", "none: this build has no CUDA")]
    if not graphs["enabled"]:
        return [("native CUDA graphs", "off (TORCH_CUDNN_HANDLE_NATIVE_CUDA_GRAPHS=0 or settings.set_native_cuda_graphs(False))"
                 + (f"; {counts}" if counts else ""))]
    return [("native CUDA graphs", "on (a native call whose addresses repeat replays one): " + (counts or "none made yet"))]


def _verify_row(verify: dict, active_only: bool) -> list:
    counts = _counted([(verify["checked"], "first executions checked"), (verify["mismatches"], "wrong"),
                       (sum(verify["skipped"].values()), "skipped")], none="")
    if active_only and not counts:
        return []
    if not verify["enabled"]:
        return [("verify", "off (TORCH_CUDNN_HANDLE_VERIFY=1 or settings.set_verify(True) checks each built graph's first run "
                           "against the torch interpreter)" + (f"; {counts}" if counts else ""))]
    return [("verify", f"on, each built graph's first run against the torch interpreter: {counts or 'nothing checked yet'}"
                       + (f" in {verify['seconds']:.2f} s" if counts else ""))]


def summary_rows(counts: dict, now: dict, active_only: bool = False) -> list:
    """(label, value) rows that say, per subsystem, what it holds and did, in words:
    the handle pool, the graphs (built or loaded, from where, on which path), the plan
    store, plan tuning and the native CUDA graphs. ``active_only``: handles and graphs,
    and the others only where they counted something."""
    return [
        *_handle_rows(counts["pool"]),
        *_graph_rows(counts["graphs"]),
        *_plan_store_row(counts["plan_store"], now, active_only),
        *_tuning_row(counts["tuning"], now, active_only),
        *_cuda_graph_row(counts["native_cuda_graphs"], active_only),
        *_verify_row(counts["verify"], active_only),
    ]
