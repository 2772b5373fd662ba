"""What torch_cudnn_handle has done in this process: one function per subsystem, each a dict.

  * ``pool()``: cuDNN handles per device (created, in use, idle) and ``cudnnSetStream`` calls;
  * ``graphs()``: the graph cache (hits, misses, builds, evictions, hand-overs to the native
    path, graphs cached and where they run, routes, time spent obtaining plans, by phase);
  * ``plan_store()``: the on-disk plan store (hits, misses, writes, rejected, write errors);
  * ``build_processes()``: the helper processes background builds run cuDNN's build in
    (running, builds, failures and the last one's error, why the route is off);
  * ``tuning()``: plan tuning (timings done, tuning-file hits and misses, the latest choices);
  * ``native_cuda_graphs()``: the native path's CUDA graphs (populated, captured, launched, failed, kept);
  * ``verify()``: verify mode (first executions checked, mismatches, skipped by reason, seconds);
  * ``everything()``: all of them, by those names (``python -m torch_cudnn_handle --json`` prints it).

Thread-safe: each subsystem counts under its own lock; the dicts are copies.
"""

from __future__ import annotations

from . import native, registry
from .op import verify as verify_mode
from .pool import pool_stats
from .registry.plans import build_process, store
from .registry.plans.tuning import tuning_stats

__all__ = ["pool", "graphs", "plan_store", "build_processes", "tuning", "native_cuda_graphs", "verify", "everything"]


def pool() -> dict:
    return pool_stats()


def graphs() -> dict:
    return registry.graph_stats()


def plan_store() -> dict:
    return store.stats()


def build_processes() -> dict:
    return build_process.stats()


def tuning() -> dict:
    return tuning_stats()


def native_cuda_graphs() -> dict:
    return native.cuda_graph_stats()


def verify() -> dict:
    return verify_mode.stats()


def everything() -> dict:
    return dict(
        pool=pool(), graphs=graphs(), plan_store=plan_store(), build_processes=build_processes(), tuning=tuning(), native_cuda_graphs=native_cuda_graphs(), verify=verify(),
    )
