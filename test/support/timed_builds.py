"""A graph cache whose builds take their time without a GPU: the CPU seam of the graph cache's
tests (its build function and its capture check replaced), and the relu definitions they build."""

import threading
import time

from torch_cudnn_handle.registry import build as build_module, graph_cache
from torch_cudnn_handle.registry.data_types import GraphDataTypes
from torch_cudnn_handle.registry.definition import Definitions


def define_relu(definitions: Definitions, name: str = "relu", **options) -> int:
    """A relu's definition, with the registry's defaults but ``options``."""
    return definitions.define(lambda g, x: g.relu(x), name=name, params={}, backward=None, tune=None, output_shapes=None,
                              data_types=GraphDataTypes(), dynamic_shapes=None, ragged=None, views=None, in_place=None, **options)


class _TimedFetched(build_module.Fetched):
    """A plan the build fetched: its load sleeps ``cache.load_seconds``, fails while ``cache.load_failures`` > 0,
    and records its thread (``load_threads``)."""

    def __init__(self, cache, built):
        super().__init__(None, built.device, built.inputs, built.route, None, None, False)
        self._cache, self._graph = cache, built

    def _loaded(self):
        self._cache.load_threads.append(threading.current_thread().name)
        time.sleep(self._cache.load_seconds)
        if self._cache.load_failures:
            self._cache.load_failures -= 1
            raise RuntimeError("cuDNN: the plan was rejected, and its build failed")
        return self._graph


def timed_cache(monkeypatch, seconds: float = 0.0) -> graph_cache.GraphCache:
    """A GraphCache whose builds sleep ``cache.build_seconds`` and fail while ``cache.failures`` > 0,
    recording each build's thread (``build_threads``) and route (``routes``); ``cache.graph`` is a relu.
    With ``cache.fetch`` on, a build off the caller's path returns a fetched plan (_TimedFetched)."""
    made = graph_cache.GraphCache(Definitions())
    made.build_seconds, made.failures, made.build_threads, made.routes = seconds, 0, [], []
    made.fetch, made.load_seconds, made.load_failures, made.load_threads = False, 0.0, 0, []

    def timed_build(definition, device, specs, route, fetch_only=False):
        made.build_threads.append(threading.current_thread().name)
        made.routes.append(route)
        time.sleep(made.build_seconds)
        if made.failures:
            made.failures -= 1
            raise RuntimeError("cuDNN: no engine")
        built = build_module.BuiltGraph(graph=None, device=device, inputs=specs, layout=build_module.GraphLayout((), ()), uids=(),
                                        workspace_size=0, phase_seconds={}, route=route, plan_source="build_process")
        return _TimedFetched(made, built) if fetch_only and made.fetch else built

    monkeypatch.setattr(graph_cache, "build", timed_build)
    monkeypatch.setattr(graph_cache, "_capturing", lambda device: False)
    made.graph = define_relu(made.definitions)
    return made
