"""Length buckets on a GPU (Note [Length buckets]): ``nn.sdpa`` served by its length's
ragged bucket plan, forward and backward, against torch in float32 and against the exact
(dense) plan, on every path a call can take: eager on the native path, torch.compile with
dynamic shapes, CUDA-graph capture, another stream, threads, and a second process, which builds the
bucket's plans again (they are not stored: stored_graphs.key_of)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from conftest import requires_native_path, run_concurrently
import torch_cudnn_handle as tch
from torch_cudnn_handle.nn import sdpa
from torch_cudnn_handle.nn.attention_buckets import bucket_of

pytestmark = pytest.mark.gpu

ATOL, RTOL = 1e-2, 3e-2  # bf16 against float32 torch, relative to the largest expected value


@pytest.fixture
def buckets(fresh_settings):
    fresh_settings.set_attention_buckets(True)
    return fresh_settings


def _qkv(b, h, s, d, *, seed=0, requires_grad=False):
    """Token-major ``[B, S, H, D]`` buffers seen as ``[B, H, S, D]`` (what Attention's projections give)."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    tensors = [torch.randn(b, s, h, d, device="cuda", generator=generator, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3)]
    return [t.requires_grad_(requires_grad) for t in tensors]


def _assert_close(actual, expected, what):
    assert actual.shape == expected.shape and actual.dtype == torch.bfloat16, what
    assert torch.isfinite(actual).all(), f"{what}: not finite"
    error = (actual.float() - expected.float()).abs().max().item()
    tolerance = ATOL + RTOL * expected.float().abs().max().item()
    assert error <= tolerance, f"{what}: max abs error {error:.3e} > {tolerance:.3e}"


def _forward_backward(q, k, v, d_o, causal):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o = sdpa(q, k, v, causal)
    o.backward(d_o)
    return o.detach(), q.grad, k.grad, v.grad


def _torch_float32(q, k, v, d_o, causal):
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    o.backward(d_o.float())
    return o.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("length", [37, 128, 200, 777])
def test_a_bucketed_length_is_right_forward_and_backward_and_agrees_with_the_exact_plan(buckets, causal, length):
    q, k, v = _qkv(2, 4, length, 64, seed=length)
    d_o = torch.randn_like(q)
    bucketed = _forward_backward(q, k, v, d_o, causal)
    buckets.set_attention_buckets(False)
    exact = _forward_backward(q, k, v, d_o, causal)
    truth = _torch_float32(q, k, v, d_o, causal)
    for name, got, dense, want in zip(("o", "dq", "dk", "dv"), bucketed, exact, truth):
        _assert_close(got, want, f"bucket {bucket_of(length)}, length {length}: {name}")
        _assert_close(dense, want, f"exact plan, length {length}: {name}")


@pytest.fixture(params=[False, True], ids=["default", "deterministic"])
def deterministic(request):
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(request.param)
    yield request.param
    torch.use_deterministic_algorithms(was)


def test_a_length_is_bitwise_repeatable_and_lengths_share_their_buckets_plan(buckets, deterministic):
    built = tch.stats.graphs()["builds"]
    for length in (129, 130, 200, 256):  # one bucket: 256
        q, k, v = _qkv(1, 2, length, 64, seed=length)
        d_o = torch.randn_like(q)
        first, again = _forward_backward(q, k, v, d_o, True), _forward_backward(q, k, v, d_o, True)
        compared = 4 if deterministic else 1  # a backward outside deterministic mode may accumulate in any order
        for name, a, b in list(zip(("o", "dq", "dk", "dv"), first, again))[:compared]:
            assert torch.equal(a, b), f"length {length}: {name} differs between two calls"
    assert tch.stats.graphs()["builds"] - built <= 2  # bucket 256's forward and backward plans, for batch 1


@requires_native_path
def test_steady_calls_run_natively_and_launch_no_length_kernels(buckets):
    before = tch.stats.graphs()
    q, k, v = _qkv(2, 4, 300, 64)
    sdpa(q, k, v, True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        o = sdpa(q, k, v, True)
    names = {event.name for event in profile.events()}
    assert not names & {"aten::arange", "aten::full", "aten::mul"}, sorted(names)  # lengths and offsets are kept
    after = tch.stats.graphs()
    assert after["native"] > before["native"] and after["python_path"] == before["python_path"]  # the bucket's plan is native
    assert torch.equal(o, sdpa(q, k, v, True))


def test_another_stream_right_after_the_first_use_reads_written_lengths(buckets):
    """The kept lengths and offsets are written on the first call's stream; a side stream waits for them."""
    q, k, v = _qkv(2, 4, 421, 64, seed=3)
    with torch.cuda.stream(torch.cuda.Stream()):
        torch.cuda._sleep(50_000_000)  # a busy first stream: its writes land late
        first = sdpa(q, k, v, False)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        other = sdpa(q, k, v, False)
    torch.cuda.synchronize()
    _assert_close(other, F.scaled_dot_product_attention(q.float(), k.float(), v.float()), "side stream")
    assert torch.equal(first, other)


def test_compiled_with_dynamic_shapes_matches_eager_bitwise(buckets, fresh_dynamo):
    compiled = torch.compile(lambda q, k, v: sdpa(q, k, v, True), dynamic=True, fullgraph=True)
    for length in (140, 190, 260, 500):
        q, k, v = _qkv(2, 4, length, 64, seed=length)
        assert torch.equal(compiled(q, k, v), sdpa(q, k, v, True)), f"length {length}"


def test_a_captured_bucketed_call_replays_new_inputs(buckets):
    q, k, v = _qkv(2, 4, 333, 64)
    static = [t.clone() for t in (q, k, v)]
    sdpa(*static, True)  # built and warm before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sdpa(*static, True)
    fresh = _qkv(2, 4, 333, 64, seed=9)
    for target, source in zip(static, fresh):
        target.copy_(source)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, sdpa(*fresh, True))


def test_threads_at_their_own_lengths_are_each_right(buckets):
    lengths = [90, 180, 250, 600]

    def call(i):
        q, k, v = _qkv(1, 4, lengths[i], 64, seed=i)
        o = sdpa(q, k, v, True)
        torch.cuda.current_stream().synchronize()
        return q, k, v, o

    for q, k, v, o in run_concurrently(call, len(lengths)):
        _assert_close(o, F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True), f"length {q.shape[2]}")


