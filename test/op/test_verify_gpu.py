"""Verify mode on the GPU: each built graph's first execution compared with the reference
interpreter on its device. No false alarm on the upstream graphs, and the wrong broadcast
of Note [Pointwise broadcasts] flagged when the graph is built as written (the workaround
switched off for the test). test_verify.py has the rule and the report on the CPU."""

import dataclasses
import types

import cudnn
import pytest
import torch

import torch_cudnn_handle as tch
from conftest import skip_where_cudnn_lacks_engines
from support.upstream_graphs import GRAPHS
from torch_cudnn_handle import settings, stats
from torch_cudnn_handle.op import verify
from torch_cudnn_handle.registry import describe as describing, routes

pytestmark = pytest.mark.gpu

NOT_INTERPRETED = {"sdpa_forward_dropout"}  # the interpreter refuses it: skipped and counted, never flagged


def _fresh(entry, suffix):
    """The entry registered again: a new id, so its first call builds and is checked."""
    return tch.register_graph(
        entry.builder, name=f"verify_{suffix}_{entry.name}", in_place=entry.in_place, **(entry.frontend_types or {}), **entry.params
    )


@pytest.mark.parametrize(
    "entry",
    [pytest.param(e, id=e.name, marks=[pytest.mark.xfail(strict=False, reason=e.known_issue)] if e.known_issue else []) for e in GRAPHS],
)
def test_every_upstream_graph_passes_verify_at_its_first_execution(entry):
    graph_id = _fresh(entry, "eager")
    inputs = entry.make_inputs("cuda")
    before = stats.verify()
    with settings.override(verify=True):
        try:
            outputs = tch.execute(graph_id, inputs)  # raises VerifyMismatch if cuDNN and the interpreter disagree
        except cudnn.cudnnGraphNotSupportedError as error:  # as test_upstream_graphs_gpu: cuDNN here refuses the graph
            pytest.skip(f"cuDNN {cudnn.backend_version()} here does not build {entry.name}: {str(error)[:200]}")
        except RuntimeError as error:  # the interpreter's torch convolution, on a cuDNN without precompiled engines
            skip_where_cudnn_lacks_engines(error, f"{entry.name} or torch's own op for it")
        again = tch.execute(graph_id, inputs)  # not the first execution: no check
    after = stats.verify()
    if entry.name in NOT_INTERPRETED:
        assert after["skipped"]["a node the interpreter does not know"] > before["skipped"].get("a node the interpreter does not know", 0)
        return
    assert after["checked"] == before["checked"] + 1 and after["mismatches"] == before["mismatches"]
    assert len(outputs) == len(again)
    (built,) = tch.built_graphs(graph_id)
    print(f"\n{entry.name}: verified ({built.engine}, {'native' if built.native else 'Python path'})")


def test_execute_in_place_and_out_are_verified_too():
    entry = next(e for e in GRAPHS if e.name == "batchnorm_relu_mask")  # in_place={3: 3, 4: 4}
    graph_id = _fresh(entry, "in_place")
    before = stats.verify()["checked"]
    with settings.override(verify=True):
        tch.execute_(graph_id, entry.make_inputs("cuda"))  # checked against the inputs as they were before the write
        matmul = _fresh(next(e for e in GRAPHS if e.name == "matmul_bias"), "out")
        inputs = next(e for e in GRAPHS if e.name == "matmul_bias").make_inputs("cuda")
        (y,) = tch.execute_reference(matmul, inputs)
        out = torch.empty_like(y)
        tch.execute_out(matmul, inputs, out=[out])
    assert stats.verify()["checked"] == before + 2


def fma(graph, x, s, y):
    return graph.add(graph.mul(x, s, name="mul"), y, name="add")


def _fma_inputs(dtype):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(*shape, generator=gen) * 2).to(dtype=dtype, device="cuda") for shape in ((4, 64, 96), (1, 1, 96), (4, 64, 96))]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_the_wrong_broadcast_is_flagged_when_the_graph_is_built_as_written(dtype, monkeypatch):
    monkeypatch.setattr(describing, "broadcast_inputs", lambda *_: ())  # the workaround off: s described [1, 1, 96]
    inputs = _fma_inputs(dtype)
    as_written = tch.register_graph(fma, name=f"fma_as_written_{dtype}")
    (raw,) = tch.execute(as_written, inputs)  # verify off: what cuDNN computes
    x, s, y = (t.double() for t in inputs)
    error = float((raw.double() - (x * s + y)).abs().max())
    if error < 1e-2 * float((x * s + y).abs().max()):
        pytest.skip(f"this cuDNN ({cudnn.backend_version_string()}) computes the broadcast right (max error {error:.3g}): "
                    "nothing for verify to flag")
    checked = stats.verify()
    flagged = tch.register_graph(fma, name=f"fma_verified_{dtype}")
    with settings.override(verify=True), pytest.raises(verify.VerifyMismatch) as raised:
        tch.execute(flagged, inputs)
    message = str(raised.value)
    (built,) = tch.built_graphs(flagged)
    for words in (f"graph 'fma_verified_{dtype}'", "layout: ", "[1, 1, 96]", f"engine: {built.engine}", "max abs error", "max rel error",
                  "tolerance atol"):
        assert words in message, (words, message)
    assert stats.verify()["mismatches"] == checked["mismatches"] + 1
    print(f"\n{dtype}: cuDNN's broadcast is off by up to {error:.3g}; verify said:\n{message}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_the_materialized_broadcast_passes_verify(dtype):
    graph_id = tch.register_graph(fma, name=f"fma_materialized_{dtype}")
    inputs = _fma_inputs(dtype)
    with settings.override(verify=True):
        tch.execute(graph_id, inputs)
    (built,) = tch.built_graphs(graph_id)
    assert built.layout.materialized == ((1, (4, 64, 96)),) and built.inputs[1].shape == (4, 64, 96)


def test_never_during_a_capture_and_counted():
    graph_id = tch.register_graph(fma, name="fma_capture")
    inputs = _fma_inputs(torch.float16)
    tch.execute(graph_id, inputs)
    (built,) = tch.built_graphs(graph_id)
    verified = dataclasses.replace(built, route=dataclasses.replace(built.route, verify=True))  # as verify on had routed it
    before = stats.verify()["skipped"].get("CUDA-graph capture", 0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        assert verify.first_execution(graph_id, verified, inputs) is None
    assert stats.verify()["skipped"]["CUDA-graph capture"] == before + 1


def test_off_a_layout_reads_the_setting_once_and_checks_nothing(monkeypatch):
    checked = stats.verify()["checked"]
    reads = []
    counting = types.SimpleNamespace(get=lambda name: (reads.append(name), settings.get(name))[1])
    graph_id = tch.register_graph(fma, name="fma_off")
    inputs = _fma_inputs(torch.float16)
    with settings.override(verify=False):  # whatever the environment says
        monkeypatch.setattr(routes, "settings", counting)  # the route's reads of the settings, counted
        for _ in range(3):
            tch.execute(graph_id, inputs)
    assert reads.count("verify") == 1 and stats.verify()["checked"] == checked  # when the layout's route was decided, nowhere else
    assert not tch.built_graphs(graph_id)[0].route.verify
