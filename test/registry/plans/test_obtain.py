"""Where ``plans.obtain`` takes a plan from (registry/plans/__init__.py): a plan the store holds, or
a build process sends, comes back read and checked but not deserialized off the caller's path
(``fetch_only``: Note [A fetched plan is loaded by the call that takes it]), deserialized in a
call, and built there when cuDNN will not take it back. Without a GPU the store, the helper and
cuDNN's build are seams; the description is the registry's own."""

import dataclasses

import pytest
import torch

from support.timed_builds import define_relu
from torch_cudnn_handle.registry import plans
from torch_cudnn_handle.registry.build_timing import PhaseClock
from torch_cudnn_handle.registry.data_types import GraphDataTypes
from torch_cudnn_handle.registry.definition import Definitions
from torch_cudnn_handle.registry.plans import build_process, stored_graphs
from torch_cudnn_handle.registry.routes import Route
from torch_cudnn_handle.registry.specs import TensorSpec

SPECS = (TensorSpec.of(torch.empty(2, 3, 4)),)


class _Built(Exception):
    """cuDNN's build was reached (the seam's answer)."""


def _declared_relu(g, x):
    return g.relu(x).set_dim(list(x.dim)).set_stride(list(x.stride)).set_data_type(x.data_type)


@pytest.fixture
def seams(monkeypatch):
    loaded = object()  # the graph cuDNN's deserialize gives
    monkeypatch.setattr(stored_graphs, "key_of", lambda *args: "key")
    monkeypatch.setattr(stored_graphs, "store_blob", lambda *args: None)
    monkeypatch.setattr(plans, "load_fetched", lambda obtained, name, handle: dataclasses.replace(obtained, graph=loaded))
    monkeypatch.setattr(plans, "_build_described", lambda *args: (_ for _ in ()).throw(_Built()))
    return loaded


@pytest.mark.parametrize("source", ["plan_store", "build_process"])
def test_a_plan_from_elsewhere_is_fetched_off_the_path_and_deserialized_in_a_call(seams, monkeypatch, source):
    definitions = Definitions()
    if source == "plan_store":
        definition = definitions.get(define_relu(definitions))
    else:  # a build process takes a graph whose outputs are declared
        definition = definitions.get(definitions.define(_declared_relu, name="declared_relu", params={}, backward=None, tune=None, output_shapes=None,
                                                        data_types=GraphDataTypes(), dynamic_shapes=None, ragged=None, views=None, in_place=None))
    stored = (b"blob", {"engine": "backend:stored"}) if source == "plan_store" else None
    monkeypatch.setattr(stored_graphs, "fetch_blob", lambda key, uids: stored)
    monkeypatch.setattr(build_process, "offer", lambda graph, device, recipe=None: (b"blob", "backend:sent"))
    monkeypatch.setattr(stored_graphs, "check_blob", lambda blob, uids, **versions: None)
    monkeypatch.setattr(plans.cudnn, "backend_version", lambda: 91900)  # no libcudnn here to ask
    route = Route("cudnn", ("plan_store", "build_process", "static"))
    fetched = plans.obtain(definition, 0, SPECS, None, route, PhaseClock(), True)
    assert fetched.fetched and (fetched.source, fetched.serialized, fetched.key) == (source, b"blob", "key")
    loaded = plans.obtain(definition, 0, SPECS, None, route, PhaseClock(), False)
    assert loaded.graph is seams and loaded.source == source and not loaded.fetched
    monkeypatch.setattr(plans, "load_fetched", lambda obtained, name, handle: None)  # cuDNN will not take it back
    with pytest.raises(_Built):
        plans.obtain(definition, 0, SPECS, None, route, PhaseClock(), False)