_CHILD = textwrap.dedent("""
    import hashlib, json, torch
    import torch_cudnn_handle as tch
    from torch_cudnn_handle.nn import sdpa
    tch.settings.set_attention_buckets(True)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 300, 4, 64, device="cuda", generator=g, dtype=torch.bfloat16).transpose(1, 2).requires_grad_() for _ in range(3))
    o = sdpa(q, k, v, True)
    o.backward(torch.ones_like(o))
    digest = hashlib.sha256(b"".join(t.detach().float().cpu().numpy().tobytes() for t in (o, q.grad, k.grad, v.grad))).hexdigest()
    print(json.dumps(dict(routes=tch.stats.graphs()["plan_sources"], store=tch.stats.plan_store(), digest=digest)))
""")


def test_a_second_process_loads_the_buckets_plans_from_the_plan_store(tmp_path):
    """A bucket's ragged offsets are no tensors of its backend plan's own; the store's check once
    took that for a foreign plan and rejected both (registry/plans/stored_graphs.py)."""
    env = dict(os.environ, TORCH_CUDNN_HANDLE_PLAN_STORE="1", TORCH_CUDNN_HANDLE_PLAN_STORE_DIR=str(tmp_path))

    def child():
        done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "torch_cudnn_handle" not in done.stderr, done.stderr[-3000:]  # no warning (a rejected plan warns)
        return json.loads(done.stdout.strip().splitlines()[-1])

    first, second = child(), child()
    assert first["routes"] == {"static": 2} and first["store"] == dict(hits=0, misses=2, writes=2, rejected=0, write_errors=0), first
    assert second["routes"] == {"plan_store": 2} and second["store"] == dict(hits=2, misses=0, writes=0, rejected=0, write_errors=0), second
    assert second["digest"] == first["digest"]  # the same plans, bitwise the same numbers
