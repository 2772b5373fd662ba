"""Host scalars, data types and undeclared output layouts, without a GPU.

What a call's graph looks like is described from its builder (registry/describe.py)
with no GPU, so everything here is checked on descriptions and on traces with fake
CUDA tensors: host scalars are pass-by-value operands and trace beside fake CUDA
tensors; fp8, integer and author-chosen types reach the description; an output the
builder only marks is described in the layout cuDNN writes (NHWC for an NHWC
convolution); bad input is refused with the fix. test_graph_inputs_gpu.py runs the
same graphs on a GPU against the frontend's own execution.
"""


import cudnn
import pytest
import torch
from torch._dynamo.testing import AotEagerAndRecordGraphs, CompileCounterWithBackend
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_cudnn_handle as tch
from support.graph_inputs import CONV, FP8_MATMUL, INT8_CONV, RELU_TO_HALF, RMSNORM, nhwc, nhwc_strides, rmsnorm_with_epsilon
from torch_cudnn_handle import registry
from torch_cudnn_handle.registry import TensorSpec
from torch_cudnn_handle.registry.describe import describe as describe_definition
from torch_cudnn_handle.registry.output_strides import dense_strides, stride_order_of
from torch_cudnn_handle.registry.specs import TORCH_DTYPES, cudnn_data_type_of

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def spec(shape, dtype, *, stride=None, host=False):
    stride = stride or torch.empty(shape, device="meta").stride()
    return TensorSpec(tuple(shape), tuple(stride), dtype, host)


def describe(graph_id, specs):
    return describe_definition(registry.definition(graph_id), specs)


def rmsnorm_specs():
    return [spec((4, 64, 1, 1), torch.float16), spec((1, 64, 1, 1), torch.float32), spec((), torch.float32, host=True)]


# -- host scalars ------------------------------------------------------------------


def test_a_host_scalar_is_a_pass_by_value_operand_and_never_chooses_the_io_type():
    graph, inputs, _, layout = describe(RMSNORM, rmsnorm_specs())
    assert [t.is_pass_by_value for t in inputs] == [False, False, True]
    assert list(inputs[2].dim) == [1, 1, 1, 1]  # a 0-dim scalar takes the device input's rank
    assert layout.outputs == (spec((4, 64, 1, 1), torch.float16),)  # io: the fp16 input's, not the fp32 scalar's


def test_a_one_element_cpu_tensor_is_a_host_scalar_and_a_cuda_one_is_not():
    assert TensorSpec.of(torch.tensor(1e-5)).host and TensorSpec.of(torch.full((1, 1, 1, 1), 0.5)).host
    assert not TensorSpec.of(torch.zeros(2)).host
    assert not TensorSpec.of(torch.tensor(1.0, device="meta")).host
    assert "on the host (pass-by-value)" in TensorSpec.of(torch.tensor(1.0)).describe()


def rmsnorm_call(x, scale, epsilon):
    return torch.ops.cudnn_fe.execute(RMSNORM, [x, scale, epsilon])[0]


def test_compile_traces_a_cpu_scalar_beside_fake_cuda_tensors():
    with FakeTensorMode():
        x = torch.empty(4, 64, 1, 1, dtype=torch.float16, device="cuda")
        scale = torch.empty(1, 64, 1, 1, dtype=torch.float32, device="cuda")
        epsilon = torch.tensor(1e-5)
    backend = AotEagerAndRecordGraphs()
    y = torch.compile(rmsnorm_call, backend=backend, fullgraph=True)(x, scale, epsilon)
    assert (y.device.type, y.shape, y.dtype) == ("cuda", x.shape, torch.float16)
    (graph,) = backend.fw_graphs
    code = graph.print_readable(print_output=False)
    assert code.count("torch.ops.cudnn_fe.execute.default") == 1
    assert '"f32[]"' in code  # the scalar is a graph input, not a constant baked into the trace


def test_another_scalar_value_is_neither_another_trace_nor_another_description():
    descriptions = []

    def counted_rmsnorm(graph, x, scale, epsilon):
        descriptions.append(epsilon.is_pass_by_value)
        return rmsnorm_with_epsilon(graph, x, scale, epsilon)

    graph_id = tch.register_graph(counted_rmsnorm)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(lambda *inputs: torch.ops.cudnn_fe.execute(graph_id, list(inputs))[0], backend=counter, fullgraph=True)
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(4, 64, 1, 1, dtype=torch.float16, device="cuda")
        scale = torch.empty(1, 64, 1, 1, dtype=torch.float32, device="cuda")
    for value in (1e-5, 1e-3):
        compiled(x, scale, torch.tensor(value))
    assert counter.frame_count == 1  # the value is not guarded on
    assert descriptions == [True]  # one description, the scalar passed by value


