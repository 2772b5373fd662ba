"""In-place outputs without a GPU: register_graph(..., in_place={output: input}) and
cudnn_fe.execute_ on meta and fake CUDA tensors.

* Registration refuses a malformed in_place; a call refuses an in-place output whose
  layout (shape, strides of dimensions of more than one element, dtype) is not its
  input's, a host scalar as a written input, a graph that declares no in-place write,
  and a written input that shares memory with another input; execute.out refuses an out
  that overlaps an input, pointing at execute_ where the graph declares that write.
* The schema declares the written inputs mutated (and only them); version counters of
  the written inputs bump, of the others do not.
* Autograd refuses a written leaf that requires grad (torch's reason), a written input or
  another input that requires grad (execute_ has no gradient), and runs under no_grad.
* torch.compile(fullgraph=True) traces execute_ with no graph break, and functionalization
  turns it into the functional execute plus a copy back into each written input (the
  upstream batchnorm graph's running statistics included); opcheck passes on meta tensors.
"""

import cudnn
import pytest
import torch
from torch._dynamo.testing import AotEagerAndRecordGraphs

import torch_cudnn_handle as tch
from support.upstream_graphs import BY_NAME


def accumulate(g, acc, x):
    return g.add(a=acc, b=x)


def accumulate_wide(g, acc, x):
    out = g.add(a=acc, b=x)
    out.set_data_type(cudnn.data_type.FLOAT)
    return out


def accumulate_row_major(g, acc, x):
    out = g.add(a=acc, b=x)
    out.set_dim(list(acc.dim)).set_stride([acc.dim[1] * acc.dim[2], acc.dim[2], 1])
    return out


def row_sums(g, acc, x):
    out = g.reduction(input=x, mode=cudnn.reduction_mode.ADD)
    out.set_dim([x.dim[0], x.dim[1], 1]).set_stride([x.dim[1], 1, 1])
    return out


def add_and_scale(g, acc, x, s):
    return g.add(a=acc, b=x), g.mul(a=x, b=s)


ACCUMULATE = tch.register_graph(accumulate, in_place={0: 0})
ACCUMULATE_WIDE = tch.register_graph(accumulate_wide, in_place={0: 0})
ACCUMULATE_ROW_MAJOR = tch.register_graph(accumulate_row_major, in_place={0: 0})
ROW_SUMS = tch.register_graph(row_sums, in_place={0: 0})
ADD_AND_SCALE = tch.register_graph(add_and_scale, in_place={0: 0})  # output 1 is returned
NOT_IN_PLACE = tch.register_graph(accumulate, name="accumulate_functional")
BATCHNORM = BY_NAME["batchnorm_relu_mask"]


def meta(*shape, dtype=torch.float32, **kwargs):
    return torch.randn(*shape, dtype=dtype).to("meta").requires_grad_(kwargs.get("requires_grad", False))


# ---------------------------------------------------------------------------------------
# Registration


