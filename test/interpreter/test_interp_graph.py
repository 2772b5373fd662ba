"""The interpreter's contract beyond single nodes: output layouts as declared, pass-by-value
scalars, virtual tensors, inputs read through their declared strides, device-agnostic torch,
inference mode, the structural nodes, and refusals that name the node."""

import cudnn
import pytest
import torch

from support.interpreter import assert_close, describe, randn, run, same_layout
from torch_cudnn_handle.interpreter import interpret, interpret_ordered

CL = torch.channels_last


def test_an_output_gets_exactly_the_declared_dims_strides_and_dtype():
    x = randn(2, 3, 5, 7)
    nhwc = (3 * 5 * 7, 1, 7 * 3, 3)

    def builder(g, x):
        return [g.relu(x).set_stride(list(nhwc)).set_data_type(cudnn.data_type.HALF), g.exp(x)]

    graph, ins, outs, _ = describe(builder, [x])
    declared, undeclared = interpret_ordered(graph, ins, outs, [x])
    assert declared.stride() == nhwc and declared.dtype == torch.float16 and declared.is_contiguous(memory_format=CL)
    assert same_layout(undeclared, outs[1]) and undeclared.dtype == torch.float32
    assert torch.equal(declared, torch.relu(x).half())


def test_interpret_returns_every_non_virtual_output_by_uid_and_no_virtual_one():
    x = randn(2, 4, 8)

    def builder(g, x):
        hidden = g.exp(x, name="hidden")  # stays virtual
        return g.mul(hidden, x, name="product")

    graph, ins, outs, _ = describe(builder, [x])
    results = interpret(graph, {ins[0].uid: x})
    assert list(results) == [outs[0].uid]
    assert_close(results[outs[0].uid], torch.exp(x.double()).float() * x)


def test_pass_by_value_scalars_are_read_per_call():
    x = randn(2, 4, 8)
    graph, ins, outs, _ = describe(lambda g, x, s: g.mul(x, s), [x, torch.tensor(2.0)])
    assert ins[1].is_pass_by_value
    for value in (2.0, -0.5):
        (y,) = interpret_ordered(graph, ins, outs, [x, torch.tensor(value)])
        assert torch.equal(y, x * value)


def test_a_graph_owned_scalar_needs_no_input():
    x = randn(1, 2, 4, 8)  # 4-D: a tensor_scalar is [1, 1, 1, 1], and a pointwise output takes the larger rank
    (y,) = run(lambda g, x: g.add(x, g.tensor_scalar(0.1, cudnn.scalar_type.COMPILE_TIME_CONST)), [x])
    assert torch.equal(y, x + torch.tensor(0.1, dtype=torch.float32))


def _fine(shape=(1, 2, 4, 8)):
    """Values float16 cannot hold (1 + 2**-12 + small), so rounding them shows."""
    return torch.ones(shape) + 2 ** -12 + randn(*shape, seed=3) * 2 ** -14


def test_a_virtual_tensor_is_not_rounded_to_its_data_type_unless_asked():
    x = _fine()

    def builder(g, x):
        half = g.identity(x).set_data_type(cudnn.data_type.HALF)  # virtual, typed half
        return g.mul(half, g.tensor_scalar(3.0, cudnn.scalar_type.COMPILE_TIME_CONST))

    (kept,) = run(builder, [x])
    (rounded,) = run(builder, [x], round_virtual=True)
    assert torch.equal(kept, x * 3.0)
    assert torch.equal(rounded, x.half().float() * 3.0)
    assert not torch.equal(kept, rounded)


def test_a_node_reads_a_non_virtual_tensor_as_stored():
    x = _fine()

    def builder(g, x):
        y = g.identity(x).set_data_type(cudnn.data_type.HALF)
        z = g.mul(y, x)
        return [y, z]

    y, z = run(builder, [x])
    assert y.dtype == torch.float16
    assert torch.equal(z, y.float() * x)


def test_inputs_are_read_through_the_declared_strides_from_the_tensors_address():
    view = randn(2, 8, 6)[:, ::2, 1:5].transpose(1, 2)  # [2, 4, 4], strides (48, 1, 12), storage offset 1
    graph, ins, outs, _ = describe(lambda g, a: g.neg(a), [view])
    assert list(ins[0].stride) == [48, 1, 12] and view.storage_offset() == 1
    (y,) = interpret_ordered(graph, ins, outs, [view])
    assert torch.equal(y, -view)


