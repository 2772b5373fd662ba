"""Importing the package does not load ``torch._dynamo`` (0.9 s of a 1.3 s import; torch
alone does not load it): the functions torch.compile takes as constants of a frame are
marked when a trace first looks them up (torch_cudnn_handle/trace_constants.py), and a
trace still takes them as constants when eager calls looked them up before dynamo loaded.
Each check runs in a fresh interpreter: this one has loaded dynamo long ago."""

import subprocess
import sys

import pytest

import torch_cudnn_handle  # noqa: F401  -- fails here, clearly, if the package does not import
from torch_cudnn_handle import trace_constants


def run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-8000:]}"
    return result.stdout


def test_torch_alone_does_not_load_dynamo():
    """Else the package could not spare it (and the test below would prove nothing)."""
    run("import sys, torch; assert 'torch._dynamo' not in sys.modules")


@pytest.mark.parametrize("module", ["torch_cudnn_handle", "torch_cudnn_handle.nn"])
def test_importing_the_package_does_not_load_dynamo(module):
    run(f"import sys, {module}\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('torch._dynamo'))\n"
        "assert not loaded, loaded")


EAGER_THEN_COMPILED = """
import sys
import torch
import torch_cudnn_handle as tch
from torch_cudnn_handle import settings
from torch_cudnn_handle.nn import sdpa

ACCUMULATE = tch.register_graph(lambda g, acc, x: g.add(a=acc, b=x), name="accumulate", in_place={0: 0})


class Passing(torch.overrides.TorchFunctionMode):  # routes execute_ through the op, eagerly
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def step(acc, x):
    tch.execute_(ACCUMULATE, [acc, x])
    return acc


def attend(q):
    return sdpa(q, q, q, True)


def meta(*shape):
    return torch.zeros(*shape, device="meta")


# Eagerly on the CPU (the reference interpreter): torch's own meta kernels may load dynamo.
torch.manual_seed(0)
q = torch.randn(1, 1, 5, 16, dtype=torch.bfloat16)
with settings.override(attention_buckets=True):
    with Passing():
        acc = torch.zeros(1, 4, 8)
        assert torch.equal(step(acc, torch.ones(1, 4, 8)), torch.ones(1, 4, 8))
    expected = torch.nn.functional.scaled_dot_product_attention(q.float(), q.float(), q.float(), is_causal=True)
    torch.testing.assert_close(attend(q).float(), expected, rtol=2e-2, atol=1e-2)  # bf16 out, against float32
    assert "torch._dynamo" not in sys.modules, "an eager lookup loaded dynamo"
    q = torch.empty(2, 200, 8, 64, dtype=torch.bfloat16, device="meta").transpose(1, 2)
    for fn, args in ((step, (meta(1, 4, 8), meta(1, 4, 8))), (attend, (q,))):
        assert torch.compile(fn, backend="aot_eager", fullgraph=True)(*args).shape == args[0].shape
"""


def test_a_trace_takes_them_as_constants_after_eager_calls_looked_them_up():
    """fullgraph=True: an unmarked function would be traced, and break the graph at its C++ or lock."""
    run(EAGER_THEN_COMPILED)


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="registered already"):
        trace_constants.constant("written_inputs")(lambda graph: ())
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        trace_constants.nothing
