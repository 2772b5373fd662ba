"""The nn modules trace under torch.compile(fullgraph=True), with no GPU.

Each module's forward is traced on fake CUDA tensors (a CPU build of torch cannot
give fake CUDA tensors autograd metadata, so parameters there need no grad), and
forward+backward on meta tensors that require grad. Both graphs must hold
``torch.ops.cudnn_fe.execute`` (AOT autograd's backward graph too: the backwards are
cuDNN graphs), fullgraph rules out graph breaks, and the outputs (and gradients)
must have the shapes and dtypes of the plain-torch reference's.
"""

import pytest
import torch
from torch._dynamo.testing import AotEagerAndRecordGraphs
from torch._subclasses.fake_tensor import FakeTensorMode

from torch_cudnn_handle.nn import Attention, FusedLinear, RMSNorm, TransformerBlock, fake_cuda_module, reference_of, sdpa, sdpa_reference

DTYPE = torch.bfloat16

# name: (module factory taking a device, input shape, calls of the op in the forward, in the backward)
MODULES = {
    "linear_relu": (lambda device: FusedLinear(64, 96, "relu", device=device, dtype=DTYPE), (2, 16, 64), 1, 3),
    "linear_gelu": (lambda device: FusedLinear(64, 96, "gelu", device=device, dtype=DTYPE), (2, 16, 64), 1, 3),
    "linear_identity": (lambda device: FusedLinear(64, 96, None, device=device, dtype=DTYPE), (2, 16, 64), 1, 2),
    "linear_4d_input": (lambda device: FusedLinear(64, 32, "relu", device=device, dtype=DTYPE), (2, 3, 8, 64), 1, 3),
    "rmsnorm": (lambda device: RMSNorm(64, eps=1e-5, device=device, dtype=DTYPE), (2, 16, 64), 1, 1),
    "attention": (lambda device: Attention(128, 2, device=device, dtype=DTYPE), (2, 32, 128), 5, 9),
    "attention_full": (lambda device: Attention(128, 4, causal=False, device=device, dtype=DTYPE), (2, 32, 128), 5, 9),
    "block": (lambda device: TransformerBlock(128, 2, mlp_ratio=4, device=device, dtype=DTYPE), (2, 32, 128), 9, 16),
    "block_relu": (lambda device: TransformerBlock(64, 2, mlp_ratio=2, activation="relu", device=device, dtype=DTYPE), (1, 16, 64), 9, 16),
}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def execute_calls(graph_module) -> int:
    return graph_module.code.count("torch.ops.cudnn_fe.execute.default(")


@pytest.mark.parametrize("name", sorted(MODULES))
def test_forward_traces_on_fake_cuda_tensors(name):
    make, shape, forward_calls, _ = MODULES[name]
    fake_mode = FakeTensorMode()
    module = fake_cuda_module(make, fake_mode=fake_mode)
    with fake_mode:
        x = torch.empty(shape, dtype=DTYPE, device="cuda")
    backend = AotEagerAndRecordGraphs()
    y = torch.compile(module, backend=backend, fullgraph=True)(x)
    assert len(backend.fw_graphs) == 1
    assert execute_calls(backend.fw_graphs[0]) == forward_calls
    expected = reference_of(make("meta"))(torch.empty(shape, dtype=DTYPE, device="meta"))
    assert (tuple(y.shape), y.dtype, y.device.type) == (tuple(expected.shape), expected.dtype, "cuda")
    assert y.is_contiguous()