@pytest.mark.parametrize(
    "in_place, error, message",
    [
        ([(0, 0)], TypeError, "in_place must be a dict"),
        ({0: "0"}, TypeError, "maps ints to ints"),
        ({True: 0}, TypeError, "maps ints to ints"),
        ({0: -1}, ValueError, "negative index"),
        ({0: 2}, ValueError, "the builder takes 2 inputs"),
        ({0: 1, 1: 1}, ValueError, "more than one output into input(s) [1]"),
    ],
)
def test_register_refuses_a_malformed_in_place(in_place, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        tch.register_graph(accumulate, in_place=in_place)


def test_register_refuses_in_place_with_packed_operands():
    def packed(g, q, offsets):
        return g.add(a=q, b=q)

    with pytest.raises(ValueError, match=r"in_place writes into the op's own input buffers.*ragged="):
        tch.register_graph(packed, in_place={0: 0}, ragged={0: tch.Ragged(offsets=1, max_seq_len=8)})


def test_the_record_holds_the_writes_sorted_by_input():
    graph = tch.register_graph(lambda g, a, b, c: [g.add(a=a, b=b), g.add(a=b, b=c)], in_place={0: 2, 1: 0})
    assert tch._C.in_place_writes(graph) == [(1, 0), (0, 2)]
    assert tch._C.in_place_writes(NOT_IN_PLACE) == []
    a, b, c = (meta(2, 2) for _ in range(3))
    others, written = tch._C.split_in_place(graph, [a, b, c])
    assert others[0] is b and written[0] is a and written[1] is c
    assert [t is u for t, u in zip(tch._C.merge_in_place(graph, others, written), [a, b, c])] == [True] * 3


# ---------------------------------------------------------------------------------------
# The schema and eager calls on meta tensors


def test_the_schema_declares_exactly_the_written_inputs_mutated():
    overload = torch.ops.cudnn_fe.execute_.default
    arguments = {a.name: a for a in overload._schema.arguments}
    assert arguments["written"].alias_info is not None and arguments["written"].alias_info.is_write
    assert arguments["inputs"].alias_info is None
    assert all(r.alias_info is None for r in overload._schema.returns)
    assert torch.Tag.needs_exact_strides in overload.tags and torch.Tag.pt2_compliant_tag in overload.tags


def test_execute_in_place_returns_the_other_outputs_and_bumps_only_written_versions():
    acc, x, s = meta(1, 4, 8), meta(1, 4, 8), meta(1, 4, 8)
    before = acc._version, x._version, s._version
    others = tch.execute_(ADD_AND_SCALE, [acc, x, s])
    assert [(o.shape, o.dtype) for o in others] == [(torch.Size([1, 4, 8]), torch.float32)]
    assert (acc._version, x._version, s._version) == (before[0] + 1, before[1], before[2])
    assert tch.execute_(ACCUMULATE, [acc, x]) == []
    assert acc._version == before[0] + 2
    # The raw op takes the two lists apart: the inputs it reads, the inputs it writes.
    assert len(torch.ops.cudnn_fe.execute_(ADD_AND_SCALE, [x, s], [acc])) == 1
    assert acc._version == before[0] + 3


def test_a_view_written_in_place_bumps_its_base():
    base = meta(1, 8, 8)
    view = base[:, :4]
    version = base._version
    tch.execute_(ACCUMULATE, [view, meta(1, 4, 8)])
    assert base._version == version + 1


def test_the_functional_execute_still_returns_every_output():
    acc, x = meta(1, 4, 8), meta(1, 4, 8)
    (out,) = tch.execute(ACCUMULATE, [acc, x])
    assert out.shape == acc.shape and acc._version == 0


def test_batchnorm_writes_its_running_statistics_in_place():
    inputs = BATCHNORM.make_inputs("meta")
    versions = [t._version for t in inputs]
    others = tch.execute_(BATCHNORM.graph_id, inputs)
    assert len(others) == 4  # y, saved mean, saved inverse variance, the relu mask
    assert [t._version - v for t, v in zip(inputs, versions)] == [0, 0, 0, 1, 1, 0, 0, 0]


# ---------------------------------------------------------------------------------------
# Refusals


def test_an_output_of_another_dtype_is_refused_with_the_fix():
    acc, x = meta(1, 4, 8, dtype=torch.float16), meta(1, 4, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"writes output 0 \(float32\[1, 4, 8\].*into input 0 \(float16\[1, 4, 8\].*shape, strides and dtype.*set_data_type"):
        tch.execute_(ACCUMULATE_WIDE, [acc, x])


def test_an_output_of_another_shape_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"writes output 0 \(float32\[1, 4, 1\].*into input 0 \(float32\[1, 4, 8\].*set_dim"):
        tch.execute_(ROW_SUMS, [meta(1, 4, 8), meta(1, 4, 8)])


def test_an_output_of_other_strides_is_refused_with_the_fix():
    acc = meta(1, 8, 4).transpose(1, 2)  # [1, 4, 8] stride [32, 1, 4]; the builder declares its output row-major
    with pytest.raises(ValueError, match=r"stride \[32, 8, 1\]\) in place into input 0 \(float32\[1, 4, 8\] stride \[32, 1, 4\]"):
        tch.execute_(ACCUMULATE_ROW_MAJOR, [acc, meta(1, 8, 4).transpose(1, 2)])


def test_strides_of_unit_dimensions_may_differ():
    # cuDNN strides batchnorm's [1, C, 1, 1] statistics [C, 1, C, C]; torch's are [C, 1, 1, 1].
    inputs = BATCHNORM.make_inputs("meta")
    assert inputs[3].stride() == (16, 1, 1, 1)
    tch.execute_(BATCHNORM.graph_id, inputs)


