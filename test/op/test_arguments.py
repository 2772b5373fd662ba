"""Argument validation that needs no GPU: devices, graph ids, arities, CPU tensors, and
every wrong argument a call can get, refused where a trace (meta or fake tensors) sees it."""

import os
import re
import subprocess
import sys

import cudnn
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_cudnn_handle as tch
from support.graphs import LINEAR_RELU


@pytest.mark.parametrize(
    "device, error, words",
    [
        ("cpu", ValueError, "CUDA devices; got 'cpu'"),
        (torch.device("cpu"), ValueError, "got 'cpu'"),
        ("meta", ValueError, "got 'meta'"),
        ("not-a-device", ValueError, "'not-a-device' is not a device string"),
        ("cuda:x", ValueError, "'cuda:x' is not a device string"),
        # Out of range only where GPUs are seen; with none, the no-GPU test below has them.
        pytest.param(1_000_000, ValueError, "cuda:1000000 does not exist", marks=pytest.mark.gpu),
        pytest.param("cuda:999", ValueError, "cuda:999 does not exist", marks=pytest.mark.gpu),
        (-1, ValueError, "cuda:-1 does not exist: CUDA device ordinals start at 0"),
        (1.5, TypeError, "expected a device, got float"),
        (True, TypeError, "a bool is not a device"),
    ],
)
def test_bad_devices_are_rejected_clearly(device, error, words):
    with pytest.raises(error, match=words) as raised:
        tch.current_handle(device)
    assert "Pass a CUDA device" in str(raised.value)
    with pytest.raises(error, match=words):
        tch.bind_context(device)
    with pytest.raises(error, match=words):
        with tch.build_scope(device):
            pass


def _no_gpu_calls(device):
    def in_build_scope():
        with tch.build_scope(device):
            pass

    return {"current_handle": lambda: tch.current_handle(device), "bind_context": lambda: tch.bind_context(device),
            "build_scope": in_build_scope}


NO_CURRENT = "there is no current CUDA device to take a cuDNN handle for"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this process sees a GPU")
@pytest.mark.parametrize("device, subject", [
    ("cuda:0", "cannot use cuda:0"), (0, "cannot use cuda:0"), (torch.device("cuda", 0), "cannot use cuda:0"),
    (1_000_000, "cannot use cuda:1000000"), ("cuda:999", "cannot use cuda:999"),
    (None, NO_CURRENT), ("cuda", NO_CURRENT),
])
def test_a_good_device_without_a_gpu_names_the_cause_and_the_fix(device, subject):
    """With no GPU visible, a well-formed device is not the mistake: the message says what
    is (this torch has no CUDA, or it sees no GPU) and the fix, not "pass a CUDA device"."""
    for name, call in _no_gpu_calls(device).items():
        with pytest.raises(RuntimeError) as raised:
            call()
        message = str(raised.value).splitlines()[0]
        assert message.startswith(f"torch_cudnn_handle: {subject}: "), (name, message)
        assert "Pass a CUDA device" not in message, (name, message)
        if torch.version.cuda is None:  # a CPU-only torch, as in CI
            assert f"this torch ({torch.__version__}) is a CPU-only build without CUDA" in message, (name, message)
            assert "Install a CUDA build of torch" in message and "pip install --no-build-isolation -e ." in message, (name, message)
        else:  # a CUDA torch that sees no GPU
            assert f"no CUDA GPU is visible to this process (torch {torch.__version__} has CUDA {torch.version.cuda}" in message
            assert "nvidia-smi" in message, (name, message)


@pytest.mark.skipif(torch.version.cuda is None, reason="needs a CUDA torch (a GPU is optional: CUDA_VISIBLE_DEVICES hides it)")
def test_a_cuda_torch_that_sees_no_gpu_names_the_cause_and_the_fix():
    """A CUDA torch with every GPU hidden (CUDA_VISIBLE_DEVICES=''), in a fresh process:
    the message says no GPU is visible, why the runtime thinks so, and what to check."""
    code = (
        "import torch_cudnn_handle as tch\n"
        "try:\n    tch.current_handle('cuda:0')\nexcept RuntimeError as error:\n    print(str(error).splitlines()[0])\n"
    )
    environment = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    message = result.stdout.strip()
    assert message.startswith("torch_cudnn_handle: cannot use cuda:0: no CUDA GPU is visible to this process"), message
    assert "the CUDA runtime" in message and "nvidia-smi" in message, message
    assert "CUDA_VISIBLE_DEVICES is '' in this process: it can hide every GPU" in message, message
    assert "Pass a CUDA device" not in message, message