@pytest.mark.parametrize("name", sorted(MODULES))
def test_forward_and_backward_trace_on_meta_tensors(name):
    make, shape, forward_calls, backward_calls = MODULES[name]
    module = make("meta")
    x = torch.empty(shape, dtype=DTYPE, device="meta", requires_grad=True)
    backend = AotEagerAndRecordGraphs()
    y = torch.compile(module, backend=backend, fullgraph=True)(x)
    y.float().sum().backward()
    assert (len(backend.fw_graphs), len(backend.bw_graphs)) == (1, 1)
    assert execute_calls(backend.fw_graphs[0]) == forward_calls
    assert execute_calls(backend.bw_graphs[0]) == backward_calls

    reference = reference_of(module)
    x_ref = x.detach().requires_grad_()
    y_ref = reference(x_ref)
    y_ref.float().sum().backward()
    assert (tuple(y.shape), y.dtype) == (tuple(y_ref.shape), y_ref.dtype)
    assert (tuple(x.grad.shape), x.grad.dtype) == (tuple(x_ref.grad.shape), x_ref.grad.dtype)
    grads = {n: p.grad for n, p in module.named_parameters()}
    for n, p in reference.named_parameters():
        assert grads[n] is not None, f"{n} got no gradient"
        assert (tuple(grads[n].shape), grads[n].dtype) == (tuple(p.grad.shape), p.grad.dtype), n


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_sdpa_function_traces_and_keeps_the_layout_of_q(causal, layout):
    def make():
        if layout == "bhsd":
            return torch.empty(2, 4, 64, 32, dtype=DTYPE, device="meta", requires_grad=True)
        return torch.empty(2, 64, 4, 32, dtype=DTYPE, device="meta").transpose(1, 2).requires_grad_()

    q, k, v = make(), make(), make()
    backend = AotEagerAndRecordGraphs()
    o = torch.compile(lambda q, k, v: sdpa(q, k, v, causal), backend=backend, fullgraph=True)(q, k, v)
    assert o.stride() == q.stride()  # O adopts Q's layout, as the frontend's own sdpa op
    o.float().sum().backward()
    assert (execute_calls(backend.fw_graphs[0]), execute_calls(backend.bw_graphs[0])) == (1, 1)
    expected = sdpa_reference(q.detach(), k.detach(), v.detach(), causal)
    assert (tuple(o.shape), o.dtype) == (tuple(expected.shape), expected.dtype)
    for t in (q, k, v):
        assert (t.grad.shape, t.grad.stride(), t.grad.dtype) == (t.shape, t.stride(), t.dtype)


def test_sdpa_outputs_and_stats_layout_on_fake_cuda_module():
    from torch_cudnn_handle.nn.attention import SDPA_GRAPHS

    with FakeTensorMode():
        q = torch.empty(2, 64, 4, 32, dtype=torch.float16, device="cuda").transpose(1, 2)
        o, stats = torch.ops.cudnn_fe.execute(SDPA_GRAPHS[True], [q, q, q])
        assert (tuple(o.shape), o.stride(), o.dtype) == ((2, 4, 64, 32), q.stride(), torch.float16)
        assert (tuple(stats.shape), stats.stride(), stats.dtype) == ((2, 4, 64, 1), (256, 64, 1, 1), torch.float32)


def test_rmsnorm_writes_float32_inverse_rms_per_row():
    from torch_cudnn_handle.nn.norm import rmsnorm_graph

    with FakeTensorMode():
        x = torch.empty(96, 64, dtype=torch.bfloat16, device="cuda")  # natural operands: the graph views them 4-D
        w = torch.empty(64, dtype=torch.bfloat16, device="cuda")
        y, inv_var = torch.ops.cudnn_fe.execute(rmsnorm_graph(1e-6), [x, w])
    assert (tuple(y.shape), y.stride(), y.dtype) == ((96, 64), (64, 1), torch.bfloat16)
    assert (tuple(inv_var.shape), inv_var.stride(), inv_var.dtype) == ((96, 1), (1, 1), torch.float32)


def test_graphs_are_registered_once_not_per_module_or_call():
    from torch_cudnn_handle.stats import graphs as registry_stats

    TransformerBlock(64, 2, device="meta", dtype=DTYPE)  # registers its eps's rmsnorm graphs if no module did yet
    before = registry_stats()["definitions"]
    modules = [TransformerBlock(64, 2, device="meta", dtype=DTYPE) for _ in range(3)]
    modules[0](torch.empty(1, 8, 64, dtype=DTYPE, device="meta"))
    assert registry_stats()["definitions"] == before
    RMSNorm(64, eps=0.123, device="meta")
    RMSNorm(64, eps=0.123, device="meta")
    assert registry_stats()["definitions"] == before + 2  # one new eps: its forward and backward graphs