def test_a_cpu_tensor_that_is_not_a_scalar_is_refused_naming_it_and_the_rule():
    x = torch.empty(4, 64, 1, 1, dtype=torch.float16, device="meta")
    scale = torch.empty(1, 64, 1, 1, dtype=torch.float32, device="meta")
    rule = r"input 2 of graph 'rmsnorm_eps' is on cpu with 4 elements, and a CPU input must be a host scalar \(a 0-dim or one-element CPU tensor"
    with pytest.raises(ValueError, match=rule):
        torch.ops.cudnn_fe.execute(RMSNORM, [x, scale, torch.zeros(4)])
    with pytest.raises(ValueError, match=r"input 0 of graph 'rmsnorm_eps' is on cpu with 256 elements.*host scalar.*\.to\('meta'\)"):
        torch.ops.cudnn_fe.execute(RMSNORM, [torch.zeros(x.shape), scale, torch.tensor(1e-5)])
    # All on the CPU (the scalar still a host scalar, passed by value): the reference interpreter runs it.
    (y,) = torch.ops.cudnn_fe.execute(RMSNORM, [torch.ones(x.shape, dtype=x.dtype), torch.ones(scale.shape), torch.tensor(1e-5)])
    assert y.device.type == "cpu" and y.shape == x.shape
    with FakeTensorMode():
        fx = torch.empty(4, 64, 1, 1, dtype=torch.float16, device="cuda")
        fscale = torch.empty(1, 64, 1, 1, dtype=torch.float32, device="cuda")
        not_a_scalar = torch.zeros(2)
    with pytest.raises(Exception, match="input 2 of graph 'rmsnorm_eps' is on cpu with 2 elements"):
        torch.compile(rmsnorm_call, backend="aot_eager", fullgraph=True)(fx, fscale, not_a_scalar)


def test_only_host_scalars_is_refused_with_the_fix():
    scalars = [torch.tensor(1.0), torch.tensor(2.0), torch.tensor(1e-5)]
    with pytest.raises(ValueError, match="got no input tensors on a GPU, only host scalars; pass at least one CUDA tensor"):
        torch.ops.cudnn_fe.execute(RMSNORM, scalars)


# -- data types --------------------------------------------------------------------


def test_the_dtypes_a_graph_takes_are_the_frontends():
    for dtype in [*FP8, torch.float8_e8m0fnu, torch.int8, torch.bfloat16]:
        assert dtype in TORCH_DTYPES
    assert cudnn_data_type_of(torch.float8_e8m0fnu) == cudnn.data_type.FP8_E8M0
    assert torch.float4_e2m1fn_x2 not in TORCH_DTYPES  # packed pairs: its shape is not the graph's
    assert torch.complex64 not in TORCH_DTYPES


@pytest.mark.parametrize("fp8", FP8)
def test_fp8_in_and_a_chosen_io_type_out(fp8):
    specs = [spec((1, 32, 64), fp8), spec((1, 64, 16), fp8), spec((), torch.float32, host=True), spec((), torch.float32, host=True)]
    graph, inputs, _, layout = describe(FP8_MATMUL, specs)
    assert [t.data_type for t in inputs[:2]] == [cudnn_data_type_of(fp8)] * 2
    assert layout.outputs == (spec((1, 32, 16), torch.bfloat16),)  # io_data_type=torch.bfloat16


@pytest.mark.parametrize("fp8", FP8)
def test_fp8_out_by_default(fp8):
    relu = tch.register_graph(lambda g, x: g.relu(x), name="fp8_relu")
    (y,) = torch.ops.cudnn_fe.execute(relu, [torch.empty(2, 8, 16, dtype=fp8, device="meta")])
    assert y.dtype == fp8  # io: the first floating input's dtype


def test_an_e8m0_input_is_declared_as_the_frontends_fp8_e8m0():
    graph, inputs, _, _ = describe(
        tch.register_graph(lambda g, x, s: g.mul(x, s), name="e8m0"), [spec((1, 4, 32), torch.float32), spec((1, 4, 32), torch.float8_e8m0fnu)]
    )
    assert inputs[1].data_type == cudnn.data_type.FP8_E8M0


