"""Every graph of test/upstream_graphs.py through the interpreter on the CPU, against the
entry's own torch reference, within the entry's tolerances (and region).

Each graph is described by the registry (``describe``), as the op describes a call: CPU
inputs of one element are pass-by-value, all others ordinary operands. Outputs must have
the described layout. Where an entry cannot be matched or its CPU reference is off, the
entry is listed in support/interpreter.py with the reason.
"""

import pytest
import torch
import torch.nn.functional as F

from support import upstream_graphs as ug
from support.interpreter import CPU_REFERENCE, REFUSED, assert_matches_entry, describe_registered, same_layout
from torch_cudnn_handle.interpreter import interpret_ordered

# REFUSED (the graphs the interpreter refuses, with why) and CPU_REFERENCE (where an entry's
# own CPU reference is off) live in support/interpreter.py, shared with test/op/test_cpu_kernel.py.


@pytest.mark.parametrize("compute_dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("entry", ug.GRAPHS, ids=lambda e: e.name)
def test_upstream_graph_matches_its_reference(entry, compute_dtype):
    inputs = entry.make_inputs("cpu")
    graph, ins, outs, _ = describe_registered(entry.graph_id, inputs)
    if entry.name in REFUSED:
        with pytest.raises(NotImplementedError, match=REFUSED[entry.name]):
            interpret_ordered(graph, ins, outs, inputs, compute_dtype=compute_dtype)
        return
    got = interpret_ordered(graph, ins, outs, inputs, compute_dtype=compute_dtype)
    assert len(got) == len(outs) == len(entry.tolerances)
    for i, (g, desc) in enumerate(zip(got, outs)):
        assert same_layout(g, desc), f"{entry.name} output {i}: {list(g.shape)} {g.stride()} {g.dtype}, described {desc.dim} {desc.stride}"
    assert_matches_entry(entry, got, CPU_REFERENCE.get(entry.name, entry.reference)(inputs), inputs)


def test_layernorm_backwards_dx_matches_the_entrys_own_reference_too():
    entry = ug.BY_NAME["layernorm_backward"]
    inputs = entry.make_inputs("cpu")
    graph, ins, outs, _ = describe_registered(entry.graph_id, inputs)
    dx = interpret_ordered(graph, ins, outs, inputs)[0]
    atol, rtol = entry.tolerances[0]
    torch.testing.assert_close(dx.double(), entry.reference(inputs)[0].double(), atol=atol, rtol=rtol)


def test_batchnorm_relu_mask_outputs_upstream_does_not_check():
    """The running statistics and the mask, which the entry's reference leaves out: against
    torch's batch_norm running-stat update and the relu output's comparison."""
    entry = ug.BY_NAME["batchnorm_relu_mask"]
    inputs = entry.make_inputs("cpu")
    graph, ins, outs, _ = describe_registered(entry.graph_id, inputs)
    y, _, _, next_mean, next_var, mask = interpret_ordered(graph, ins, outs, inputs)
    x, scale, bias, running_mean, running_var, epsilon, momentum, comparison = inputs
    rm, rv = running_mean.double().view(-1), running_var.double().view(-1)  # copies: batch_norm updates them
    F.batch_norm(x.double(), rm, rv, scale.view(-1).double(), bias.view(-1).double(), training=True, momentum=momentum.item(), eps=epsilon.item())
    torch.testing.assert_close(next_mean.view(-1), rm.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(next_var.view(-1), rv.float(), atol=1e-5, rtol=1e-5)
    assert mask.dtype == torch.bool and torch.equal(mask, y > comparison)