def test_reference_of_copies_the_parameters():
    block = TransformerBlock(32, 2, device="cpu", dtype=torch.float32)
    reference = reference_of(block)
    assert block.state_dict().keys() == reference.state_dict().keys()
    for (name, p), q in zip(block.named_parameters(), reference.parameters()):
        assert torch.equal(p, q) and p.data_ptr() != q.data_ptr(), name


# -- wrong arguments are refused in Python, so on fake tensors (a trace) too -------------


def _traced(fn, *fake_args):
    torch._dynamo.reset()
    return torch.compile(fn, backend="aot_eager", fullgraph=True)(*fake_args)


def test_fused_linear_refuses_another_width_at_trace_time():
    words = r"FusedLinear: the input is \[2, 16, 63\], but this layer takes in_features=64.*pass \[\.\.\., 64\] or build FusedLinear\(63, 32\)"
    with pytest.raises(ValueError, match=words):
        FusedLinear(64, 32, device="meta", dtype=DTYPE)(torch.empty(2, 16, 63, dtype=DTYPE, device="meta"))
    fake_mode = FakeTensorMode()
    module = fake_cuda_module(FusedLinear, 64, 32, fake_mode=fake_mode, dtype=DTYPE)
    with fake_mode:
        x = torch.empty(2, 16, 63, dtype=DTYPE, device="cuda")
    with pytest.raises(Exception, match=words):
        _traced(module, x)


def test_fused_linear_refuses_an_input_of_another_dtype_at_trace_time():
    words = r"FusedLinear: the input is float16, but the weights are bfloat16.*x.to\(torch.bfloat16\) or module.to\(torch.float16\)"
    with pytest.raises(TypeError, match=words):
        FusedLinear(64, 32, device="meta", dtype=torch.bfloat16)(torch.empty(2, 16, 64, dtype=torch.float16, device="meta"))
    fake_mode = FakeTensorMode()
    module = fake_cuda_module(FusedLinear, 64, 32, fake_mode=fake_mode, dtype=torch.bfloat16)
    with fake_mode:
        x = torch.empty(2, 16, 64, dtype=torch.float16, device="cuda")
    with pytest.raises(Exception, match=words):
        _traced(module, x)


@pytest.mark.parametrize(
    "dtypes, head_dim, error, words",
    [
        ((DTYPE, DTYPE, DTYPE), 60, ValueError, r"the head dim D of q is 60 \(q.shape\[-1\]\), not a multiple of 8.*pad it"),
        ((torch.float32,) * 3, 64, TypeError, r"q, k and v are float32; cuDNN attention takes float16 or bfloat16.*q.to\(torch.bfloat16\)"),
        ((DTYPE, torch.float16, DTYPE), 64, TypeError, "must have one dtype, got q bfloat16, k float16, v bfloat16"),
    ],
)
def test_sdpa_refuses_what_cudnn_attention_cannot_take_at_trace_time(dtypes, head_dim, error, words):
    def make(dtype, device):
        return torch.empty(2, 4, 32, head_dim, dtype=dtype, device=device)

    with pytest.raises(error, match=words):
        sdpa(*(make(d, "meta") for d in dtypes))
    with FakeTensorMode():
        q, k, v = (make(d, "cuda") for d in dtypes)
    with pytest.raises(Exception, match=words):
        _traced(sdpa, q, k, v)


def test_fake_cuda_module_gives_fake_cuda_parameters_and_buffers():
    fake_mode = FakeTensorMode()
    block = fake_cuda_module(TransformerBlock, 64, 2, fake_mode=fake_mode, dtype=DTYPE)
    tensors = list(block.parameters()) + list(block.buffers())
    assert tensors and all(t.device.type == "cuda" and t.dtype == DTYPE and t.fake_mode is fake_mode for t in tensors)
    shapes = {n: tuple(p.shape) for n, p in TransformerBlock(64, 2, device="meta", dtype=DTYPE).named_parameters()}
    assert {n: tuple(p.shape) for n, p in block.named_parameters()} == shapes
