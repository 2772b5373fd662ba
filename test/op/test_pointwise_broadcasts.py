"""Note [Pointwise broadcasts] without a GPU: which graphs and inputs the rule picks, what
the description becomes, and the results through the CPU kernel (which reads the
description, so it materializes as the CUDA path does). test_pointwise_broadcasts_gpu.py
measures the patterns on the GPU."""

import pytest
import torch

import torch_cudnn_handle as tch
from torch_cudnn_handle import registry
from torch_cudnn_handle.registry import OperandViews, TensorSpec
from torch_cudnn_handle.registry.broadcasts import materialize, materialized_specs


def fma(graph, x, s, y):
    return graph.add(graph.mul(x, s, name="mul"), y, name="add")


FMA = tch.register_graph(fma, name="fma")


def _specs(*tensors):
    return [TensorSpec.of(t) for t in tensors]


def _plan(graph_id, *tensors):
    return registry.layout(graph_id, _specs(*tensors)).materialized


def _halves(*shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen).half() for shape in shapes]


def test_the_measured_case_is_described_at_full_shape_and_right_through_the_op():
    x, s, y = _halves((4, 64, 96), (1, 1, 96), (4, 64, 96))
    assert _plan(FMA, x, s, y) == ((1, (4, 64, 96)),)
    graph, inputs, _, layout = registry.description(FMA, _specs(x, s, y))
    assert (list(inputs[1].dim), list(inputs[1].stride)) == ([4, 64, 96], [6144, 96, 1])  # what cuDNN reads: full shape
    assert layout.outputs[0].shape == (4, 64, 96)
    (out,) = tch.execute(FMA, [x, s, y])
    torch.testing.assert_close(out.float(), x.float() * s.float() + y.float(), atol=4e-3, rtol=2e-3)


def test_at_full_shape_nothing_is_materialized():
    x, s, y = _halves((4, 64, 96), (4, 64, 96), (4, 64, 96))
    assert _plan(FMA, x, s, y) == ()


@pytest.mark.parametrize(
    "s_shape, y_shape, expected",
    [
        ((1, 64, 96), (4, 64, 96), ((1, (4, 64, 96)),)),
        ((4, 1, 96), (4, 64, 1), ((1, (4, 64, 96)), (2, (4, 64, 96)))),
    ],
    ids=["one_dim", "two_inputs"],
)
def test_every_broadcasting_input_is_materialized_at_its_nodes_output_shape(s_shape, y_shape, expected):
    x, s, y = _halves((4, 64, 96), s_shape, y_shape)
    assert _plan(FMA, x, s, y) == expected
    (out,) = tch.execute(FMA, [x, s, y])
    torch.testing.assert_close(out.float(), x.float() * s.float() + y.float(), atol=4e-3, rtol=2e-3)


def test_a_one_element_device_tensor_is_materialized_and_a_host_scalar_is_not():
    x, y = _halves((4, 64, 96), (4, 64, 96))
    device_scalar = TensorSpec((1, 1, 1), (1, 1, 1), torch.float16)  # a CUDA [1, 1, 1] tensor's spec
    assert registry.layout(FMA, [TensorSpec.of(x), device_scalar, TensorSpec.of(y)]).materialized == ((1, (4, 64, 96)),)
    host = torch.tensor([[[0.5]]], dtype=torch.float16)  # on the CPU, one element: passed by value
    assert _plan(FMA, x, host, y) == ()
    (out,) = tch.execute(FMA, [x, host, y])
    torch.testing.assert_close(out.float(), x.float() * 0.5 + y.float(), atol=4e-3, rtol=2e-3)


def four_d(graph, a, b):
    return graph.sub(graph.relu(a, name="relu"), b, name="sub")


def test_four_d_and_an_input_broadcast_by_a_later_node():
    a, b = _halves((2, 3, 8, 16), (2, 1, 8, 1))
    graph_id = tch.register_graph(four_d)
    assert _plan(graph_id, a, b) == ((1, (2, 3, 8, 16)),)
    (out,) = tch.execute(graph_id, [a, b])
    torch.testing.assert_close(out.float(), torch.relu(a.float()) - b.float(), atol=4e-3, rtol=2e-3)


def scale_host(graph, x, scale):
    return graph.mul(x, scale, name="mul")


def test_a_host_scalar_is_passed_by_value_not_materialized():
    x = torch.randn(2, 4, 8)
    graph_id = tch.register_graph(scale_host)
    assert _plan(graph_id, x, torch.tensor(3.0)) == ()
    torch.testing.assert_close(tch.execute(graph_id, [x, torch.tensor(3.0)])[0], x * 3)


def two_uses(graph, s, t, x):
    small = graph.mul(s, t, name="small")  # [1, 1, 96]: s does not broadcast here ...
    return [graph.add(graph.mul(x, s, name="big"), x, name="add"), small]  # ... but does here


def test_an_input_read_at_two_output_shapes_is_refused_with_the_fix():
    s, t, x = _halves((1, 1, 96), (1, 1, 96), (4, 8, 96))
    graph_id = tch.register_graph(two_uses)
    # materializing s would change the small output's shape, and cuDNN would broadcast it into "big" itself
    with pytest.raises(ValueError, match=r"input 0 of shape \[1, 1, 96\] broadcasts into node 'big'.*Expand the operand to \[4, 8, 96\]"):
        tch.execute(graph_id, [s, t, x])
    expanded = tch.register_graph(lambda g, s_full, s, t, x: [g.add(g.mul(x, s_full, name="big"), x, name="add"), g.mul(s, t, name="small")],
                                  name="two_uses_expanded")
    big, small = tch.execute(expanded, [s.expand(4, 8, 96).contiguous(), s, t, x])  # the fix the message names
    torch.testing.assert_close(big.float(), x.float() * s.float() + x.float(), atol=4e-3, rtol=2e-3)
    assert small.shape == (1, 1, 96)