def test_a_host_scalar_cannot_be_written():
    graph = tch.register_graph(lambda g, x, s: [g.mul(a=x, b=s), g.mul(a=s, b=s)], name="scaled", in_place={1: 1})
    with pytest.raises(ValueError, match="host scalar"):
        tch.execute_(graph, [meta(1, 4, 8), torch.tensor(2.0)])


def test_a_graph_without_in_place_writes_is_refused():
    with pytest.raises(ValueError, match=r"writes none of its inputs in place.*in_place="):
        tch.execute_(NOT_IN_PLACE, [meta(1, 4, 8), meta(1, 4, 8)])
    with pytest.raises(ValueError, match=r"writes none of its inputs in place.*in_place="):
        torch.ops.cudnn_fe.execute_(NOT_IN_PLACE, [meta(1, 4, 8)], [meta(1, 4, 8)])


def test_the_raw_op_needs_one_written_tensor_per_write():
    with pytest.raises(ValueError, match="writes 1 of its inputs in place, got 2 written tensors"):
        torch.ops.cudnn_fe.execute_(ACCUMULATE, [], [meta(1, 4, 8), meta(1, 4, 8)])


def test_a_written_input_overlapping_another_input_is_refused():
    acc = meta(1, 4, 8)
    with pytest.raises(ValueError, match=r"input 0 .* writes in place \(output 0\), overlaps input 1"):
        tch.execute_(ACCUMULATE, [acc, acc])
    with pytest.raises(ValueError, match="overlaps input 1"):
        tch.execute_(ACCUMULATE, [acc[:, :, :4], acc[:, :, 2:6]])
    tch.execute_(ACCUMULATE, [acc[:, :2], acc[:, 2:]])  # same storage, disjoint memory: fine


def test_execute_out_refuses_an_out_overlapping_an_input():
    acc, x = meta(1, 4, 8), meta(1, 4, 8)
    with pytest.raises(ValueError, match=r"out\[0\] .* overlaps inputs\[0\].*in place \(in_place\): call torch_cudnn_handle.execute_"):
        tch.execute_out(ACCUMULATE, [acc, x], out=[acc])
    with pytest.raises(ValueError, match=r"out\[0\] .* overlaps inputs\[1\].*in_place=\{0: 1\}"):
        tch.execute_out(ACCUMULATE, [acc, x], out=[x])
    with pytest.raises(ValueError, match=r"overlaps inputs\[1\]"):
        torch.ops.cudnn_fe.execute.out(NOT_IN_PLACE, [acc, x], out=[x])
    tch.execute_out(ACCUMULATE, [acc, x], out=[meta(1, 4, 8)])


# ---------------------------------------------------------------------------------------
# Autograd


