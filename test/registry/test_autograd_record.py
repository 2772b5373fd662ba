"""The autograd contract on the CPU (meta tensors: the op's fake kernel runs the graphs'
descriptions): a node saves only what its graph's backward reads, outputs the backward
takes no gradient of are non-differentiable, an in-place op on an unread output is
allowed, and the op is seen by TorchFunctionMode and __torch_function__ subclasses."""

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import torch_cudnn_handle as tch
from torch_cudnn_handle import BackwardOperand as Op
from torch_cudnn_handle.nn import FusedLinear, RMSNorm
from torch_cudnn_handle.nn.attention import SDPA_GRAPHS


def saved_shapes(run):
    """The shapes of every tensor autograd saves while ``run()`` records its graph."""
    saved = []

    def pack(tensor):
        saved.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = run()
    return saved, result


def test_rmsnorm_saves_its_input_scale_and_statistics_not_its_output():
    norm = RMSNorm(64, device="meta", dtype=torch.bfloat16)
    x = torch.empty(8, 16, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
    saved, y = saved_shapes(lambda: norm(x))
    assert sorted(saved) == sorted([(8, 16, 64), (64,), (8, 16, 1)])  # x, scale, inv_var (natural shapes): no y


def test_an_in_place_op_on_an_output_the_backward_does_not_read_is_allowed():
    norm = RMSNorm(64, device="meta", dtype=torch.bfloat16)
    x = torch.empty(4, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
    y = norm(x)
    F.relu_(y)
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


def test_sdpa_statistics_are_not_differentiable_and_the_output_is():
    q, k, v = (torch.empty(1, 2, 128, 64, device="meta", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    o, stats = tch.execute(SDPA_GRAPHS[True], [q, k, v])
    assert o.requires_grad and not stats.requires_grad  # as torch marks its logsumexp
    (o.sum() + stats.sum()).backward()
    assert all(t.grad is not None for t in (q, k, v))


@pytest.mark.parametrize("needs", ["x", "weight", "both"])
def test_fused_linear_saves_x_only_for_dw_and_nothing_for_frozen_weights(needs):
    linear = FusedLinear(32, 16, activation="relu", device="meta", dtype=torch.bfloat16)
    linear.weight.requires_grad_(needs != "x")
    linear.bias.requires_grad_(needs != "x")
    x = torch.empty(4, 32, device="meta", dtype=torch.bfloat16, requires_grad=needs != "weight")
    saved, y = saved_shapes(lambda: linear(x))
    expected = [(4, 16)]  # relu's output, always
    if needs != "x":
        expected.append((4, 32))  # x, for dW
    if needs != "weight":
        expected.append((16, 32))  # W (the parameter itself: the graph views it), for dX
    assert sorted(saved) == sorted(expected)
    y.sum().backward()
    assert (x.grad is not None) == (needs != "weight")
    assert (linear.weight.grad is not None) == (needs != "x")


def two_outputs(graph, x):
    return [graph.relu(x, name="a"), graph.sigmoid(x, name="b")]


def test_differentiable_outputs_follow_the_declaration():
    def backward_fn(grads, inputs, outputs):
        assert grads[1] is None and outputs == [None, None]  # reads nothing, output 1 not differentiable
        return [grads[0]]

    gid = tch.register_graph(
        two_outputs, name="first_only",
        backward=tch.Backward.function(backward_fn, reads=[], materialize_grads=False, differentiable_outputs=[0]),
    )
    x = torch.empty(1, 2, 8, device="meta", requires_grad=True)
    a, b = tch.execute(gid, [x])
    assert a.requires_grad and not b.requires_grad
    (a.sum() + b.sum()).backward()
    assert x.grad is not None


def test_registration_refuses_a_differentiable_output_whose_gradient_would_be_dropped():
    with pytest.raises(ValueError, match=r"differentiable_outputs names output\(s\) \[1\], but backward_operands takes no gradient"):
        tch.register_graph(
            two_outputs, name="drops",
            backward=tch.Backward.graph(lambda g, dy, x: [g.relu_backward(dy, x)], operands=[Op.grad(0), Op.input(0)], differentiable_outputs=[0, 1]),
        )
    with pytest.raises(ValueError, match="gradients are always given"):
        tch.register_graph(
            two_outputs, name="reads_grad", backward=tch.Backward.function(lambda g, i, o: [None], reads=[Op.grad(0)]),
        )
    with pytest.raises(ValueError, match=r"BackwardOperand.input\(0, for_grads=\[3\]\), but the builder takes 1 inputs"):
        tch.register_graph(
            two_outputs, name="for_missing",
            backward=tch.Backward.function(lambda g, i, o: [None], reads=[Op.input(0, for_grads=[3])]),
        )
    with pytest.raises(TypeError, match="need a backward"):
        tch.register_graph(two_outputs, name="no_backward", differentiable_outputs=[0])


class Recording(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_a_torch_function_mode_sees_the_op_from_every_entry_point():
    norm = RMSNorm(64, device="meta", dtype=torch.bfloat16)
    x = torch.empty(4, 64, device="meta", dtype=torch.bfloat16)
    with Recording() as mode:
        norm(x)
        tch.execute(SDPA_GRAPHS[False], [torch.empty(1, 1, 64, 64, device="meta", dtype=torch.bfloat16)] * 3)
        out = torch.empty(1, 1, 64, 64, device="meta", dtype=torch.bfloat16)
        tch.execute_out(SDPA_GRAPHS[False], [torch.empty(1, 1, 64, 64, device="meta", dtype=torch.bfloat16)] * 3,
                        out=[out, torch.empty(1, 1, 64, 1, device="meta")])
    assert mode.seen.count("execute.default") == 2 and mode.seen.count("execute.out") == 1


class Logged(torch.Tensor):
    calls = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs)


def test_a_torch_function_subclass_sees_the_eager_entry():
    Logged.calls.clear()
    q = torch.empty(1, 1, 64, 64, device="meta", dtype=torch.bfloat16).as_subclass(Logged)
    tch.execute(SDPA_GRAPHS[False], [q, q, q])
    assert "execute.default" in Logged.calls
