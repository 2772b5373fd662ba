"""The lowering on a GPU with inductor: the user-style models and the transformers models
(where installed) lowered onto cuDNN graphs agree with the same model compiled by inductor
alone, forward and backward; one frame serves every length with dynamic=True; a lowered model
runs under mode="reduce-overhead" (CUDA graphs), its steps replayed."""

import pytest
import torch

from support.compiled_pairs import assert_agree, compiled_pair, outputs_and_gradients
from support.models import Conv1DMLP, GPT2Block, LlamaLayer, MaskedGQA, WrittenRMSNorm, transformers_model, transformers_models_available
import torch_cudnn_handle as tch
from torch_cudnn_handle import lowering
from torch_cudnn_handle.nn.attention import SDPA_GRAPHS

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_dynamo")]


def built(graph_id) -> int:
    return len(tch.built_graphs(graph_id))


MODELS = {  # a model as users write it, how many matches it has lowered, an input's shape
    "gpt2_block": (GPT2Block, 4, (2, 128, 64)),  # two norms, the attention, the MLP's linear + gelu
    "llama_layer": (lambda: LlamaLayer(kv_heads=2, norm=WrittenRMSNorm), 4, (2, 128, 64)),  # two norms, the attention, the SwiGLU gate
    "conv1d_mlp": (Conv1DMLP, 1, (2, 128, 64)),  # the addmm + written tanh gelu
    "masked_gqa": (MaskedGQA, 1, (2, 128, 64)),  # the attention, its boolean mask as a bias
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_lowered_model_agrees_with_inductor_alone(name):
    make, lowered_count, shape = MODELS[name]
    before = built(SDPA_GRAPHS[True])
    model, plain, lowered = compiled_pair(make(), inner="inductor", device="cuda")
    assert_agree(plain, lowered, plain._orig_mod, model, torch.randn(*shape, device="cuda", dtype=torch.bfloat16))
    entries = lowering.reports()[-1]
    assert sum(e.lowered for e in entries) == lowered_count, entries
    if name in ("gpt2_block", "llama_layer"):
        assert built(SDPA_GRAPHS[True]) > before  # the attention ran on a cuDNN plan


def test_one_frame_serves_every_length_with_dynamic_shapes_on_the_gpu():
    from torch._inductor.compile_fx import compile_fx

    frames = []

    def counting_inductor(gm, example_inputs):
        frames.append(gm)
        return compile_fx(gm, example_inputs)

    torch.manual_seed(0)
    model = LlamaLayer(kv_heads=2).to(device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(model, backend=lowering.backend(counting_inductor), fullgraph=True, dynamic=True)
    compiled_at_first = None
    for length in (40, 72, 136):
        x = torch.randn(2, length, 64, device="cuda", dtype=torch.bfloat16)
        torch.testing.assert_close(compiled(x).float(), model(x).float(), rtol=2e-2, atol=3e-2)
        compiled_at_first = compiled_at_first or len(frames)
    # Inductor's first compile may trace twice (dynamo restarts it with a float it must specialize,
    # the norms' eps); no length after the first compiles again.
    assert len(frames) == compiled_at_first <= 2


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_a_lowered_step_replays_under_reduce_overhead(training):
    torch.manual_seed(0)
    model = LlamaLayer(kv_heads=2).to(device="cuda", dtype=torch.bfloat16)
    reference = torch.compile(model, backend="inductor", fullgraph=True)
    compiled = torch.compile(model, backend=lowering.backend(mode="reduce-overhead"), fullgraph=True)
    x = torch.randn(2, 64, 64, device="cuda", dtype=torch.bfloat16)
    if not training:
        with torch.no_grad():
            for _ in range(4):  # cudagraph trees record on the second or third call, then replay
                y = compiled(x).clone()
            torch.testing.assert_close(y.float(), reference(x).float(), rtol=2e-2, atol=3e-2)
        return
    for _ in range(4):
        y, grads = outputs_and_gradients(compiled, model, x)
        y = y.clone()
    y0, g0 = outputs_and_gradients(reference, model, x)
    torch.testing.assert_close(y.float(), y0.float(), rtol=2e-2, atol=3e-2)
    for a, b in zip(grads, g0):
        scale = float(b.float().abs().max()) or 1.0
        torch.testing.assert_close(a.float() / scale, b.float() / scale, rtol=0, atol=3e-2)


@pytest.mark.skipif(not transformers_models_available(), reason="needs transformers 5 or later")
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_a_transformers_model_lowered_agrees_with_inductor_alone(name):
    model, plain, lowered = compiled_pair(transformers_model(name, dim=256, heads=4), inner="inductor", device="cuda")
    ids = torch.randint(0, 128, (2, 256), device="cuda")
    assert_agree(plain, lowered, plain._orig_mod, model, ids)
    entries = lowering.reports()[-1]
    assert sum(e.lowered for e in entries) == 9, [e for e in entries if not e.lowered]
