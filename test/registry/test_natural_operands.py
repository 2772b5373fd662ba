"""Natural operands (registry OperandViews) and declared backwards of several graphs
(backward_steps), on meta tensors: what the modules record under autograd, what the fake
kernel reports, and what registration refuses. The GPU side (values, bitwise against the
view-based route, no Python per step) is test_natural_operands_gpu.py."""

import pytest
import torch

import torch_cudnn_handle as tch
from conftest import python_backward_calls
from torch_cudnn_handle import BackwardOperand as Op
from torch_cudnn_handle import BackwardStep, OperandViews
from torch_cudnn_handle.nn import FusedLinear, RMSNorm, TransformerBlock
from torch_cudnn_handle.nn.linear import LINEAR_GRAPHS, matmul

BF16 = dict(device="meta", dtype=torch.bfloat16)


def _op_nodes_between(output, leaves):
    """The nodes on every path from ``output`` back to ``leaves``' AccumulateGrad nodes."""
    names, stack, seen = [], [output.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return names


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_fused_linear_records_one_node_and_no_views(activation):
    layer = FusedLinear(32, 48, activation, **BF16)
    x = torch.empty(2, 8, 32, requires_grad=True, **BF16)
    y = layer(x)
    assert y.shape == (2, 8, 48)
    assert sorted(_op_nodes_between(y, [x])) == ["AccumulateGrad"] * 3 + ["CppFunction"]
    with python_backward_calls() as calls:
        y.float().sum().backward()
    assert x.grad.shape == x.shape and layer.weight.grad.shape == (48, 32) and layer.bias.grad.shape == (48,)
    assert calls == []  # the steps ran in the node, through the op, with no Python backward


def test_rmsnorm_records_one_node_and_no_views():
    norm = RMSNorm(64, **BF16)
    x = torch.empty(3, 5, 64, requires_grad=True, **BF16)
    y = norm(x)
    assert y.shape == x.shape
    assert sorted(_op_nodes_between(y, [x])) == ["AccumulateGrad"] * 2 + ["CppFunction"]
    y.float().sum().backward()
    assert x.grad.shape == x.shape and norm.weight.grad.shape == (64,)


def test_rmsnorm_graph_returns_natural_statistics():
    norm = RMSNorm(64, **BF16)
    y, inv_var = tch.execute(norm._graph, [torch.empty(3, 5, 64, **BF16), norm.weight.detach()])
    assert y.shape == (3, 5, 64) and inv_var.shape == (3, 5, 1) and inv_var.dtype == torch.float32


def test_only_the_needed_steps_run_and_frozen_inputs_get_no_gradient():
    layer = FusedLinear(32, 48, "relu", **BF16)
    layer.weight.requires_grad_(False)
    x = torch.empty(4, 32, requires_grad=True, **BF16)
    layer(x).float().sum().backward()
    assert x.grad.shape == (4, 32) and layer.weight.grad is None and layer.bias.grad.shape == (48,)


def test_a_block_step_records_no_view_nodes_around_norms_and_linears():
    block = TransformerBlock(64, 4, **BF16)
    x = torch.empty(2, 16, 64, requires_grad=True, **BF16)
    nodes = _op_nodes_between(block(x), [x])
    # What is left is the attention's own head split (q, k, v) and merge: a view and a
    # transpose each (44 view nodes before the graphs took natural operands).
    views = sorted(n for n in nodes if n not in ("AccumulateGrad", "CppFunction", "AddBackward0"))
    assert views == ["TransposeBackward0"] * 4 + ["ViewBackward0"] * 4, nodes
    assert nodes.count("CppFunction") == 9  # 2 norms, 4 projections, sdpa, 2 MLP linears: one node each
    block(x).float().sum().backward()
    assert x.grad.shape == x.shape


def test_the_gelu_pre_activation_is_not_differentiable():
    layer = FusedLinear(32, 48, "gelu", **BF16)
    x = torch.empty(2, 32, requires_grad=True, **BF16)
    y, z = tch.execute(LINEAR_GRAPHS["gelu"], [x, layer.weight, layer.bias])
    assert y.requires_grad and not z.requires_grad and z.shape == (2, 48)


def test_a_non_contiguous_input_without_a_view_is_refused_with_the_fix():
    layer = FusedLinear(32, 48, None, **BF16)
    x = torch.empty(8, 2, 32, **BF16).transpose(0, 1)  # [2, 8, 32], no [1, 16, 32] view
    with pytest.raises(ValueError, match=r"copies: pass that input \.contiguous\(\)"):
        tch.execute(LINEAR_GRAPHS[None], [x, layer.weight.detach(), layer.bias.detach()])
    assert layer(x).shape == (2, 8, 48)  # the module makes it contiguous itself


def test_an_output_shape_of_another_size_is_refused():
    graph = tch.register_graph(matmul, name="bad_views", views=OperandViews(inputs=(None, None), outputs=lambda a, b: [(3,)]))
    with pytest.raises(ValueError, match="has no view of shape"):
        tch.execute(graph, [torch.empty(1, 4, 8, **BF16), torch.empty(1, 8, 2, **BF16)])


def test_a_view_that_starts_elsewhere_is_refused():
    graph = tch.register_graph(lambda g, a: g.relu(a), name="offset_view", views=OperandViews(inputs=(lambda t: t[1:],)))
    with pytest.raises(ValueError, match="starts elsewhere"):
        tch.execute(graph, [torch.empty(4, 8, **BF16)])


def test_registration_refuses_bad_steps():
    mm = tch.register_graph(matmul, name="steps_mm")
    with pytest.raises(ValueError, match="reads earlier steps only"):
        tch.register_graph(
            matmul, backward=tch.Backward.steps([BackwardStep(mm, [Op.step(0), Op.input(1)])], grads=[Op.step(0), None]),
        )
    with pytest.raises(ValueError, match="gives 1 gradients, but the builder takes 2"):
        tch.register_graph(
            matmul, backward=tch.Backward.steps([BackwardStep(mm, [Op.grad(0), Op.input(1)])], grads=[Op.step(0)]),
        )
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'grads'"):
        tch.register_graph(matmul, backward=tch.Backward.steps([BackwardStep(mm, [Op.grad(0), Op.input(1)])]))
    with pytest.raises(TypeError, match="needs backward_grads"):  # the earlier options' form
        tch.register_graph(matmul, backward_steps=[BackwardStep(mm, [Op.grad(0), Op.input(1)])])
    with pytest.raises(TypeError, match="one of them"):  # the options of earlier releases: still exclusive
        tch.register_graph(matmul, backward_fn=lambda *a: a, backward_steps=[BackwardStep(mm, [Op.grad(0)])], backward_grads=[None, None])
    with pytest.raises(ValueError, match="unknown graph id"):
        tch.register_graph(matmul, backward=tch.Backward.steps([BackwardStep(10**9, [Op.grad(0)])], grads=[None, None]))
    with pytest.raises(ValueError, match="only a gradient or a step's output"):
        Op.input(0).sum_to_input()
    with pytest.raises(TypeError, match="must be an OperandViews"):
        tch.register_graph(matmul, views=[None, None])


def test_a_user_graph_with_steps_views_and_a_summed_bias_gradient():
    """README's LINEAR2: dZ, then dX and dW on matmul graphs that view an operand
    transposed, and db as dZ summed to the bias's shape."""

    def linear_relu(g, x, w, b):
        return g.relu(g.add(g.matmul(x, w), b))

    relu_backward = tch.register_graph(lambda g, dy, y: g.relu_backward(dy, y), name="readme_relu_backward")
    a_bt = tch.register_graph(matmul, name="readme_a_bt", views=OperandViews(inputs=[None, lambda b: b.mT]))
    at_b = tch.register_graph(matmul, name="readme_at_b", views=OperandViews(inputs=[lambda a: a.mT, None]))
    linear = tch.register_graph(
        linear_relu, name="readme_linear2",
        backward=tch.Backward.steps([
            BackwardStep(relu_backward, [Op.grad(0), Op.output(0)]),
            BackwardStep(a_bt, [Op.step(0), Op.input(1)], for_grads=[0]),
            BackwardStep(at_b, [Op.input(0), Op.step(0)], for_grads=[1]),
        ], grads=[Op.step(1), Op.step(2), Op.step(0).sum_to_input()]),
    )
    half = dict(device="meta", dtype=torch.float16)
    x, w, b = (torch.empty(*shape, requires_grad=True, **half) for shape in ((1, 16, 32), (1, 32, 8), (1, 1, 8)))
    (y,) = tch.execute(linear, [x, w, b])
    y.sum().backward()
    assert (x.grad.shape, w.grad.shape, b.grad.shape) == (x.shape, w.shape, b.shape)


class _CountExecutes(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the cudnn_fe.execute calls that reach the dispatcher (every step does)."""

    def __init__(self):
        super().__init__()
        self.graphs = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.cudnn_fe.execute.default:
            self.graphs.append(args[0])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("frozen", ["nothing", "weight", "x"])
def test_a_step_runs_only_for_the_gradients_that_need_it(frozen):
    from torch_cudnn_handle.nn.linear import MATMUL_DW, MATMUL_DX, RELU_BACKWARD_ROWS

    layer = FusedLinear(32, 48, "relu", **BF16)
    layer.weight.requires_grad_(frozen != "weight")
    x = torch.empty(4, 32, requires_grad=frozen != "x", **BF16)
    y = layer(x)
    with _CountExecutes() as counted:
        y.float().sum().backward()
    expected = {"nothing": [RELU_BACKWARD_ROWS, MATMUL_DX, MATMUL_DW], "weight": [RELU_BACKWARD_ROWS, MATMUL_DX], "x": [RELU_BACKWARD_ROWS, MATMUL_DW]}
    assert counted.graphs == expected[frozen]
