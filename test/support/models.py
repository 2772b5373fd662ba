"""Models written as users write them, for the lowering's tests and benchmark: a GPT-2-style
block, a Llama-style decoder layer (torch's RMSNorm or Llama's hand-written one, grouped-query
heads, a SwiGLU MLP), and the ``transformers`` package's Llama and GPT-2 from small configs
where it is installed."""

import importlib.util
import math

import torch
import torch.nn.functional as F
from torch import nn

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


class WrittenRMSNorm(nn.Module):
    """RMSNorm as Llama writes it by hand."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight, self.variance_epsilon = nn.Parameter(torch.ones(dim)), eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class WeightFirstRMSNorm(WrittenRMSNorm):
    """RMSNorm as OLMo 2 writes it: the weight in float32, then the cast back."""

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight * hidden_states).to(input_dtype)


class LlamaLayer(nn.Module):
    def __init__(self, dim=64, heads=4, kv_heads=4, hidden=128, norm=nn.RMSNorm):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.input_layernorm, self.post_attention_layernorm = norm(dim, eps=1e-6), norm(dim, eps=1e-6)
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


class MaskedGQA(nn.Module):
    """Grouped-query attention with an explicit boolean causal mask, as transformers builds it
    under torch.compile on torch 2.11 (q: 4 heads of 16 from x, k = v: 2 heads from its first 32)."""

    def forward(self, x):
        b, t, _ = x.shape
        q = x.view(b, t, 4, 16).transpose(1, 2)
        k = v = x[..., :32].view(b, t, 2, 16).transpose(1, 2)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril().expand(b, 1, t, t)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


class Conv1DMLP(nn.Module):
    """GPT-2's MLP as ``transformers`` writes it: ``Conv1D`` projections (``addmm`` on an
    ``[in, out]`` weight) around ``gelu_new``, the tanh gelu written out."""

    def __init__(self, dim=64, hidden=256):
        super().__init__()
        self.fc_weight, self.fc_bias = nn.Parameter(torch.randn(dim, hidden) * 0.02), nn.Parameter(torch.zeros(hidden))
        self.proj_weight, self.proj_bias = nn.Parameter(torch.randn(hidden, dim) * 0.02), nn.Parameter(torch.zeros(dim))

    @staticmethod
    def conv1d(x, weight, bias):
        return torch.addmm(bias, x.view(-1, x.size(-1)), weight).view(x.size()[:-1] + (weight.size(-1),))

    def forward(self, x):
        h = self.conv1d(x, self.fc_weight, self.fc_bias)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return self.conv1d(h, self.proj_weight, self.proj_bias)


def token_rows(count: int) -> tuple:
    """A call's arguments at ``count`` tokens of width 64, bf16 on the GPU where there is one:
    a module-level function, as ``tch.prebuild(workers=N)`` needs its ``inputs`` to be."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return (torch.randn(count, 64, device=device, dtype=torch.bfloat16),)


def transformers_models_available() -> bool:
    """transformers 5 or later (4.x builds its attention mask under vmap, which dynamo on this torch does not trace)."""
    if importlib.util.find_spec("transformers") is None:
        return False
    import transformers

    return int(transformers.__version__.split(".")[0]) >= 5


def transformers_model(name: str, *, dim=64, layers=2, heads=4, kv_heads=2, vocab=128, positions=1024):
    """A ``transformers`` causal LM from a small config, random weights, no dropout, sdpa attention:
    "gpt2", or one of the Llama-like "llama", "mistral", "qwen3", "olmo2"."""
    import transformers

    if name == "gpt2":
        config = transformers.GPT2Config(vocab_size=vocab, n_embd=dim, n_layer=layers, n_head=heads, n_positions=positions, resid_pdrop=0.0,
                                         embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa", bos_token_id=0, eos_token_id=0)
        return transformers.GPT2LMHeadModel(config)
    family = {"llama": "Llama", "mistral": "Mistral", "qwen3": "Qwen3", "olmo2": "Olmo2"}[name]
    config = getattr(transformers, f"{family}Config")(
        vocab_size=vocab, hidden_size=dim, intermediate_size=dim * 8 // 3 // 8 * 8, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=dim // heads, max_position_embeddings=positions, attn_implementation="sdpa")
    return getattr(transformers, f"{family}ForCausalLM")(config)
