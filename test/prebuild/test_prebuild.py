"""tch.prebuild (torch_cudnn_handle/prebuild.py) on the CPU: each size's call made once, in this
process or spread over spawned workers (with this process's settings), backward included where
asked; progress on stderr; what it refuses, with the fix. On the CPU the op runs the interpreter,
so nothing is built: the GPU file checks the plans it stores."""

import pytest
import torch

from support.models import token_rows
import torch_cudnn_handle as tch
from torch_cudnn_handle import settings
from torch_cudnn_handle.nn import FusedLinear


@pytest.fixture(autouse=True)
def a_plan_store(tmp_path):
    """The tests run with the plan store off (conftest.py): here it is on, in a folder of the test's."""
    with settings.override(plan_store=True, plan_store_dir=str(tmp_path)):
        yield


def layer():
    torch.manual_seed(0)
    return FusedLinear(64, 32, "gelu", dtype=torch.bfloat16)


def test_each_size_is_called_once_forward_and_backward(capsys):
    module, seen = layer(), []
    module.register_forward_hook(lambda m, args, out: seen.append((tuple(args[0].shape), args[0].requires_grad)))
    done = tch.prebuild(module, [3, 5, 9], token_rows, backward=True)
    assert seen == [((3, 64), True), ((5, 64), True), ((9, 64), True)] and done.sizes == [3, 5, 9]  # dX built as training does
    assert done.builds == 0 and done.stored == 0 and done.seconds > 0  # the CPU builds nothing
    assert module.weight.grad is not None  # the backward ran
    assert "prebuild: 3/3 sizes" in capsys.readouterr().err


def test_workers_share_the_sizes_out_and_take_this_processs_settings(capsys):
    with settings.override(stand_in_calls=3):  # a setter's value, which an environment variable would not carry
        done = tch.prebuild(layer(), [4, 6, 8, 10, 12], token_rows, workers=2)
    assert done.sizes == [4, 6, 8, 10, 12] and done.builds == 0
    assert "prebuild: 5/5 sizes" in capsys.readouterr().err


def test_a_worker_that_fails_is_raised_naming_its_error():
    with pytest.raises(RuntimeError, match="prebuild: a worker failed: ValueError: FusedLinear: the input is"):
        tch.prebuild(FusedLinear(32, 8, dtype=torch.bfloat16), [2, 3], token_rows, workers=2, progress=False)


def test_what_prebuild_refuses_says_the_fix():
    with pytest.raises(ValueError, match="no sizes given"):
        tch.prebuild(layer(), [], token_rows)
    with pytest.raises(TypeError, match=r"inputs\(3\) returned Tensor; return the call's arguments as a tuple"):
        tch.prebuild(layer(), [3], lambda n: torch.randn(n, 64, dtype=torch.bfloat16), progress=False)
    with settings.override(plan_store=False), pytest.raises(ValueError, match=r"settings.set_plan_store\(True\)"):
        tch.prebuild(layer(), [3], token_rows)


def test_a_lowered_compiled_model_prebuilds_every_length_in_one_frame():
    from torch._dynamo.testing import CompileCounterWithBackend

    from support.models import LlamaLayer
    from torch_cudnn_handle import lowering

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = LlamaLayer(kv_heads=2).to(torch.bfloat16)
    counter = CompileCounterWithBackend(lowering.backend("aot_eager"))
    compiled = torch.compile(model, backend=counter, dynamic=True)
    tokens = lambda n: (torch.randn(2, n, 64, dtype=torch.bfloat16),)  # noqa: E731
    tch.prebuild(compiled, [40], tokens, backward=True, progress=False)
    compiled_once = counter.frame_count  # the first compile (aot may trace it twice, specializing the norms' eps)
    done = tch.prebuild(compiled, [72, 136], tokens, backward=True, progress=False)
    assert done.sizes == [72, 136] and counter.frame_count == compiled_once  # no length compiled again
    assert any(e.lowered and e.pattern == "attention" for e in lowering.reports()[-1])
    torch._dynamo.reset()
