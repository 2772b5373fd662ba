"""The torch.compile lowering (torch_cudnn_handle/lowering/), on models written as users write
them: a GPT-2-style block (LayerNorms, attention, a linear + gelu MLP) and a Llama-style decoder
layer (RMSNorm, torch's or written by hand, bias-free projections, grouped-query attention, a
SwiGLU MLP). What the library serves is
replaced by its graphs and what it does not is kept, with the reason; outputs and gradients
agree with the same model compiled without the lowering within bf16's numerics; one compiled
frame serves every length with dynamic=True; the parameters are the model's own. On the CPU:
the op runs each graph through its reference interpreter."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from support.compiled_pairs import assert_agree, compiled_pair
from support.models import Conv1DMLP, GPT2Block, LlamaLayer, MaskedGQA, WeightFirstRMSNorm, WrittenRMSNorm
from torch_cudnn_handle import lowering

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def decisions():
    return {(entry.pattern, entry.lowered) for entry in lowering.reports()[-1]}, lowering.reports()[-1]


def test_a_gpt2_block_has_its_layer_norms_attention_and_gelu_mlp_lowered():
    model, plain, lowered = compiled_pair(GPT2Block())
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
    assert_agree(plain, lowered, plain._orig_mod, model, x)
    _, entries = decisions()
    assert [e.pattern for e in entries if e.lowered] == ["layer_norm", "attention", "layer_norm", "linear_activation"]
    kept = [entry.reason for entry in entries if not entry.lowered]  # c_attn, c_proj and mlp_proj: no activation
    assert len(kept) == 3 and all("plain linear stays" in reason for reason in kept)


@pytest.mark.parametrize("norm", [nn.RMSNorm, WrittenRMSNorm, WeightFirstRMSNorm], ids=["nn.RMSNorm", "written", "weight_first"])
@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_a_llama_layer_has_its_rms_norms_attention_and_swiglu_lowered(norm, kv_heads):
    model, plain, lowered = compiled_pair(LlamaLayer(kv_heads=kv_heads, norm=norm))
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
    assert_agree(plain, lowered, plain._orig_mod, model, x)
    found, entries = decisions()
    assert [e.pattern for e in entries if e.lowered] == ["rms_norm", "attention", "rms_norm", "linear_activation"]
    onto = [e.reason for e in entries if e.lowered]
    assert ("grouped-query" in onto[1]) == (kv_heads == 2) and "SwiGLU's gate graph" in onto[3]
    assert all(("written by hand" in onto[i]) == (norm is not nn.RMSNorm) for i in (0, 2))
    kept = [e for e in entries if not e.lowered]  # q, k, v, o, up and down: plain linears
    assert len(kept) == 6 and all("plain linear stays" in e.reason for e in kept)
    lowered(x).float().square().sum().backward()  # the model's own parameters get the gradients: no copies
    assert all(parameter.grad is not None for parameter in model.parameters())
    assert model.state_dict().keys() == plain._orig_mod.state_dict().keys()


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_a_linear_and_its_activation_are_lowered_with_or_without_a_bias(activation, bias):
    module = {"relu": nn.ReLU(), "gelu": nn.GELU(), "gelu_tanh": nn.GELU(approximate="tanh"), "silu": nn.SiLU()}[activation]
    model = nn.Sequential(nn.Linear(32, 48, bias=bias), module)
    model, plain, lowered = compiled_pair(model)
    assert_agree(plain, lowered, plain._orig_mod, model, torch.randn(3, 5, 32, dtype=torch.bfloat16))
    (entry,) = lowering.reports()[-1]
    assert entry.lowered and f"FusedLinear's {activation} graph" in entry.reason and ("without a bias" in entry.reason) != bias


def test_gpt2s_conv1d_mlp_with_its_written_tanh_gelu_is_lowered():
    model, plain, lowered = compiled_pair(Conv1DMLP())
    assert_agree(plain, lowered, plain._orig_mod, model, torch.randn(2, 12, 64, dtype=torch.bfloat16))
    first, second = lowering.reports()[-1]
    assert first.lowered and "gelu_tanh graph on an [in, out] weight" in first.reason
    assert not second.lowered and "plain linear stays" in second.reason  # the projection back: no activation


def test_a_written_norm_that_is_not_rms_norm_is_kept():
    def not_quite(x, weight):  # the mean over the first dim: not a norm over the last dim
        x32 = x.to(torch.float32)
        return weight * (x32 * torch.rsqrt(x32.pow(2).mean(0, keepdim=True) + 1e-6)).to(x.dtype)

    x, weight = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(8, dtype=torch.bfloat16)
    torch.testing.assert_close(torch.compile(not_quite, backend=lowering.backend("eager"), fullgraph=True)(x, weight), not_quite(x, weight))
    (entry,) = lowering.reports()[-1]
    assert entry.pattern == "rms_norm" and not entry.lowered and "not an RMSNorm form" in entry.reason


@pytest.mark.parametrize("specialize_float", [False, True])
def test_one_frame_serves_every_length_with_dynamic_shapes(specialize_float):
    frames = []

    def counting(gm, example_inputs):
        frames.append(gm)
        return gm.forward

    torch.manual_seed(0)
    model = GPT2Block().to(torch.bfloat16)
    with torch._dynamo.config.patch(specialize_float=specialize_float):
        compiled = torch.compile(model, backend=lowering.backend(counting), fullgraph=True, dynamic=True)
        for length in (12, 20, 33):
            x = torch.randn(2, length, 64, dtype=torch.bfloat16)
            torch.testing.assert_close(compiled(x).float(), model(x).float(), rtol=2e-2, atol=3e-2)
    assert len(frames) == 1
    lowered = sum("cudnn_fe.execute" in str(n.target) for n in frames[0].graph.nodes)
    kept = {e.reason for e in lowering.reports()[-1] if e.pattern == "layer_norm" and not e.lowered}
    if specialize_float:  # the LayerNorms' eps stays a constant: they are lowered too
        assert lowered == 4 and not kept
    else:  # the attention, the MLP's first linear
        assert lowered == 2 and kept == {
            "eps is an input of the traced graph, not a constant (torch.compile(dynamic=True) lifts a module's float attributes): the "
            "graph bakes eps in; torch._dynamo.config.specialize_float = True keeps it a constant"}


@pytest.mark.parametrize("variant, reason", [
    ("float32", "cuDNN attention takes float16 or bfloat16"),
    ("mask", "a 2-D mask"),
    ("dropout", "dropout"),
    ("scale", "not the default 1/sqrt(16)"),
])
def test_what_the_graph_does_not_compute_is_kept_with_its_reason(variant, reason):
    def attention(q, k, v, mask):
        if variant == "mask":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        if variant == "dropout":
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
        if variant == "scale":
            return F.scaled_dot_product_attention(q, k, v, scale=0.5)
        return F.scaled_dot_product_attention(q, k, v)

    dtype = torch.float32 if variant == "float32" else torch.bfloat16
    q, k, v = (torch.randn(1, 2, 8, 16, dtype=dtype) for _ in range(3))
    mask = torch.ones(8, 8, dtype=torch.bool)
    torch.compile(attention, backend=lowering.backend("eager"), fullgraph=True)(q, k, v, mask)
    (entry,) = lowering.reports()[-1]
    assert not entry.lowered and reason in entry.reason


def test_a_mode_is_inductors():
    with pytest.raises(ValueError, match="mode='reduce-overhead' is inductor's; pass inner='inductor' with it"):
        lowering.backend("aot_eager", mode="reduce-overhead")
    assert callable(lowering.backend(mode="reduce-overhead"))


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_a_masked_attention_is_lowered_with_the_mask_as_a_bias(kind):
    class Masked(torch.nn.Module):
        def forward(self, q, k, v, mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 32, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    keep = torch.rand(2, 1, 16, 16) > 0.3
    keep[..., 0] = True  # every query keeps a key
    mask = keep if kind == "bool" else torch.zeros(keep.shape, dtype=torch.bfloat16).masked_fill(~keep, -1e4)
    lowered = torch.compile(Masked(), backend=lowering.backend("aot_eager"), fullgraph=True)
    y = lowered(q, k, v, mask)
    (entry,) = lowering.reports()[-1]
    assert entry.lowered and "the mask as a bias" in entry.reason
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*leaves, attn_mask=mask if kind == "bool" else mask.double())
    torch.testing.assert_close(y.double(), expected, rtol=2e-2, atol=2e-2)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, [q, k, v], dy)
    for got, want in zip(grads, torch.autograd.grad(expected, leaves, dy.double())):
        torch.testing.assert_close(got.double(), want, rtol=3e-2, atol=3e-2)


def test_explain_says_what_a_compile_would_lower_and_where_the_model_breaks_compiling_nothing():
    torch.manual_seed(0)
    model = LlamaLayer(kv_heads=2, norm=WrittenRMSNorm).to(torch.bfloat16)
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
    explained = lowering.explain(model, x)
    assert (explained.graphs, explained.graph_breaks) == (1, [])
    compiled_before = len(lowering.reports())
    assert [(e.pattern, e.lowered) for e in explained.entries if e.lowered] == [
        ("rms_norm", True), ("attention", True), ("rms_norm", True), ("linear_activation", True)]
    assert len(lowering.reports()) == compiled_before  # no compile ran

    def breaks(x):
        y = F.rms_norm(x, (64,), torch.ones(64, dtype=x.dtype), 1e-6)
        print("a graph break")
        return F.scaled_dot_product_attention(*(y.view(2, 16, 4, 16).transpose(1, 2),) * 3)

    explained = lowering.explain(breaks, x)
    assert explained.graphs == 2 and len(explained.graph_breaks) == 1 and "print" in explained.graph_breaks[0]
    assert [e.pattern for e in explained.entries if e.lowered] == ["rms_norm", "attention"]
    assert "1 graph break(s)" in str(explained) and "lowered onto nn.sdpa's" in str(explained)


def test_patterns_choose_what_is_lowered_and_the_rest_is_reported_kept():
    model, plain, lowered = compiled_pair(LlamaLayer())
    lowered = torch.compile(model, backend=lowering.backend("aot_eager", patterns=["attention"]), fullgraph=True)
    assert_agree(plain, lowered, plain._orig_mod, model, torch.randn(2, 16, 64, dtype=torch.bfloat16))
    entries = lowering.reports()[-1]
    assert [e.pattern for e in entries if e.lowered] == ["attention"]
    assert {e.reason for e in entries if e.pattern == "rms_norm"} == {"not among the patterns asked for (backend(patterns=...))"}
    unknown = r"unknown patterns \['swiglu'\]; choose among \['attention', 'rms_norm', 'layer_norm', 'linear_activation'\]"
    with pytest.raises(ValueError, match=unknown):
        lowering.backend(patterns=["attention", "swiglu"])


def test_a_scale_dynamic_shapes_lift_into_an_input_is_kept_with_its_reason():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = 0.25  # a float attribute: dynamic=True makes it an input of the graph

        def forward(self, x):
            q = x.view(x.shape[0], x.shape[1], 2, 16).transpose(1, 2)  # heads and head dim fixed, as a model's are
            return F.scaled_dot_product_attention(q, q, q, scale=self.scale)

    x = torch.randn(1, 8, 32, dtype=torch.bfloat16)
    torch.compile(Scaled(), backend=lowering.backend("eager"), dynamic=True, fullgraph=True)(x)
    (entry,) = lowering.reports()[-1]
    assert not entry.lowered and "the scale is an input of the traced graph" in entry.reason


def test_masked_grouped_query_attention_serves_every_length_in_one_frame():
    frames = []

    def counting(gm, example_inputs):
        frames.append(gm)
        return gm.forward

    compiled = torch.compile(MaskedGQA(), backend=lowering.backend(counting), fullgraph=True, dynamic=True)
    for length in (12, 20, 33):
        x = torch.randn(2, length, 64, dtype=torch.bfloat16)
        torch.testing.assert_close(compiled(x).float(), MaskedGQA()(x).float(), rtol=2e-2, atol=2e-2)
    assert len(frames) == 1
    (entry,) = lowering.reports()[-1]
    assert entry.lowered and "the mask as a bias (grouped-query)" in entry.reason


def test_each_run_of_a_lowered_frame_numbers_its_calls_afresh():
    """The compiled frame runs as a call site (Note [A new layout's first calls]): its calls see
    the frame, with no call of this run counted yet, and nothing is left behind after it."""
    from torch_cudnn_handle.registry import first_calls

    seen = []

    def inner(gm, example_inputs):  # a backend that records what a run of the frame sees
        def run(*args):
            seen.append(getattr(first_calls._sites, "frame", None))
            return gm(*args)

        return run

    compiled = torch.compile(lambda x: torch.relu(x) * 2, backend=lowering.backend(inner), fullgraph=True)
    for _ in range(2):
        compiled(torch.randn(4))
    assert len(seen) == 2 and all(isinstance(frame[0], int) and frame[1] == {} for frame in seen)
    assert seen[0][0] == seen[1][0] and seen[0][1] is not seen[1][1]  # one site, a fresh count per run
    assert getattr(first_calls._sites, "frame", None) is None
