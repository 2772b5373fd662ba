"""Size buckets (registry/buckets.py) without a GPU: the bucket ladder, what a registration
refuses, and bucketed calls on the CPU kernel (the torch interpreter), padded and narrowed
exactly as a CUDA call is, against the same graph unbucketed; the padding check refusing
graphs that read across the padded dim, forward or backward."""

import cudnn
import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import torch_cudnn_handle as tch
from torch_cudnn_handle.op.bucket_check import CHECK_BUCKET, CHECK_SIZE
from support.graphs import linear_relu, linear_relu_backward, relu

ROWS = tch.Buckets(inputs={0: 1}, outputs={0: 1})  # [batch, M, K] inputs: M takes any size


def linear_inputs(m, requires_grad=False, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x, w, b = (torch.randn(*shape, generator=generator) for shape in ((2, m, 32), (2, 32, 8), (2, 1, 8)))
    return [t.requires_grad_(requires_grad) for t in (x, w, b)]


EXACT = tch.register_graph(linear_relu, name="linear_relu_exact", backward=tch.Backward.function(linear_relu_backward))
BUCKETED = tch.register_graph(linear_relu, name="linear_relu_rows", backward=tch.Backward.function(linear_relu_backward), buckets=ROWS)


@pytest.mark.parametrize("minimum, per_doubling", [(64, 4), (16, 8), (1, 1), (100, 3)])
def test_the_ladder_bounds_padding(minimum, per_doubling):
    buckets = tch.Buckets({0: 0}, minimum=minimum, per_doubling=per_doubling)
    previous = 0
    for size in range(1, 5000):
        bucket = buckets.size_for(size)
        assert bucket >= size and bucket >= previous
        if size > minimum:
            assert (bucket - size) / bucket < 1 / per_doubling + 1 / size  # the waste bound, up to rounding a step up
        previous = bucket
    assert buckets.size_for(1) == minimum
    sizes = {buckets.size_for(n) for n in range(1, 4097)}
    assert len(sizes) <= per_doubling * 13 + 1  # a few sizes per doubling, not one per size


@pytest.mark.parametrize(
    "make, error, words",
    [
        (lambda: tch.Buckets({}), ValueError, "names no input"),
        (lambda: tch.Buckets({0: "rows"}), TypeError, "indices (ints >= 0) to dims"),
        (lambda: tch.Buckets([0]), TypeError, "inputs must map input indices"),
        (lambda: tch.Buckets({0: 0}, outputs={-1: 0}), TypeError, "outputs must map"),
        (lambda: tch.Buckets({0: 0}, minimum=0), ValueError, "minimum must be an int >= 1"),
        (lambda: tch.Buckets({0: 0}, per_doubling=2.5), ValueError, "per_doubling"),
        (lambda: tch.register_graph(relu, buckets={0: 0}), TypeError, "buckets must be a Buckets"),
        (lambda: tch.register_graph(relu, buckets=tch.Buckets({1: 0})), ValueError, "names input 1, but the builder takes 1"),
        (lambda: tch.register_graph(relu, buckets=ROWS, in_place={0: 0}), ValueError, "cannot be combined with in_place="),
        (lambda: tch.register_graph(relu, buckets=ROWS, ragged={0: tch.Ragged(0, 64)}), ValueError, "cannot be combined with ragged="),
        (lambda: tch.register_graph(relu, buckets=ROWS, views=tch.OperandViews(inputs=(None,))), ValueError, "with views="),
    ],
)
def test_a_registration_is_checked(make, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        make()


@pytest.mark.parametrize("m", [1, 5, 64, 65, 81, 200])
def test_a_bucketed_call_equals_the_exact_graph_forward_and_backward(m):
    inputs = linear_inputs(m, requires_grad=True)
    twins = [t.detach().clone().requires_grad_(True) for t in inputs]
    (y,) = tch.execute(BUCKETED, inputs)
    (want,) = tch.execute(EXACT, twins)
    assert y.shape == want.shape == (2, m, 8)
    if m != ROWS.size_for(m):
        assert y._base is not None and y._base.shape[1] == ROWS.size_for(m)  # a view of the bucket's output
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    grad = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    y.backward(grad)
    want.backward(grad)
    for got, expected in zip(inputs, twins):
        torch.testing.assert_close(got.grad, expected.grad, rtol=1e-4, atol=1e-4)


def test_the_op_called_directly_runs_the_exact_size():
    (y,) = torch.ops.cudnn_fe.execute(BUCKETED, linear_inputs(37))
    assert y.shape == (2, 37, 8) and y._base is None


def test_execute_out_writes_the_narrowed_outputs():
    inputs = linear_inputs(37)
    out = [torch.full((2, 37, 8), float("nan"))]
    tch.execute_out(BUCKETED, inputs, out=out)
    torch.testing.assert_close(out[0], tch.execute(EXACT, inputs)[0])
    with pytest.raises(ValueError, match=r"returns outputs of shapes \[\[2, 37, 8\]\], but out has \[\[2, 40, 8\]\]"):
        tch.execute_out(BUCKETED, inputs, out=[torch.empty(2, 40, 8)])


def test_bucketed_inputs_must_agree_on_the_size():
    both = tch.register_graph(linear_relu, name="linear_relu_x_and_b_rows", buckets=tch.Buckets({0: 1, 2: 1}, outputs={0: 1}))
    x, w, b = linear_inputs(37)
    with pytest.raises(ValueError, match="their sizes differ"):
        tch.execute(both, [x, w, b])
    with pytest.raises(ValueError, match="dim 5 of input 0, which has no such dim"):
        tch.execute(tch.register_graph(relu, name="relu_dim5", buckets=tch.Buckets({0: 5})), [x])


def exp_row_sum(graph, x):
    """A sum over the bucketed rows of exp(x): exp(0) = 1, so padded rows add to it."""
    total = graph.reduction(graph.exp(x), mode=cudnn.reduction_mode.ADD)
    total.set_dim([x.dim[0], 1, x.dim[2]]).set_stride([x.dim[2], x.dim[2], 1])
    return total


def row_sum(graph, x):
    total = graph.reduction(x, mode=cudnn.reduction_mode.ADD)
    total.set_dim([x.dim[0], 1, x.dim[2]]).set_stride([x.dim[2], x.dim[2], 1])
    return total


def test_a_reduction_zero_padding_leaves_alone_is_served():
    graph = tch.register_graph(row_sum, name="row_sum", buckets=tch.Buckets({0: 1}))
    x = torch.randn(2, 37, 8)
    torch.testing.assert_close(tch.execute(graph, [x])[0], x.sum(1, keepdim=True), rtol=1e-5, atol=1e-5)


def test_a_matmuls_inner_dim_padded_in_both_operands_is_served():
    def matmul(graph, a, b):
        return graph.matmul(a, b)

    graph = tch.register_graph(matmul, name="matmul_any_k", buckets=tch.Buckets({0: 2, 1: 1}))  # K: a's dim 2, b's dim 1
    a, b = torch.randn(2, 16, 37), torch.randn(2, 37, 8)
    torch.testing.assert_close(tch.execute(graph, [a, b])[0], a @ b, rtol=1e-5, atol=1e-5)


def test_a_graph_padding_changes_is_refused_naming_the_output():
    graph = tch.register_graph(exp_row_sum, name="exp_row_sum", buckets=tch.Buckets({0: 1}))
    x = torch.randn(2, 37, 8)
    with pytest.raises(ValueError, match="graph 'exp_row_sum' cannot be bucketed: output 0 changes when the bucketed dims are zero-padded"):
        tch.execute(graph, [x])
    with pytest.raises(ValueError, match="cannot be bucketed"):  # refused again, never served wrong
        tch.execute(graph, [x])
    assert tch.execute(tch.register_graph(exp_row_sum, name="exp_row_sum_exact"), [x])[0].shape == (2, 1, 8)  # unbucketed: fine


def test_an_output_that_follows_the_dim_must_be_named():
    graph = tch.register_graph(relu, name="relu_rows_unnamed", buckets=tch.Buckets({0: 1}))
    with pytest.raises(ValueError, match=rf"output 0 has shape \[2, {CHECK_BUCKET}, 8\] padded against \[2, {CHECK_SIZE}, 8\]"):
        tch.execute(graph, [torch.randn(2, 37, 8)])


def test_a_gradient_padding_changes_is_refused():
    def mean_scaled_backward(grads, inputs, outputs):  # reads a mean over the rows: padded zeros move it
        return [grads[0] * outputs[0].mean(dim=1, keepdim=True)]

    graph = tch.register_graph(relu, name="relu_mean_grad", buckets=tch.Buckets({0: 1}, outputs={0: 1}),
                               backward=tch.Backward.function(mean_scaled_backward))
    with pytest.raises(ValueError, match="the gradient of input 0 changes"):
        tch.execute(graph, [torch.randn(2, 37, 8)])


def test_an_input_left_out_of_the_buckets_is_named_in_the_error():
    def rows_times(graph, x, y):  # y has the varying dim too, and is not bucketed
        return graph.mul(x, y)

    graph = tch.register_graph(rows_times, name="rows_times", buckets=tch.Buckets({0: 1}, outputs={0: 1}))
    with pytest.raises(ValueError, match=r"Name in Buckets\(inputs=\) every input whose dim takes the varying size"):
        tch.execute(graph, [torch.randn(2, 37, 8), torch.randn(2, 37, 8)])


def test_the_check_runs_once_per_layout_of_the_other_dims():
    from torch_cudnn_handle.op import bucket_check

    graph = tch.register_graph(relu, name="relu_rows_once", buckets=ROWS)
    before = bucket_check._checked.cache_info().misses
    for m in (3, 40, 70, 300):
        tch.execute(graph, [torch.randn(2, m, 8)])
    assert bucket_check._checked.cache_info().misses == before + 1
    tch.execute(graph, [torch.randn(2, 5, 16)])  # another width: checked again
    assert bucket_check._checked.cache_info().misses == before + 2


@pytest.mark.usefixtures("fresh_dynamo")
def test_torch_compile_makes_a_frame_per_bucket_not_per_size():
    counter = CompileCounterWithBackend("aot_eager")

    @torch.compile(backend=counter, fullgraph=True, dynamic=True)
    def layer(x, w, b):
        return tch.execute(BUCKETED, [x, w, b])[0] * 2

    _, w, b = linear_inputs(1)
    for m in (65, 70, 77, 79):  # one bucket (80)
        x = linear_inputs(m)[0]
        torch.testing.assert_close(layer(x, w, b), 2 * tch.execute(EXACT, [x, w, b])[0], rtol=1e-5, atol=1e-5)
    assert counter.frame_count == 1
    layer(linear_inputs(90)[0], w, b)  # the next bucket (96)
    assert counter.frame_count == 2
    layer(linear_inputs(80)[0], w, b)  # a size equal to its bucket: the narrowed output is contiguous, a frame of its own
    assert counter.frame_count == 3
