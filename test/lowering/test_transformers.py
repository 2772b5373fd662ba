"""The lowering on the ``transformers`` package's models, built from small configs with random
weights (skipped where transformers 5 is not installed): LlamaForCausalLM (and Mistral, Qwen 3 with
its q and k norms, OLMo 2 with its norms after the projections, written weight first) has its
hand-written RMSNorms, its grouped-query attention and its SwiGLU gates lowered, GPT2LMHeadModel its
LayerNorms, attention and MLP (a Conv1D, i.e. an addmm on an [in, out] weight, then the tanh
gelu written out: one graph); logits and gradients agree with the unlowered compile. On the CPU here; the GPU
file runs the same with inductor."""

import pytest
import torch

from support.compiled_pairs import assert_agree, compiled_pair
from support.models import transformers_model, transformers_models_available
from torch_cudnn_handle import lowering

pytestmark = [pytest.mark.usefixtures("fresh_dynamo"),
              pytest.mark.skipif(not transformers_models_available(), reason="needs transformers 5 or later")]

LOWERED = {  # what each model's two layers have lowered, in order (and the final norm)
    "llama": ["rms_norm", "attention", "rms_norm", "linear_activation"] * 2 + ["rms_norm"],
    "mistral": ["rms_norm", "attention", "rms_norm", "linear_activation"] * 2 + ["rms_norm"],
    "qwen3": ["rms_norm", "rms_norm", "rms_norm", "attention", "rms_norm", "linear_activation"] * 2 + ["rms_norm"],  # q and k normed
    "olmo2": ["rms_norm", "rms_norm", "attention", "rms_norm", "linear_activation", "rms_norm"] * 2 + ["rms_norm"],  # norms after
    "gpt2": ["layer_norm", "attention", "layer_norm", "linear_activation"] * 2 + ["layer_norm"],
}


@pytest.mark.parametrize("name", sorted(LOWERED))
def test_a_transformers_model_is_lowered_and_agrees_with_its_plain_compile(name):
    model, plain, lowered = compiled_pair(transformers_model(name))
    ids = torch.randint(0, 128, (2, 24))
    assert_agree(plain, lowered, plain._orig_mod, model, ids)
    entries = lowering.reports()[-1]
    assert [e.pattern for e in entries if e.lowered] == LOWERED[name]
    assert all("plain linear stays" in e.reason for e in entries if not e.lowered)
