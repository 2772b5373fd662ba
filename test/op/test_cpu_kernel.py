"""The op's CPU kernel: torch.ops.cudnn_fe.execute (execute.out, execute_) on CPU tensors
runs the reference interpreter on the graph's description and returns what a CUDA call
returns, in its layout. Real numbers, no GPU: every upstream graph against its torch
reference, opcheck, out=, in place, host scalars, ragged and natural operands, every
Backward kind, and what stays refused."""

import pytest
import torch
import torch.nn.functional as F

import torch_cudnn_handle as tch
from support import ragged_graphs as rg
from support import upstream_graphs as ug
from support.graphs import LINEAR_RELU, RELU, RELU_DECLARED, linear_inputs, linear_relu_reference
from support.interpreter import CPU_REFERENCE, REFUSED, assert_matches_entry
from torch_cudnn_handle import registry
from torch_cudnn_handle.op import checks
from torch_cudnn_handle.registry import TensorSpec
from torch_cudnn_handle.registry.describe import described


def _op_layout(graph_id, inputs):
    """What a CUDA call (and the fake kernel) returns: the description's output layouts."""
    specs = [TensorSpec.of(t) for t in inputs]
    return registry.layout(graph_id, specs).outputs_for([t.shape for t in inputs])


def _assert_op_layout(graph_id, inputs, outputs):
    expected = _op_layout(graph_id, inputs)
    assert len(outputs) == len(expected)
    for i, (got, spec) in enumerate(zip(outputs, expected)):
        assert (tuple(got.shape), got.stride(), got.dtype, got.device.type) == (spec.shape, spec.stride, spec.dtype, "cpu"), i


# -- the upstream graphs --------------------------------------------------------------


@pytest.mark.parametrize("entry", ug.GRAPHS, ids=lambda e: e.name)
def test_upstream_graph_through_the_op_on_cpu_matches_its_reference(entry):
    inputs = entry.make_inputs("cpu")
    if entry.name in REFUSED:
        with pytest.raises(NotImplementedError, match=REFUSED[entry.name]):
            torch.ops.cudnn_fe.execute(entry.graph_id, inputs)
        return
    outputs = torch.ops.cudnn_fe.execute(entry.graph_id, inputs)
    _assert_op_layout(entry.graph_id, inputs, outputs)
    assert_matches_entry(entry, outputs, CPU_REFERENCE.get(entry.name, entry.reference)(inputs), inputs)


def test_an_unsupported_node_surfaces_through_the_op_naming_the_node():
    entry = ug.BY_NAME["sdpa_forward_dropout"]
    with pytest.raises(NotImplementedError, match=r"interpreter: node 'sdpa_forward' \(SDPA\) attribute 'dropout'"):
        tch.execute(entry.graph_id, entry.make_inputs("cpu"))


def test_a_call_is_described_once_per_layout_not_per_call():
    seen = []

    def counted(graph, x):
        seen.append(tuple(x.dim))
        return graph.relu(x)

    graph_id = tch.register_graph(counted)
    for _ in range(3):
        (y,) = tch.execute(graph_id, [torch.randn(2, 3, 4)])
    assert seen == [(2, 3, 4)]  # one description, kept (registry.description)
    tch.execute(graph_id, [torch.randn(2, 3, 5)])
    assert seen == [(2, 3, 4), (2, 3, 5)]
    assert described.cache_info().currsize >= 2


# -- execute.out, execute_, host scalars --------------------------------------------


def test_execute_out_writes_the_outputs_and_is_checked_as_on_cuda():
    x, w, b = linear_inputs(device="cpu")
    (y,) = tch.execute(LINEAR_RELU, [x, w, b])
    out = torch.full_like(y, float("nan"))
    assert torch.ops.cudnn_fe.execute.out(LINEAR_RELU, [x, w, b], out=[out]) is None
    assert torch.equal(out, y)
    torch.testing.assert_close(y, linear_relu_reference(x, w, b), atol=2e-3, rtol=2e-3)
    with pytest.raises(ValueError, match=r"out\[0\] of graph 'linear_relu' is float16\[2, 8, 16\].*writes float16\[2, 16, 8\]"):
        tch.execute_out(LINEAR_RELU, [x, w, b], out=[torch.empty(2, 8, 16, dtype=torch.float16)])
    with pytest.raises(ValueError, match="has 1 outputs, got 2 out tensors"):
        tch.execute_out(LINEAR_RELU, [x, w, b], out=[out, out.clone()])
    with pytest.raises(ValueError, match=r"out\[0\] of graph 'linear_relu' overlaps inputs\[0\]"):
        tch.execute_out(LINEAR_RELU, [x, w, b], out=[x.view(-1)[: out.numel()].view(out.shape)])