def test_an_input_of_another_dtype_than_described_is_an_error():
    x = randn(2, 4, 8)
    graph, ins, outs, _ = describe(lambda g, x: g.neg(x), [x])
    with pytest.raises(ValueError, match="described as torch.float32 but the tensor given is torch.float16"):
        interpret_ordered(graph, ins, outs, [x.half()])


def test_a_missing_input_is_named():
    x = randn(2, 4, 8)
    graph, ins, outs, _ = describe(lambda g, x: g.neg(x), [x])
    with pytest.raises(ValueError, match=rf"no tensor given for input 'input0' \(uid {ins[0].uid}\)"):
        interpret(graph, {})


def test_the_same_torch_runs_on_another_device():
    """Meta tensors stand in for CUDA ones here: the walk is device-agnostic torch, and every
    output lands on the inputs' device with its declared layout."""
    x, w, b = (torch.empty(2, 8, 9, 9, device="meta").to(memory_format=CL), torch.empty(4, 8, 3, 3, device="meta"),
               torch.empty(1, 4, 1, 1, device="meta"))

    def builder(g, x, w, b):
        y = g.relu(g.bias(g.conv_fprop(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1]), b))
        return y.set_stride([4 * 81, 1, 36, 4]).set_data_type(cudnn.data_type.HALF)

    graph, ins, outs, _ = describe(builder, [x, w, b])
    (y,) = interpret_ordered(graph, ins, outs, [x, w, b])
    assert y.device.type == "meta" and same_layout(y, outs[0])


def test_it_runs_under_inference_mode():
    dy, x = randn(2, 4, 8, seed=1), randn(2, 4, 8, seed=2)
    with torch.inference_mode():
        (dx,) = run(lambda g, dy, x: g.gelu_backward(dy, x), [dy, x])
    leaf = x.double().requires_grad_()
    (expected,) = torch.autograd.grad(torch.nn.functional.gelu(leaf), leaf, dy.double())
    assert_close(dx, expected.float())


def test_outputs_carry_no_autograd_history():
    x = randn(2, 4, 8).requires_grad_()
    (y,) = run(lambda g, x: g.tanh(x), [x])
    assert not y.requires_grad and y.grad_fn is None
    assert torch.equal(y, torch.tanh(x.detach()))


def test_structural_nodes():
    x, other = randn(2, 3, 4, 5, seed=4), randn(2, 2, 4, 5, seed=5)

    def builder(g, x, other):
        return [
            g.transpose(x, permutation=[0, 2, 1, 3]),
            g.slice(x, slices=[slice(None), slice(1, 3), slice(0, 4, 2), slice(None)]),
            g.concatenate(inputs=[x, other], axis=1).set_dim([2, 5, 4, 5]),  # the frontend infers no concat dims
            g.reshape(x, reshape_mode=cudnn.reshape_mode.LOGICAL, out_dims=[2, 12, 5]),
            g.reshape(x, out_dims=[6, 4, 5]),  # VIEW_ONLY: the same row-major memory, other dims
        ]

    transposed, sliced, joined, logical, view = run(builder, [x, other])
    assert torch.equal(transposed, x.permute(0, 2, 1, 3))
    assert torch.equal(sliced, x[:, 1:3, 0:4:2])
    assert torch.equal(joined, torch.cat([x, other], 1))
    assert torch.equal(logical, x.reshape(2, 12, 5)) and torch.equal(view, x.reshape(6, 4, 5))


def test_a_node_type_without_a_handler_is_refused_by_name():
    """A lone block-scale dequantize is what the interpreter lacks, but cuDNN's validation
    (where a GPU lowers the description) refuses it alone: a valid description's node is
    given that type after validation, which is all the interpreter reads."""
    x = randn(1, 32, 64)
    graph, ins, outs, _ = describe(lambda g, x: g.exp(x, name="dq"), [x])
    graph.get_node("dq").node_type = type(graph.get_node("dq").node_type).BLOCK_SCALE_DEQUANTIZE
    with pytest.raises(NotImplementedError, match=r"node 'dq' \(BLOCK_SCALE_DEQUANTIZE\) attribute 'node type'"):
        interpret_ordered(graph, ins, outs, [x])


def test_an_unknown_attribute_on_a_known_node_is_refused_by_name():
    x = randn(2, 4, 8)

    def builder(g, x):
        y = g.reduction(x, mode=cudnn.reduction_mode.ADD, out_dims=[2, 1, 1], name="sum")
        g.get_node("sum").params["deterministic"] = True  # an attribute the reduction handler does not know
        return y

    with pytest.raises(NotImplementedError, match=r"node 'sum' \(REDUCTION\) attribute 'deterministic' = True"):
        run(builder, [x])