def test_an_all_cpu_call_runs_on_the_interpreter_and_cpu_beside_another_device_is_refused():
    x, w, b = (t.cpu() for t in _meta_linear_inputs())
    (y,) = torch.ops.cudnn_fe.execute(LINEAR_RELU, [x, w, b])  # the CPU kernel: the reference interpreter
    assert (tuple(y.shape), y.dtype, y.device.type) == ((2, 16, 8), torch.float16, "cpu")
    with pytest.raises(ValueError, match=r"out\[0\] of graph 'linear_relu' is float32\[2, 16, 8\].*but the graph writes float16"):
        torch.ops.cudnn_fe.execute.out(LINEAR_RELU, [x, w, b], out=[torch.empty(2, 16, 8)])
    with pytest.raises(ValueError, match=r"input 0 of graph 'linear_relu' is on cpu with 1024 elements.*host scalar.*\.to\('meta'\)"):
        torch.ops.cudnn_fe.execute(LINEAR_RELU, [x, w.to("meta"), b.to("meta")])


def _meta_linear_inputs():
    return [torch.zeros(2, 16, 32, dtype=torch.half), torch.zeros(2, 32, 8, dtype=torch.half), torch.zeros(2, 1, 8, dtype=torch.half)]


def test_unknown_graph_id_is_named():
    inputs = [t.to("meta") for t in _meta_linear_inputs()]
    with pytest.raises(ValueError, match="unknown graph id 987654.*register_graph"):
        torch.ops.cudnn_fe.execute(987654, inputs)


def test_wrong_number_of_inputs_is_named():
    x, w, _ = (t.to("meta") for t in _meta_linear_inputs())
    with pytest.raises(ValueError, match=r"'linear_relu' takes 3 inputs \(one tensor per input of its builder\), got 2"):
        torch.ops.cudnn_fe.execute(LINEAR_RELU, [x, w])


def test_register_graph_rejects_what_is_not_a_builder():
    with pytest.raises(TypeError, match="builder must be callable"):
        tch.register_graph(42)
    with pytest.raises(TypeError, match="backward_operands needs a backward builder"):
        tch.register_graph(lambda g, x: x, backward_operands=lambda *a: [])


def test_a_graph_without_backward_says_so_at_backward_time():
    gid = tch.register_graph(lambda g, x: g.relu(x), name="relu_only")
    x = torch.empty(4, 8, 8, device="meta", requires_grad=True)
    (y,) = torch.ops.cudnn_fe.execute(gid, [x])
    with pytest.raises(RuntimeError, match="'relu_only'.*no backward.*backward="):
        y.sum().backward()


def test_cache_capacity_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        tch.settings.set_graph_cache_capacity(0)


def test_an_empty_input_list_is_named_with_what_a_call_takes():
    """On either kind of machine: the graph's count, and both devices a call may run on."""
    takes = "it takes 3 tensors: CUDA tensors, which cuDNN runs, or CPU tensors, which the reference interpreter runs"
    for call in (lambda: torch.ops.cudnn_fe.execute(LINEAR_RELU, []), lambda: tch.execute(LINEAR_RELU, [])):
        with pytest.raises(ValueError, match=f"graph 'linear_relu' got no input tensors; {takes}$"):
            call()
    with pytest.raises(ValueError, match="got no input tensors; it takes 3 tensors"):
        torch.ops.cudnn_fe.execute.out(LINEAR_RELU, [], out=[])
    one = tch.register_graph(lambda g, x: g.relu(x), name="relu_of_one")
    with pytest.raises(ValueError, match="graph 'relu_of_one' got no input tensors; it takes 1 tensor: CUDA"):
        tch.execute(one, [])
    any_count = tch.register_graph(lambda g, *xs: g.relu(xs[0]), name="relu_of_any")
    with pytest.raises(ValueError, match="got no input tensors; it takes its inputs as tensors: CUDA"):
        tch.execute(any_count, [])


def test_inputs_on_several_devices_are_refused_even_when_one_is_meta():
    x, w, b = _meta_linear_inputs()
    for inputs in ([x, w.to("meta"), b], [x.to("meta"), w, b.to("meta")]):
        with pytest.raises(ValueError, match="more than one device"):
            torch.ops.cudnn_fe.execute(LINEAR_RELU, inputs)


@pytest.mark.parametrize("dtype, words", [(torch.complex64, "complex64, which a cuDNN graph cannot take"), (torch.float4_e2m1fn_x2, "float4_e2m1fn_x2, which a cuDNN graph cannot take")])
def test_a_dtype_a_graph_cannot_take_fails_at_trace_time(dtype, words):
    inputs = [t.to("meta", dtype) for t in _meta_linear_inputs()]
    with pytest.raises(ValueError, match=words):
        torch.ops.cudnn_fe.execute(LINEAR_RELU, inputs)


