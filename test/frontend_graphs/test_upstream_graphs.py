"""The upstream graphs (test/support/upstream_graphs/) without a GPU.

* Every builder describes: the frontend runs it on a description made as the registry makes
  one (shape inference runs; the backend check needs the driver), and every output gets a
  layout whose shape is the torch reference's (the reference runs on meta tensors).
* Every graph traces under torch.compile(backend="aot_eager", fullgraph=True) on fake CUDA
  tensors (host scalars stay CPU tensors), as one cudnn_fe.execute whose outputs have the
  description's shapes and dtypes, laid out densely (which dimension order the build writes
  is the GPU suite's to check, bitwise against the frontend).
"""

import pytest
import torch
from torch._dynamo.testing import AotEagerAndRecordGraphs
from torch._subclasses.fake_tensor import FakeTensorMode

from torch_cudnn_handle.registry.describe import validate_description
from support.upstream_graphs import _TORCH_OF, GRAPHS, describe_with_frontend


_validate = validate_description  # the registry's rule: inference must pass; the backend's own check needs the driver


def _fake_cuda(inputs, mode):
    """Fake CUDA tensors with the inputs' layouts; a host scalar stays a (fake) CPU tensor."""
    with mode:
        return [
            torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu" if t.device.type == "cpu" else "cuda")
            for t in inputs
        ]


def test_the_suite_covers_the_issue_families():
    families = {e.family for e in GRAPHS}
    assert len(GRAPHS) >= 20
    assert {"matmul", "conv fprop", "conv dgrad", "conv wgrad", "batchnorm", "layernorm", "rmsnorm", "instancenorm", "rope",
            "sdpa", "fp8", "int8"} <= families
    assert len({e.name for e in GRAPHS}) == len(GRAPHS)
    assert len({e.graph_id for e in GRAPHS}) == len(GRAPHS)


@pytest.mark.parametrize("entry", GRAPHS, ids=lambda e: e.name)
def test_builder_describes_with_the_frontend(entry):
    inputs = entry.make_inputs("meta")
    graph, _, outputs = describe_with_frontend(entry, inputs)
    _validate(graph)
    assert len(outputs) == len(entry.tolerances), f"{entry.name}: one tolerance per output"
    expected = entry.reference(inputs)
    assert len(expected) == len(outputs)
    for i, (out, ref) in enumerate(zip(outputs, expected)):
        assert out.dim and out.stride and len(out.dim) == len(out.stride), f"{entry.name} output {i} has no layout"
        if ref is not None:
            assert list(out.dim) == list(ref.shape), f"{entry.name} output {i}: described {out.dim}, reference {list(ref.shape)}"


def _dense(shape, stride) -> bool:
    """Every element once, no gaps: packed in some dimension order."""
    expected = 1
    for size, step in sorted(zip(shape, stride), key=lambda d: (d[1], d[0])):
        if size > 1 and step != expected:
            return False
        expected *= size
    return True


@pytest.mark.parametrize("entry", GRAPHS, ids=lambda e: e.name)
def test_graph_traces_under_compile_on_fake_cuda_tensors(entry):
    torch._dynamo.reset()
    inputs = entry.make_inputs("meta")
    graph, _, described = describe_with_frontend(entry, inputs)
    _validate(graph)
    fakes = _fake_cuda(inputs, FakeTensorMode())
    backend = AotEagerAndRecordGraphs()
    outputs = torch.compile(lambda *xs: torch.ops.cudnn_fe.execute(entry.graph_id, list(xs)), backend=backend, fullgraph=True)(*fakes)
    assert len(backend.fw_graphs) == 1
    assert backend.fw_graphs[0].code.count("torch.ops.cudnn_fe.execute.default(") == 1
    assert [(list(o.shape), o.dtype, o.device.type) for o in outputs] == [(list(d.dim), _TORCH_OF[d.data_type], "cuda") for d in described]
    assert all(_dense(o.shape, o.stride()) for o in outputs), [o.stride() for o in outputs]
