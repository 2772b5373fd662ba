"""The torch.compile lowering (torch_cudnn_handle/lowering.py), on models written as users write
them: a GPT-2-style block (LayerNorms, attention, a linear + gelu MLP) and a Llama-style decoder
layer (RMSNorm, bias-free projections, attention, a SwiGLU MLP). What the library serves is
replaced by its graphs and what it does not is kept, with the reason; outputs and gradients
agree with the same model compiled without the lowering within bf16's numerics; one compiled
frame serves every length with dynamic=True; the parameters are the model's own. On the CPU:
the op runs each graph through its reference interpreter."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torch_cudnn_handle import lowering

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class GPT2Block(nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.c_attn, self.c_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.c_fc, self.mlp_proj = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=-1)
        q, k, v = (u.view(b, t, self.heads, d // self.heads).transpose(1, 2) for u in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.c_proj(a)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class LlamaLayer(nn.Module):
    def __init__(self, dim=64, heads=4, kv_heads=4, hidden=128):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.input_layernorm, self.post_attention_layernorm = nn.RMSNorm(dim, eps=1e-6), nn.RMSNorm(dim, eps=1e-6)
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj, self.v_proj = (nn.Linear(dim, kv_heads * self.head_dim, bias=False) for _ in range(2))
        self.o_proj = nn.Linear(dim, dim, bias=False)
        self.gate_proj, self.up_proj = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = (p(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2) for p in (self.k_proj, self.v_proj))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, d))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


def compiled_pair(model, **compile_options):
    torch.manual_seed(0)
    model = model.to(torch.bfloat16)
    plain = torch.compile(copy.deepcopy(model), backend="aot_eager", fullgraph=True, **compile_options)
    lowered = torch.compile(model, backend=lowering.backend("aot_eager"), fullgraph=True, **compile_options)
    return model, plain, lowered


def outputs_and_gradients(compiled, model, x):
    x = x.detach().clone().requires_grad_(True)
    y = compiled(x)
    grads = torch.autograd.grad(y.float().square().sum(), [x, *model.parameters()])
    return y, grads


def assert_agree(plain, lowered, plain_model, model, x):
    y0, g0 = outputs_and_gradients(plain, plain_model, x)
    y1, g1 = outputs_and_gradients(lowered, model, x)
    torch.testing.assert_close(y1.float(), y0.float(), rtol=2e-2, atol=3e-2)
    for a, b in zip(g1, g0):
        scale = float(b.float().abs().max()) or 1.0
        torch.testing.assert_close(a.float() / scale, b.float() / scale, rtol=0, atol=3e-2)


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


def test_a_llama_layer_has_its_rms_norms_and_attention_lowered_and_its_swiglu_kept():
    model, plain, lowered = compiled_pair(LlamaLayer())
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
    assert_agree(plain, lowered, plain._orig_mod, model, x)
    found, entries = decisions()
    assert [e.pattern for e in entries if e.lowered] == ["rms_norm", "attention", "rms_norm"]
    assert any(e.reason == "no library graph for SiLU / SwiGLU yet" for e in entries)
    lowered(x).float().square().sum().backward()  # the model's own parameters get the gradients: no copies
    assert all(parameter.grad is not None for parameter in model.parameters())
    assert model.state_dict().keys() == plain._orig_mod.state_dict().keys()


def test_grouped_query_attention_is_kept_with_its_reason():
    model, plain, lowered = compiled_pair(LlamaLayer(kv_heads=2))
    x = torch.randn(1, 8, 64, dtype=torch.bfloat16)
    assert_agree(plain, lowered, plain._orig_mod, model, x)
    (attention,) = [e for e in lowering.reports()[-1] if e.pattern == "attention"]
    assert not attention.lowered and "grouped-query" in attention.reason


def test_one_frame_serves_every_length_with_dynamic_shapes():
    frames = []

    def counting(gm, example_inputs):
        frames.append(gm)
        return gm.forward

    torch.manual_seed(0)
    model = GPT2Block().to(torch.bfloat16)
    compiled = torch.compile(model, backend=lowering.backend(counting), fullgraph=True, dynamic=True)
    for length in (12, 20, 33):
        x = torch.randn(2, length, 64, dtype=torch.bfloat16)
        torch.testing.assert_close(compiled(x).float(), model(x).float(), rtol=2e-2, atol=3e-2)
    assert len(frames) == 1
    assert sum("cudnn_fe.execute" in str(n.target) for n in frames[0].graph.nodes) == 2  # the attention, the MLP's first linear
    kept = {e.reason for e in lowering.reports()[-1] if e.pattern == "layer_norm"}
    assert kept == {"eps is an input of the traced graph, not a constant (torch.compile(dynamic=True) lifts a module's float "
                    "attributes): the graph bakes eps in"}


@pytest.mark.parametrize("variant, reason", [
    ("float32", "cuDNN attention takes float16 or bfloat16"),
    ("mask", "an attention mask"),
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