def test_out_refuses_autograd_and_bumps_versions_on_meta():
    x, w, b = (t.to("meta") for t in _meta_linear_inputs())
    out = torch.empty(2, 16, 8, dtype=torch.half, device="meta")
    with pytest.raises(RuntimeError, match=r"don't support automatic differentiation, but inputs\[0\] requires grad"):
        torch.ops.cudnn_fe.execute.out(LINEAR_RELU, [x.requires_grad_(), w, b], out=[out])
    version = out._version
    torch.ops.cudnn_fe.execute.out(LINEAR_RELU, [x.detach(), w, b], out=[out])
    assert out._version == version + 1
    saved = torch.empty(2, 16, 8, dtype=torch.half, device="meta")
    a = torch.empty(2, 16, 8, dtype=torch.half, device="meta", requires_grad=True)
    loss = (a * saved).sum()
    torch.ops.cudnn_fe.execute.out(LINEAR_RELU, [x.detach(), w, b], out=[saved])
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


# -- every wrong argument gets an error naming it, the problem and the fix -----------------


@pytest.mark.parametrize("bad, words", [(None, "inputs\\[1\\] of graph 'linear_relu' is NoneType, not a tensor"), (3, "inputs\\[1\\] of graph 'linear_relu' is int, not a tensor")])
def test_a_non_tensor_in_the_inputs_is_named_by_tch_execute(bad, words):
    x, w, b = (t.to("meta") for t in _meta_linear_inputs())
    with pytest.raises(TypeError, match=words + r".*list of tensors \(a Python number as a host scalar: torch.tensor\(value\)\)"):
        tch.execute(LINEAR_RELU, [x, bad, b])
    with pytest.raises(TypeError, match=words):
        tch.execute_out(LINEAR_RELU, [x, bad, b], out=[torch.empty(2, 16, 8, dtype=torch.half, device="meta")])
    with pytest.raises(TypeError, match="out\\[0\\] of graph 'linear_relu' is NoneType"):
        tch.execute_out(LINEAR_RELU, [x, w, b], out=[None])


def test_a_non_tensor_in_the_inputs_of_the_op_is_refused_by_torchs_parser():
    """torch.ops parses the arguments against the schema before any kernel of this library
    runs, so the message is torch's: it names the argument and prints the list it got."""
    x, _, b = (t.to("meta") for t in _meta_linear_inputs())
    with pytest.raises(RuntimeError, match=r"(?s)Expected a value of type 'List\[Tensor\]' for argument 'inputs'.*Value: \[.*, None, "):
        torch.ops.cudnn_fe.execute(LINEAR_RELU, [x, None, b])


@pytest.mark.parametrize("graph", [2**63, -(2**63) - 1, 1.0, "1"])
def test_a_graph_id_that_is_not_an_int64_is_named(graph):
    inputs = [t.to("meta") for t in _meta_linear_inputs()]
    with pytest.raises(TypeError, match=f"graph must be an int id from register_graph\\(\\).*got {re.escape(repr(graph))}"):
        tch.execute(graph, inputs)


@pytest.mark.parametrize("returned, words", [(None, "the builder returned NoneType"), (7, "the builder returned int"), ([7], "element 0 of what the builder returned is int")])
def test_a_builder_returning_no_tensor_is_named_at_trace_time(returned, words):
    gid = tch.register_graph(lambda g, x: returned, name=f"returns_{type(returned).__name__}")
    with pytest.raises(TypeError, match=f"graph 'returns_{type(returned).__name__}': {words}.*return the cudnn.Tensor a graph node gave"):
        torch.ops.cudnn_fe.execute(gid, [torch.empty(4, 8, 8, device="meta")])


def test_a_zero_dim_input_is_refused_with_the_fix():
    gid = tch.register_graph(lambda g, x, s: g.mul(x, s), name="scale")
    x = torch.empty(4, 8, 8, device="meta")
    with pytest.raises(ValueError, match=r"input 1 of graph 'scale' is a 0-dim tensor on meta.*\[1\]-shaped tensor \(t.reshape\(1\)\)"):
        torch.ops.cudnn_fe.execute(gid, [x, torch.empty((), device="meta")])
    with FakeTensorMode():
        fake = torch.empty(4, 8, 8, device="cuda")
        with pytest.raises(ValueError, match="input 1 of graph 'scale' is a 0-dim tensor on cuda:0"):
            torch.ops.cudnn_fe.execute(gid, [fake, torch.empty((), device="cuda")])