def test_a_written_leaf_that_requires_grad_is_refused():
    acc = meta(1, 4, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad.*in-place operation"):
        tch.execute_(ACCUMULATE, [acc, meta(1, 4, 8)])


def test_a_written_non_leaf_that_requires_grad_is_refused():
    acc = meta(1, 4, 8, requires_grad=True) * 2
    with pytest.raises(RuntimeError, match=r"input 0 \(written in place\) requires grad.*cudnn_fe.execute instead"):
        tch.execute_(ACCUMULATE, [acc, meta(1, 4, 8)])


def test_another_input_that_requires_grad_is_refused():
    """The message names the input by its index in the builder's order (input 1 here: x, beside
    the written total), not by its place among the inputs execute_ does not write."""
    with pytest.raises(RuntimeError, match=r"input 1 requires grad, and execute_ has no gradient"):
        tch.execute_(ACCUMULATE, [meta(1, 4, 8), meta(1, 4, 8, requires_grad=True)])
    into_second = tch.register_graph(lambda g, x, acc: g.add(a=acc, b=x), name="accumulate_into_input_1", in_place={0: 1})
    with pytest.raises(RuntimeError, match=r"input 0 requires grad, and execute_ has no gradient"):
        tch.execute_(into_second, [meta(1, 4, 8, requires_grad=True), meta(1, 4, 8)])
    with pytest.raises(RuntimeError, match=r"input 2 requires grad, and execute_ has no gradient"):
        tch.execute_(ADD_AND_SCALE, [meta(1, 4, 8), meta(1, 4, 8), torch.ones(1, 4, 8, device="meta", requires_grad=True)])


def test_no_grad_lets_it_run():
    acc, x = meta(1, 4, 8, requires_grad=True), meta(1, 4, 8, requires_grad=True)
    with torch.no_grad():
        tch.execute_(ACCUMULATE, [acc, x])
    assert acc._version == 1


# ---------------------------------------------------------------------------------------
# torch.compile and functionalization


def _written_back(graph_module) -> set:
    """(input position, output index) for each copy back in a functionalized graph: the
    functional execute's output ``index`` copied into the tensor it took at ``position``."""
    nodes = list(graph_module.graph.nodes)
    (call,) = [n for n in nodes if n.target is torch.ops.cudnn_fe.execute.default]
    arguments = list(call.args[1])
    pairs = set()
    for node in nodes:
        if node.target is torch.ops.aten.copy_.default:
            target, value = node.args
            assert value.args[0] is call, "a copy back of something other than the op's output"
            pairs.add((arguments.index(target), value.args[1]))
    return pairs


def test_compile_traces_it_without_a_graph_break_and_copies_back():
    torch._dynamo.reset()
    backend = AotEagerAndRecordGraphs()
    step = torch.compile(lambda acc, x, s: tch.execute_(ADD_AND_SCALE, [acc, x, s]), backend=backend, fullgraph=True)
    acc, x, s = meta(1, 4, 8), meta(1, 4, 8), meta(1, 4, 8)
    (scaled,) = step(acc, x, s)
    assert scaled.shape == (1, 4, 8)
    assert len(backend.graphs) == 1 and "torch.ops.cudnn_fe.execute_.default(" in backend.graphs[0].code
    forward = backend.fw_graphs[0].code
    assert forward.count("torch.ops.cudnn_fe.execute.default(") == 1  # functionalized: the functional op
    assert "execute_.default" not in forward
    assert _written_back(backend.fw_graphs[0]) == {(0, 0)}
    assert acc._version > 0 and x._version == 0


def test_compile_copies_batchnorm_running_statistics_back():
    # meta tensors (host scalars stay CPU tensors): a CPU torch cannot trace the copy back
    # into a fake CUDA tensor ("not linked with support for cuda devices").
    torch._dynamo.reset()
    inputs = BATCHNORM.make_inputs("meta")
    backend = AotEagerAndRecordGraphs()
    others = torch.compile(lambda *xs: tch.execute_(BATCHNORM.graph_id, list(xs)), backend=backend, fullgraph=True)(*inputs)
    assert [o.dtype for o in others] == [torch.float16, torch.float32, torch.float32, torch.bool]
    forward = backend.fw_graphs[0].code
    assert forward.count("torch.ops.cudnn_fe.execute.default(") == 1
    assert _written_back(backend.fw_graphs[0]) == {(3, 3), (4, 4)}


def test_compile_refuses_at_trace_time_what_a_call_refuses():
    torch._dynamo.reset()
    step = torch.compile(lambda acc, x: tch.execute_(ACCUMULATE_WIDE, [acc, x]), backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match="shape, strides and dtype"):
        step(meta(1, 4, 8, dtype=torch.float16), meta(1, 4, 8, dtype=torch.float16))


def test_functionalize_rewrites_it_into_the_functional_op_and_a_copy():
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(acc, x):
        tch.execute_(ACCUMULATE, [acc, x])
        return acc

    traced = make_fx(torch.func.functionalize(step, remove="mutations_and_views"))(meta(1, 4, 8), meta(1, 4, 8))
    code = traced.code
    assert "cudnn_fe.execute.default" in code and "execute_" not in code and "copy_" in code


def test_compile_with_dynamic_shapes():
    torch._dynamo.reset()
    backend = AotEagerAndRecordGraphs()
    step = torch.compile(lambda acc, x, s: tch.execute_(ADD_AND_SCALE, [acc, x, s]), backend=backend, fullgraph=True, dynamic=True)
    for rows in (4, 6):
        (scaled,) = step(meta(1, rows, 8), meta(1, rows, 8), meta(1, rows, 8))
        assert scaled.shape == (1, rows, 8)
    assert len(backend.graphs) == 1


def test_opcheck_on_meta_tensors():
    acc, x, s = meta(1, 4, 8), meta(1, 4, 8), meta(1, 4, 8)
    torch.library.opcheck(torch.ops.cudnn_fe.execute_.default, (ADD_AND_SCALE, [x, s], [acc]))