def test_execute_in_place_writes_the_running_statistics_into_the_inputs():
    entry = ug.BY_NAME["batchnorm_relu_mask"]  # in_place={3: 3, 4: 4}: next running mean and var into the running ones
    inputs = entry.make_inputs("cpu")
    functional = tch.execute(entry.graph_id, [t.clone() for t in inputs])
    running_mean, running_var = inputs[3], inputs[4]
    versions = running_mean._version, running_var._version
    others = tch.execute_(entry.graph_id, inputs)
    assert len(others) == len(functional) - 2
    assert torch.equal(running_mean, functional[3]) and torch.equal(running_var, functional[4])
    assert (running_mean._version, running_var._version) > versions  # the schema's mutation, seen by autograd
    for got, expected in zip(others, [t for i, t in enumerate(functional) if i not in (3, 4)]):
        assert torch.equal(got, expected)
    with pytest.raises(RuntimeError, match="requires grad, and execute_ has no gradient"):
        fresh = entry.make_inputs("cpu")
        fresh[0].requires_grad_()
        tch.execute_(entry.graph_id, fresh)


def scaled(graph, x, scale):
    return graph.mul(x, scale, name="scale")


SCALED = tch.register_graph(scaled, name="scaled")


def test_a_one_element_cpu_tensor_is_a_host_scalar_passed_by_value_as_on_cuda():
    x = torch.randn(2, 3, 4)
    results = [tch.execute(SCALED, [x, torch.tensor(value)])[0] for value in (2.0, -0.5)]
    torch.testing.assert_close(results[0], x * 2)
    torch.testing.assert_close(results[1], x * -0.5)
    graph, inputs, _, _ = registry.description(SCALED, [TensorSpec.of(x), TensorSpec.of(torch.tensor(2.0))])
    assert inputs[1].is_pass_by_value and list(inputs[1].dim) == [1, 1, 1]  # described as the CUDA call is: by value
    assert registry.description(SCALED, [TensorSpec.of(x), TensorSpec.of(torch.tensor(7.0))]) is registry.description(
        SCALED, [TensorSpec.of(x), TensorSpec.of(torch.tensor(2.0))])  # another value: the same description


# -- ragged and natural operands ----------------------------------------------------


@pytest.mark.parametrize("own_o", [False, True], ids=["shared_offsets", "own_o_offsets"])
def test_ragged_attention_on_cpu_returns_packed_outputs_per_sequence(own_o):
    graph = rg.register()[own_o]
    lens_q, lens_kv = (5, 17, 30), (9, 12, 40)
    inputs = rg.inputs(lens_q, lens_kv, "cpu", own_o=own_o)
    (o,) = tch.execute(graph, inputs)
    assert (tuple(o.shape), o.stride()) == ((sum(lens_q), rg.H, rg.D), (rg.H * rg.D, rg.D, 1))  # packed [T, H, D], like q
    expected = rg.reference(*inputs[:3], lens_q, lens_kv)
    torch.testing.assert_close(o.float(), expected.float(), atol=4e-3, rtol=4e-3)


def test_ragged_training_forward_and_backward_through_autograd_on_cpu():
    forward = rg.register_training()
    lens_q, lens_kv = (5, 17, 30), (9, 12, 40)
    inputs = rg.training_inputs(lens_q, lens_kv, "cpu")
    q, k, v = (t.requires_grad_() for t in inputs[:3])
    o, stats = tch.execute(forward, inputs)
    assert o.shape == q.shape and stats.shape == (sum(lens_q), rg.H, 1)
    o.float().square().sum().backward()
    tq = tk = 0
    for nq, nk in zip(lens_q, lens_kv):  # torch's attention on each sequence's own tokens
        per = [t.detach()[a:a + n].transpose(0, 1)[None].float().requires_grad_() for t, a, n in ((q, tq, nq), (k, tk, nk), (v, tk, nk))]
        ref = F.scaled_dot_product_attention(*per, scale=rg.ATTN_SCALE)
        ref.square().sum().backward()
        torch.testing.assert_close(o[tq:tq + nq].float(), ref[0].transpose(0, 1), atol=4e-3, rtol=4e-3)
        for got, leaf in zip((q.grad[tq:tq + nq], k.grad[tk:tk + nk], v.grad[tk:tk + nk]), per):
            torch.testing.assert_close(got.float(), leaf.grad[0].transpose(0, 1), atol=2e-2, rtol=2e-2)
        tq, tk = tq + nq, tk + nk


def test_natural_operands_are_read_through_their_views_and_returned_natural():
    from torch_cudnn_handle.nn.linear import LINEAR_GRAPHS

    x = torch.randn(3, 5, 16, dtype=torch.float16)
    weight, bias = torch.randn(8, 16, dtype=torch.float16) / 4, torch.randn(8, dtype=torch.float16)
    y, z = tch.execute(LINEAR_GRAPHS["gelu"], [x, weight, bias])  # gelu also writes its pre-activation
    assert y.shape == z.shape == (3, 5, 8) and y.is_contiguous()
    expected_z = F.linear(x.float(), weight.float(), bias.float())
    torch.testing.assert_close(z.float(), expected_z, atol=4e-3, rtol=4e-3)
    torch.testing.assert_close(y.float(), F.gelu(expected_z), atol=4e-3, rtol=4e-3)
    strided = torch.randn(8, 32, dtype=torch.float16)[:, ::2]  # a weight view the graph reads at its strides
    (y2, _) = tch.execute(LINEAR_GRAPHS["gelu"], [x, strided, bias])
    torch.testing.assert_close(y2.float(), F.gelu(F.linear(x.float(), strided.float(), bias.float())), atol=4e-3, rtol=4e-3)