@pytest.mark.parametrize(
    "out, words",
    [
        ([torch.empty(2, 16, 9, dtype=torch.half)], r"out\[0\] of graph 'linear_relu' is float16\[2, 16, 9\]"),
        ([torch.empty(2, 16, 8, dtype=torch.float)], r"out\[0\] of graph 'linear_relu' is float32\[2, 16, 8\]"),
        ([torch.empty(2, 16, 8, dtype=torch.half)] * 2, "has 1 outputs, got 2 out tensors; pass one tensor per output"),
        ([], "has 1 outputs, got 0 out tensors"),
    ],
)
def test_a_wrong_out_fails_at_trace_time(out, words):
    x, w, b = (t.to("meta") for t in _meta_linear_inputs())
    with pytest.raises(ValueError, match=words):
        torch.ops.cudnn_fe.execute.out(LINEAR_RELU, [x, w, b], out=[t.to("meta") for t in out])

    def into(x, w, b, out):
        torch.ops.cudnn_fe.execute.out(LINEAR_RELU, [x, w, b], out=out)
        return out

    torch._dynamo.reset()
    with pytest.raises(Exception, match=words):
        torch.compile(into, backend="aot_eager", fullgraph=True)(x, w, b, [t.to("meta") for t in out])


def test_built_graphs_of_an_unknown_id_raises():
    with pytest.raises(ValueError, match="unknown graph id 9999.*register_graph"):
        tch.built_graphs(9999)


def test_register_built_graph_wants_a_built_pygraph():
    with pytest.raises(TypeError, match="graph must be a cudnn.pygraph built with graph.build.*got object.*register_graph"):
        tch.register_built_graph(object(), [], [], device="cuda:0")
    graph = cudnn.pygraph()
    x = graph.tensor(name="x", dim=[1, 8, 8], stride=[64, 8, 1], data_type=cudnn.data_type.HALF)
    y = graph.relu(x).set_output(True)
    with pytest.raises(ValueError, match=r"the cudnn.pygraph is not built .*call graph.build\(\[cudnn.heur_mode.A\]\) first"):
        tch.register_built_graph(graph, [x], [y], device="cuda:0")


def test_register_built_graph_pins_what_it_was_given(monkeypatch):
    """The id's arity is the built graph's input count (a GPU builds the graph; here a stand-in)."""
    from torch_cudnn_handle.registry import pinned
    from torch_cudnn_handle.registry.build import BuiltGraph
    from torch_cudnn_handle.registry.specs import GraphLayout, TensorSpec

    spec = TensorSpec((1, 8, 8), (64, 8, 1), torch.float16)
    built = BuiltGraph(graph=None, device=0, inputs=(spec, spec), layout=GraphLayout((spec,), (0,)), uids=(1, 2, 3), workspace_size=0)
    monkeypatch.setattr(pinned, "built_graph_of", lambda *args, **kwargs: built)
    graph_id = tch.register_built_graph(object(), [None, None], [None], device="cuda:0", name="stand_in_built")
    assert tch.built_graphs(graph_id) == [built]
    with pytest.raises(ValueError, match=r"graph 'stand_in_built' takes 2 inputs \(one tensor per input of its builder\), got 1"):
        tch.execute(graph_id, [torch.empty(1, 8, 8, device="meta", dtype=torch.float16)])


# -- errors a newcomer meets at description time (the fake kernel's, so without a GPU too) --


def test_a_python_number_where_the_builder_needs_a_tensor_names_tensor_scalar_and_host_scalars():
    def scale_by_half(g, x):
        return g.mul(a=x, b=0.5)  # a Python float where the node takes a tensor

    graph = tch.register_graph(scale_by_half, name="scale_by_half")
    with pytest.raises(TypeError, match=r"graph 'scale_by_half': the builder passed a Python float where a graph node takes a tensor "
                                        r"\(the frontend said: 'float' object has no attribute 'shape'\).*graph.tensor_scalar\(value, "
                                        r"cudnn.scalar_type.RUNTIME_PARAM\).*torch.tensor\(value\)"):
        torch.ops.cudnn_fe.execute(graph, [torch.empty(2, 8, 16, device="meta")])


def test_a_matmul_of_two_floating_types_is_refused_with_the_fix():
    graph = tch.register_graph(lambda g, a, b: g.matmul(A=a, B=b), name="fp16_by_fp32")
    a, b = torch.empty(1, 16, 32, dtype=torch.float16, device="meta"), torch.empty(1, 32, 8, dtype=torch.float32, device="meta")
    with pytest.raises(TypeError, match=r"matmul 'matmul.0' multiplies A of HALF by B of FLOAT; the op refuses.*b.to\(a.dtype\)"):
        torch.ops.cudnn_fe.execute(graph, [a, b])
    (c,) = torch.ops.cudnn_fe.execute(graph, [a, b.to(torch.float16)])  # one dtype: traced as before
    assert c.dtype == torch.float16 and c.shape == (1, 16, 8)
