"""tch.prebuild on a GPU: the plans a module's calls need at each size are built and stored, so
a second process running those sizes builds nothing (every plan from the store); with workers
too. Each process is a fresh interpreter on a plan store of the test's own."""

import json
import os
import subprocess
import sys

import pytest

from support.paths import REPO

pytestmark = pytest.mark.gpu

SIZES = [96, 160, 224]
MODULE = """
import json, sys, torch
sys.path.insert(0, {tests!r})
import torch_cudnn_handle as tch
from torch_cudnn_handle.nn import FusedLinear
from support.models import token_rows
torch.manual_seed(0)
module = FusedLinear(64, 32, "gelu", device="cuda", dtype=torch.bfloat16)
"""
PREBUILD = MODULE + """
if __name__ == "__main__":
    done = tch.prebuild(module, {sizes!r}, token_rows, backward=True, workers={workers}, progress=False)
    print(json.dumps(dict(builds=done.builds, stored=done.stored)))
"""
SERVE = MODULE + """
for size in {sizes!r}:
    (x,) = token_rows(size)
    module(x.requires_grad_()).float().sum().backward()
torch.cuda.synchronize()
print(json.dumps(dict(builds=tch.stats.graphs()["builds"], store=tch.stats.plan_store())))
"""


def run(code: str, store) -> dict:
    env = dict(os.environ, TORCH_CUDNN_HANDLE_PLAN_STORE="1", TORCH_CUDNN_HANDLE_PLAN_STORE_DIR=str(store))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("workers", [1, 2])
def test_a_second_process_serves_every_prebuilt_size_from_the_store(tmp_path, workers):
    tests = os.path.join(REPO, "test")
    prebuilt = run(PREBUILD.format(tests=tests, sizes=SIZES, workers=workers), tmp_path)
    assert prebuilt["builds"] > 0 and prebuilt["stored"] > 0, prebuilt
    served = run(SERVE.format(tests=tests, sizes=SIZES), tmp_path)
    assert served["store"]["hits"] == prebuilt["stored"] and served["store"]["misses"] == 0, served