def test_an_all_integer_graph_takes_its_io_type_from_its_first_input():
    x, w = spec((2, 16, 8, 8), torch.int8, stride=nhwc_strides(2, 16, 8, 8)), spec((16, 16, 3, 3), torch.int8, stride=nhwc_strides(16, 16, 3, 3))
    graph, _, _, layout = describe(INT8_CONV, [x, w])
    assert layout.outputs == (spec((2, 16, 8, 8), torch.int32, stride=nhwc_strides(2, 16, 8, 8)),)
    plain = tch.register_graph(lambda g, a, b: g.add(a, b), name="int_add")
    (y,) = torch.ops.cudnn_fe.execute(plain, [torch.empty(2, 4, 8, dtype=torch.int32, device="meta")] * 2)
    assert y.dtype == torch.int32


# Values a float32 computation rounds (above 2**24; the int64 ones above 2**53 too).
BIG_INT64 = [2147483649, -5, 9007199254740993, 16777217]
BIG_INT32 = [16777217, -5, 2147483000, -2147483000]  # no int32 overflow: torch wraps it, the interpreter computes in int64
INT_RELU = tch.register_graph(lambda g, x: g.relu(x), name="int_relu")
INT_ADD_MAX = tch.register_graph(lambda g, a, b: g.max(g.add(a, b), b), name="int_add_max")


@pytest.mark.parametrize("dtype, expected", [(torch.int64, cudnn.data_type.INT64), (torch.int32, cudnn.data_type.INT32),
                                             (torch.int8, cudnn.data_type.INT32), (torch.uint8, cudnn.data_type.INT32)])
def test_an_all_integer_graph_computes_in_an_integer_type_by_default(dtype, expected):
    seen = {}

    def builder(g, x, y):
        seen["types"] = (g._context.intermediate_data_type, g._context.compute_data_type)
        return g.add(x, y)

    gid = tch.register_graph(builder, name=f"int_types_{dtype}")
    describe(gid, [spec((1, 4, 8), dtype), spec((1, 4, 8), dtype)])
    assert seen["types"] == (expected, expected)
    describe(gid, [spec((1, 4, 8), dtype), spec((1, 4, 8), torch.float16)])  # a floating input: float32, as before
    assert seen["types"] == (cudnn.data_type.FLOAT, cudnn.data_type.FLOAT)
    chosen = tch.register_graph(builder, name=f"int_types_chosen_{dtype}", compute_data_type=torch.float32)
    describe(chosen, [spec((1, 4, 8), dtype), spec((1, 4, 8), dtype)])
    assert seen["types"] == (expected, cudnn.data_type.FLOAT)  # the author's compute type wins; intermediates stay exact


@pytest.mark.parametrize("dtype, values", [(torch.int64, BIG_INT64), (torch.int32, BIG_INT32)])
def test_integer_graphs_on_the_cpu_give_torchs_values_exactly_above_2_pow_24(dtype, values):
    x = torch.tensor(values, dtype=dtype).reshape(1, 1, 4)
    (y,) = tch.execute(INT_RELU, [x])
    assert y.dtype == dtype and y.flatten().tolist() == torch.relu(x).flatten().tolist()
    b = torch.tensor([3, -9, 1, 2], dtype=dtype).reshape(1, 1, 4)
    (z,) = tch.execute(INT_ADD_MAX, [x, b])
    assert z.flatten().tolist() == torch.maximum(x + b, b).flatten().tolist()


def test_an_integer_graph_asked_to_compute_in_float32_rounds_as_float32_does():
    relu = tch.register_graph(lambda g, x: g.relu(x), name="int_relu_in_float", compute_data_type=torch.float32)
    (y,) = tch.execute(relu, [torch.tensor([16777217, 3], dtype=torch.int64).reshape(1, 1, 2)])
    assert y.flatten().tolist() == [16777216, 3]  # what the author asked for: float32 arithmetic


def test_set_data_type_takes_a_torch_dtype():
    (y,) = torch.ops.cudnn_fe.execute(RELU_TO_HALF, [torch.empty(2, 4, 8, dtype=torch.float32, device="meta")])
    assert y.dtype == torch.float16


def test_a_graph_on_tensors_of_fewer_than_3_dims_is_refused_with_the_fix():
    # Note [Tensors of fewer than 3 dims]: cuDNN writes such graphs wrongly; the refusal is
    # made where the graph is described, so a trace refuses it as a call does.
    relu = tch.register_graph(lambda g, x: g.relu(x), name="relu_2d")
    for shape in ((32, 64), (64,)):
        with pytest.raises(ValueError, match=r"fewer than 3 dims \(input 0 is float32\[.*x.unsqueeze\(0\)"):
            torch.ops.cudnn_fe.execute(relu, [torch.empty(*shape, device="meta")])
    (y,) = torch.ops.cudnn_fe.execute(relu, [torch.empty(1, 32, 64, device="meta")])
    assert y.shape == (1, 32, 64)