# -- autograd: every Backward kind -----------------------------------------------------


def _check_relu_grads(graph_id):
    x = torch.randn(2, 4, 8, requires_grad=True)
    (y,) = tch.execute(graph_id, [x])
    dy = torch.randn_like(y)
    y.backward(dy)
    torch.testing.assert_close(x.grad, dy * (x.detach() > 0))


def test_a_declared_backward_graph_runs_on_cpu():
    _check_relu_grads(RELU_DECLARED)


def test_a_backward_graph_of_computed_operands_runs_on_cpu():
    _check_relu_grads(RELU)


def test_a_backward_function_runs_on_cpu():
    x, w, b = linear_inputs(device="cpu", requires_grad=True)
    (y,) = tch.execute(LINEAR_RELU, [x, w, b])
    y.float().sum().backward()
    leaves = [t.detach().float().requires_grad_() for t in (x, w, b)]
    torch.relu(leaves[0] @ leaves[1] + leaves[2]).sum().backward()
    for got, expected in zip((x.grad, w.grad, b.grad), leaves):
        torch.testing.assert_close(got.float(), expected.grad, atol=2e-2, rtol=2e-2)


def test_backward_steps_run_on_cpu():
    from torch_cudnn_handle.nn import FusedLinear, reference_of

    layer = FusedLinear(16, 8, "relu", dtype=torch.float32)
    x = torch.randn(2, 5, 16, requires_grad=True)
    layer(x).square().sum().backward()
    reference = reference_of(layer)
    x2 = x.detach().clone().requires_grad_()
    reference(x2).square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, atol=1e-4, rtol=1e-4)
    for name, parameter in layer.named_parameters():
        torch.testing.assert_close(parameter.grad, reference.get_parameter(name).grad, atol=1e-4, rtol=1e-4)


# -- opcheck -------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["linear_relu", "relu_declared", "rmsnorm_views", "scaled_host_scalar"])
def test_opcheck_on_the_cpu_kernel(case):
    from torch_cudnn_handle.nn.norm import rmsnorm_graph

    if case == "linear_relu":
        graph_id, inputs = LINEAR_RELU, linear_inputs(device="cpu")
    elif case == "relu_declared":
        graph_id, inputs = RELU_DECLARED, [torch.randn(2, 4, 8)]
    elif case == "rmsnorm_views":
        graph_id, inputs = rmsnorm_graph(1e-5), [torch.randn(2, 3, 16, dtype=torch.float16), torch.randn(16, dtype=torch.float16)]
    else:
        graph_id, inputs = SCALED, [torch.randn(2, 3, 4), torch.tensor(3.0)]
    torch.library.opcheck(torch.ops.cudnn_fe.execute.default, (graph_id, inputs))
    if case != "scaled_host_scalar":  # a backward: autograd registration and aot_dispatch with gradients
        grads = [t.detach().requires_grad_() if t.is_floating_point() else t for t in inputs]
        torch.library.opcheck(torch.ops.cudnn_fe.execute.default, (graph_id, grads))
    outs = [torch.empty_strided(s.shape, s.stride, dtype=s.dtype) for s in _op_layout(graph_id, inputs)]
    torch.library.opcheck(torch.ops.cudnn_fe.execute.out, (graph_id, inputs), {"out": outs})


# -- what stays refused --------------------------------------------------------------


def test_a_cpu_tensor_beside_meta_ones_is_still_refused_by_the_one_device_rule():
    x, w, b = linear_inputs(device="cpu")
    with pytest.raises(ValueError, match=r"input 0 of graph 'linear_relu' is on cpu with 1024 elements.*inputs on more than one device"):
        tch.execute(LINEAR_RELU, [x, w.to("meta"), b.to("meta")])
    with pytest.raises(ValueError, match="only host scalars; pass at least one CUDA tensor.*runs on the CPU"):
        tch.execute(SCALED, [torch.tensor(1.0), torch.tensor(2.0)])


def test_another_backend_is_named_in_the_refusal():
    x = torch.empty(2, 3, 4, device="meta")  # the rule names whatever backend the one device is
    with pytest.raises(ValueError, match=r"input 0 of graph 'scaled' is on meta, and the op has no kernel for meta tensors.*CPU tensors"):
        checks.refuse_off_gpu(SCALED, [x, torch.tensor(1.0)])
