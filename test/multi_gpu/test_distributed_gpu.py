"""``examples/distributed.py`` run as a user runs it: the nn block trained with DDP and
with FSDP2 under ``torch.compile``, its losses against the same model in plain torch.

Two GPUs: two ranks through torchrun (``python -m torch.distributed.run``); one GPU: a
plain ``python`` launch, a process group of one. Each is skipped where its GPUs are
missing. The example runs in a subprocess on the package this test imported, with
NVLink multicast off (``NCCL_NVLS_ENABLE=0``).
"""

import os
import subprocess
import sys

import pytest

import torch_cudnn_handle
from support.paths import REPO

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch_cudnn_handle.with_cuda, reason="needs a CUDA build of torch_cudnn_handle"),
]

EXAMPLE = os.path.join(REPO, "examples", "distributed.py")
STEPS = 2
TIMEOUT_S = 420  # the example compiles four models (two per wrapper) with inductor


def run_example(*launcher: str) -> subprocess.CompletedProcess:
    """``python [launcher...] examples/distributed.py --steps STEPS``, importing the
    torch_cudnn_handle this test imported."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(torch_cudnn_handle.__file__)))
    python_path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=python_path, NCCL_NVLS_ENABLE="0")
    return subprocess.run(
        [sys.executable, *launcher, EXAMPLE, "--steps", str(STEPS)], cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )


def assert_every_check_ok(result: subprocess.CompletedProcess, world_size: int) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "MISMATCH" not in output, output[-6000:]
    expected = [f"OK       {mode} step {step}/{STEPS}:" for mode in ("DDP", "FSDP2") for step in range(1, STEPS + 1)]
    if world_size > 1:
        expected.append("OK       DDP replicas equal on all ranks:")
    checks = len(expected)
    expected.append(f"{checks}/{checks} checks OK")
    missing = [line for line in expected if line not in result.stdout]
    assert not missing, f"missing {missing} in:\n{result.stdout[-6000:]}"
    assert f"on {world_size} GPU(s)" in result.stdout


@pytest.mark.two_gpus  # two ranks through torchrun
def test_two_ranks_through_torchrun():
    result = run_example("-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2")
    assert_every_check_ok(result, world_size=2)


def test_one_process_without_torchrun():
    assert_every_check_ok(run_example(), world_size=1)