def virtual_broadcast(graph, a, b, x):
    return graph.add(graph.mul(a, b, name="ab"), x, name="add")  # a*b is a [1, 1, 96] virtual broadcast into add


def test_a_virtual_intermediate_that_broadcasts_puts_every_input_at_the_outputs_shape():
    a, b, x = _halves((1, 1, 96), (1, 1, 96), (4, 8, 96))
    graph_id = tch.register_graph(virtual_broadcast)
    assert _plan(graph_id, a, b, x) == ((0, (4, 8, 96)), (1, (4, 8, 96)))
    graph, _, _, _ = registry.description(graph_id, _specs(a, b, x))
    assert {tuple(t.dim) for node in graph.nodes for t in [*node.inputs.values(), *node.outputs.values()] if t is not None} == {(4, 8, 96)}
    (out,) = tch.execute(graph_id, [a, b, x])
    torch.testing.assert_close(out.float(), a.float() * b.float() + x.float(), atol=4e-3, rtol=2e-3)


def test_a_virtual_broadcast_into_outputs_of_two_shapes_is_refused():
    def two_outputs(graph, a, b, x):
        ab = graph.mul(a, b, name="ab")
        ab.set_output(True)
        return [graph.add(ab, x, name="add"), ab]

    a, b, x = _halves((1, 1, 96), (1, 1, 96), (4, 8, 96))
    with pytest.raises(ValueError, match=r"an intermediate of shape \[1, 1, 96\] broadcasts into node 'add'|input 0"):
        tch.execute(tch.register_graph(two_outputs), [a, b, x])


def bias_after_matmul(graph, x, w, b):
    return graph.add(graph.matmul(x, w, name="mm"), b, name="bias")


@pytest.mark.parametrize("node", ["matmul", "reduction"])
def test_a_graph_with_any_other_node_is_left_as_written(node):
    if node == "matmul":  # the epilogue broadcast, measured right
        graph_id = tch.register_graph(bias_after_matmul)
        tensors = _halves((1, 8, 16), (1, 16, 32), (1, 1, 32))
    else:
        def reduce_then_scale(graph, x, s):
            total = graph.reduction(x, mode=__import__("cudnn").reduction_mode.ADD, name="sum")
            return graph.mul(total.set_dim([4, 1, 96]).set_stride([96, 96, 1]), s, name="mul")

        graph_id = tch.register_graph(reduce_then_scale)
        tensors = [torch.randn(4, 8, 96), torch.randn(1, 1, 96)]
    assert _plan(graph_id, *tensors) == ()


def test_a_graph_with_natural_operands_is_left_as_written():
    views = OperandViews(inputs=(None, lambda t: t.view(1, 1, -1), None))
    graph_id = tch.register_graph(fma, name="fma_views", views=views)
    x, s, y = torch.randn(4, 8, 96), torch.randn(96), torch.randn(4, 8, 96)
    assert _plan(graph_id, x, s, y) == ()
    torch.testing.assert_close(tch.execute(graph_id, [x, s, y])[0], x * s + y, atol=1e-5, rtol=1e-5)


def test_materialize_expands_to_a_contiguous_copy_and_keeps_the_rest():
    x, s = torch.randn(4, 8, 96), torch.randn(96).view(1, 1, 96)
    plan = ((1, (4, 8, 96)),)
    out = materialize([x, s], plan)
    assert out[0] is x and out[1].is_contiguous() and out[1].shape == (4, 8, 96) and torch.equal(out[1], s.expand(4, 8, 96))
    assert materialize([x, s], ()) == [x, s] or materialize([x, s], ())[1] is s
    assert materialized_specs(_specs(x, s), plan)[1] == TensorSpec((4, 8, 96), (768, 96, 1), torch.float32)


def test_autograd_through_a_materialized_graph():
    def fma_backward(grads, inputs, outputs):
        (dy,), (x, s, _y) = grads, inputs
        return [dy * s, (dy * x).sum_to_size(s.shape), dy]

    graph_id = tch.register_graph(fma, name="fma_grad", backward=tch.Backward.function(fma_backward))
    x, s, y = (torch.randn(*shape, requires_grad=True) for shape in ((2, 4, 8), (1, 1, 8), (2, 4, 8)))
    (out,) = tch.execute(graph_id, [x, s, y])
    out.sum().backward()
    torch.testing.assert_close(s.grad, x.detach().sum((0, 1), keepdim=True))


def test_autograd_through_a_virtual_broadcast_put_at_full_shape():
    def backward(grads, inputs, outputs):
        (dy,), (a, b, _x) = grads, inputs
        return [(dy * b).sum_to_size(a.shape), (dy * a).sum_to_size(b.shape), dy]

    graph_id = tch.register_graph(virtual_broadcast, name="virtual_broadcast_grad", backward=tch.Backward.function(backward))
    a, b, x = (torch.randn(*shape, requires_grad=True) for shape in ((1, 1, 8), (1, 1, 8), (2, 4, 8)))
    (out,) = tch.execute(graph_id, [a, b, x])
    torch.testing.assert_close(out, a * b + x)
    out.sum().backward()
    assert a.grad.shape == (1, 1, 8)
    torch.testing.assert_close(a.grad, (b.detach() * 8).expand(1, 1, 8))
    torch.testing.assert_close(x.grad, torch.ones(2, 4, 8))
