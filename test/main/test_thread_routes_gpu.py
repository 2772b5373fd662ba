"""The thread benchmark's routes (bench/thread_scaling.py) run and compute the product on
a real GPU: the op, torch.bmm, cudnnBackendExecute with a shared plan, a plan per thread
and the graph-capable plan, and cuDNN's native CUDA graph launched as it is or re-pointed
per call (cudnnBackendUpdateCudaGraph, then cudaGraphExecUpdate or per kernel node). Each
route's timer fills its outputs with NaN, runs 4 threads and checks every output against
torch.bmm (fp16 tolerance) and the graph routes bitwise against the same plan's
cudnnBackendExecute; a wrong or missing result raises. No time is asserted."""

import os
import sys

import pytest
import torch

from conftest import requires_native_path
from support.paths import REPO

pytestmark = [pytest.mark.gpu, requires_native_path]

BENCH = os.path.join(REPO, "bench")


@pytest.fixture(scope="module")
def thread_scaling():
    sys.path.insert(0, BENCH)
    import thread_scaling

    return thread_scaling


@pytest.mark.parametrize("shape", [(1, 16, 16, 16), (8, 256, 256, 256)])
def test_every_route_computes_the_product_from_threads(thread_scaling, shape):
    batch, m, k, n = shape
    extension = thread_scaling.build()
    operands = [[torch.randn(batch, m, k, device="cuda", dtype=torch.float16), torch.randn(batch, k, n, device="cuda", dtype=torch.float16)]
                for _ in range(4)]
    timers, notes = thread_scaling.timers_for(extension, operands, 4, 50)
    print(f"\n{shape}: routes {list(timers)}; notes {notes}")
    graph_routes = set(thread_scaling.GRAPH_ROUTES)
    if not graph_routes & set(timers):
        pytest.skip(f"no graph-capable plan here: {notes}")
    assert set(timers) == set(thread_scaling.CANDIDATES), notes
    failed = {}
    for name, timer in timers.items():
        for threads in (1, 4):
            try:
                assert timer(threads) > 0, name  # the timer raises when an output is wrong or was not written
            except Exception as error:  # noqa: BLE001 -- every route is tried; all failures are named
                failed[(name, threads)] = f"{type(error).__name__}: {str(error)[:200]}"
                break
    assert not failed, failed


def test_a_route_that_writes_nothing_fails_its_check(thread_scaling):
    a, b = torch.randn(2, 8, 8, device="cuda", dtype=torch.float16), torch.randn(2, 8, 8, device="cuda", dtype=torch.float16)
    with pytest.raises(AssertionError, match="differs from torch.bmm"):
        thread_scaling.check([torch.full((2, 8, 8), float("nan"), device="cuda", dtype=torch.float16)], [[a, b]], "nothing")
    same = torch.bmm(a, b)
    other = same.clone()
    other.view(torch.int16).view(-1)[0] ^= 1  # one ulp off: within tolerance, not bitwise
    thread_scaling.check([other], [[a, b]], "close")
    with pytest.raises(AssertionError, match="not bitwise"):
        thread_scaling.check([other], [[a, b]], "close", expected=[same])