def test_the_graph_types_are_the_authors_in_either_spelling():
    definition = registry.definition(INT8_CONV)
    assert (definition.data_types.intermediate, definition.data_types.compute) == (cudnn.data_type.INT32, cudnn.data_type.INT32)
    seen = {}

    def builder(g, x):
        seen["types"] = (g._context.io_data_type, g._context.intermediate_data_type, g._context.compute_data_type)
        return g.relu(x)

    gid = tch.register_graph(builder, io_data_type=cudnn.data_type.HALF, intermediate_data_type=torch.float16, compute_data_type=torch.float32)
    describe(gid, [spec((1, 4, 8), torch.float32)])
    assert seen["types"] == (cudnn.data_type.HALF, cudnn.data_type.HALF, cudnn.data_type.FLOAT)
    with pytest.raises(TypeError, match=r"register_graph: compute_data_type='fp32' is not a data type.*torch dtypes"):
        tch.register_graph(builder, compute_data_type="fp32")


# -- outputs as the build lays them out ---------------------------------------------


def conv_specs(dtype=torch.float16, *, channels_last=True):
    x_stride = nhwc_strides(4, 16, 19, 19) if channels_last else None
    w_stride = nhwc_strides(16, 16, 3, 3) if channels_last else None
    return [spec((4, 16, 19, 19), dtype, stride=x_stride), spec((16, 16, 3, 3), dtype, stride=w_stride)]


def test_an_undeclared_conv_output_is_described_nhwc_whatever_the_inputs_layout():
    layout = describe(CONV, conv_specs())[3]
    assert layout.outputs == (spec((4, 16, 19, 19), torch.float16, stride=(5776, 1, 304, 16)),)
    assert layout.declared == (False,)
    # An NCHW convolution writes NHWC too (measured on the H200: frontend 1.32, cuDNN 9.19).
    assert describe(CONV, conv_specs(channels_last=False))[3].outputs[0].stride == (5776, 1, 304, 16)


def test_the_fake_kernel_reports_the_nhwc_output():
    with FakeTensorMode():
        x, w = nhwc(4, 16, 19, 19, dtype=torch.float16, device="cuda"), nhwc(16, 16, 3, 3, dtype=torch.float16, device="cuda")
    y = torch.compile(lambda a, b: torch.ops.cudnn_fe.execute(CONV, [a, b])[0], backend="aot_eager", fullgraph=True)(x, w)
    assert y.stride() == (5776, 1, 304, 16) and y.is_contiguous(memory_format=torch.channels_last)


def test_a_pointwise_output_after_an_nhwc_conv_stays_nhwc_and_a_matmul_is_row_major():
    conv_relu = tch.register_graph(lambda g, x, w: g.relu(g.conv_fprop(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1])), name="conv_relu")
    assert describe(conv_relu, conv_specs())[3].outputs[0].stride == (5776, 1, 304, 16)
    matmul = tch.register_graph(lambda g, a, b: g.matmul(a, b), name="mm_cm")
    a_column_major = spec((2, 8, 4), torch.float16, stride=(32, 1, 8))
    assert describe(matmul, [a_column_major, spec((2, 4, 6), torch.float16)])[3].outputs[0].stride == (48, 6, 1)


def test_a_declared_output_layout_stays_the_builders_contract():
    def conv_nchw_out(g, x, w):
        y = g.conv_fprop(x, w, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
        return y.set_dim([4, 16, 19, 19]).set_stride([5776, 361, 19, 1])

    layout = describe(tch.register_graph(conv_nchw_out, name="conv_nchw_out"), conv_specs())[3]
    assert layout.outputs[0].stride == (5776, 361, 19, 1) and layout.declared == (True,)


@pytest.mark.parametrize("shape, memory_format", [((2, 3, 5, 7), torch.channels_last), ((2, 3, 4, 5, 6), torch.channels_last_3d), ((2, 3, 5, 7), torch.contiguous_format)])
def test_the_stride_rule_lays_out_like_the_input(shape, memory_format):
    strides = torch.empty(shape, device="meta").to(memory_format=memory_format).stride()
    assert tuple(dense_strides(shape, stride_order_of(strides, len(shape)))) == strides
    assert stride_order_of([8, 1], 3) == [1, 0, 2]  # an extra dim ranks after the input's
