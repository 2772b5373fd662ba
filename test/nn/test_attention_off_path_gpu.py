"""Attention off the caller's path on a GPU (Note [Attention off the caller's path]): with
``attention_buckets`` and ``serving_mode`` on, a new length's first call is torch's
own attention while its bucket's plan builds on a build thread, later calls are the bucket's plan, and once a length has been
called TAKE_OVER_CALLS times its exact plan takes over: each stage bitwise what that route
gives on its own, right against torch in float32. Deterministic calls never switch."""

import pytest
import torch

import torch_cudnn_handle as tch
from test_attention_buckets_gpu import _assert_close, _forward_backward, _qkv, _torch_float32  # the buckets' own GPU tests' helpers
from torch_cudnn_handle.nn import sdpa
from torch_cudnn_handle.nn.attention_buckets import bucket_of
from torch_cudnn_handle.nn.attention_routes import TAKE_OVER_CALLS, torch_attention

pytestmark = pytest.mark.gpu


@pytest.fixture
def off_path(fresh_settings):
    fresh_settings.set_attention_buckets(True)
    fresh_settings.set_serving_mode(True)
    fresh_settings.set_build_process(True)
    yield fresh_settings
    assert tch.registry.wait_for_builds(120) == 0


def _assert_right(got, q, k, v, d_o, what):
    """Each of o, dq, dk, dv against torch in float32."""
    for name, actual, expected in zip(("o", "dq", "dk", "dv"), got, _torch_float32(q, k, v, d_o, True)):
        _assert_close(actual, expected, f"{what}: {name}")


def _stand_ins() -> int:
    return tch.stats.graphs()["stand_in_calls"]


def test_torch_serves_a_new_length_then_its_bucket_then_its_exact_plan(off_path):
    length = 300  # bucket 512; batch 3 and 3 heads: a layout no other test builds
    q, k, v = _qkv(3, 3, length, 64, seed=7)
    d_o = torch.randn_like(q)
    before, processes = _stand_ins(), tch.stats.build_processes()["builds"]

    first = _forward_backward(q, k, v, d_o, True)  # no plan yet: torch's attention, while the bucket's builds
    assert _stand_ins() > before
    assert torch.equal(first[0], torch_attention(q, k, v, True))  # flash, not torch's cuDNN backend (a build per length)
    _assert_right(first, q, k, v, d_o, "torch standing in")

    assert tch.registry.wait_for_builds(120) == 0
    _forward_backward(q, k, v, d_o, True)  # the bucket's forward; its backward builds meanwhile (the interpreter stands in)
    assert tch.registry.wait_for_builds(120) == 0
    bucketed = _forward_backward(q, k, v, d_o, True)
    with tch.settings.override(serving_mode=False):
        alone = _forward_backward(q, k, v, d_o, True)
    for got, want in zip(bucketed, alone):
        assert torch.equal(got, want)  # the bucket's plan, as buckets alone give it
    _assert_right(bucketed, q, k, v, d_o, f"bucket {bucket_of(length)}")
    # Built on a build thread of this process: an sdpa's description is the frontend's own JSON, not sent to a build process.
    assert tch.stats.build_processes()["builds"] == processes

    for _ in range(TAKE_OVER_CALLS):
        _forward_backward(q, k, v, d_o, True)
    assert tch.registry.wait_for_builds(120) == 0
    _forward_backward(q, k, v, d_o, True)  # the exact plan's first call; its backward builds meanwhile
    assert tch.registry.wait_for_builds(120) == 0
    exact = _forward_backward(q, k, v, d_o, True)
    with tch.settings.override(attention_buckets=False, serving_mode=False):
        dense = _forward_backward(q, k, v, d_o, True)
    for got, want in zip(exact, dense):
        assert torch.equal(got, want)  # the length's exact plan serves it now
    _assert_right(exact, q, k, v, d_o, "exact plan")


def test_deterministic_calls_never_switch_route(off_path):
    q, k, v = _qkv(3, 3, 1500, 64, seed=8)  # bucket 2048
    d_o = torch.randn_like(q)
    torch.use_deterministic_algorithms(True)
    try:
        before = _stand_ins()
        runs = [_forward_backward(q, k, v, d_o, True) for _ in range(TAKE_OVER_CALLS + 2)]
        assert tch.registry.wait_for_builds(120) == 0
        runs.append(_forward_backward(q, k, v, d_o, True))
        assert _stand_ins() == before  # every call waited for its build instead
    finally:
        torch.use_deterministic_algorithms(False)
    for run in runs[1:]:
        for got, want in zip(run, runs[0]):
            assert torch.equal(got, want)  # one plan for every call: no stand-in, no take-over
    _assert_right(runs[0], q, k, v, d_o, "deterministic")


def test_inference_calls_take_the_same_routes(off_path):
    q, k, v = _qkv(2, 5, 900, 64, seed=9)  # bucket 1024, 5 heads: its own layout
    with torch.no_grad():
        first = sdpa(q, k, v, True)
        assert torch.equal(first, torch_attention(q, k, v, True))
        assert tch.registry.wait_for_builds(120) == 0
        bucketed = sdpa(q, k, v, True)
        for _ in range(TAKE_OVER_CALLS):
            sdpa(q, k, v, True)
        assert tch.registry.wait_for_builds(120) == 0
        exact = sdpa(q, k, v, True)
        with tch.settings.override(attention_buckets=False, serving_mode=False):
            assert torch.equal(exact, sdpa(q, k, v, True))
        with tch.settings.override(serving_mode=False):
            assert torch.equal(bucketed, sdpa(q, k, v, True))
    truth = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    for route, got in (("bucket", bucketed), ("exact plan", exact)):
        _assert_close(got, truth, f"inference, {route}")
