"""The native hand-over's rule in the registry, without a GPU (registry/cache.py): a
pending graph is handed over by one thread however many claim it, the result and its
seconds are published once, and a graph evicted meanwhile stays on the Python path. The
hand-over itself (serialize, register, the call running natively) is
test_native_hand_over_gpu.py's."""

import pytest

import torch_cudnn_handle as tch
from conftest import run_concurrently
from torch_cudnn_handle.registry import _registry
from torch_cudnn_handle.registry.build import NATIVE_PENDING_REASON, BuiltGraph
from torch_cudnn_handle.registry.cache import GraphRegistry, hand_over_when
from torch_cudnn_handle.registry.specs import GraphLayout

KEY = (1, 0, ((4, 8), (8, 1)), False)


def pending_graph() -> BuiltGraph:
    return BuiltGraph(
        graph=None, device=0, inputs=(), layout=GraphLayout((), ()), uids=(), workspace_size=0, path_reason=NATIVE_PENDING_REASON,
        native_pending=True, build_seconds=0.02, phase_seconds={"plan": 0.02, "first_execution": 0.001},
    )


def cached(registry: GraphRegistry, built: BuiltGraph) -> BuiltGraph:
    registry._built[KEY] = built  # as _build_once caches a build
    registry._used_ns[KEY] = 0
    return built


def test_eight_threads_claiming_at_once_hand_over_once():
    registry = GraphRegistry()
    built = cached(registry, pending_graph())
    claims = run_concurrently(lambda _: registry.claim_hand_over(KEY, built), 8)
    assert sorted(claims) == [False] * 7 + [True]
    assert built.native_pending  # claimed, not yet handed over: calls meanwhile run on the Python path
    registry.finish_hand_over(KEY, built, (False, 0, "not serializable (RuntimeError: why)"), {"native_hand_over": 0.004})
    assert (built.native, built.native_pending, built.native_serial) == (False, False, 0)
    assert built.path_reason == "not serializable (RuntimeError: why)"
    assert not registry.claim_hand_over(KEY, built)  # once: a later call finds nothing pending
    stats = registry.stats()
    assert (stats["hand_overs"], stats["native_pending"], stats["python_path"]) == (1, 0, 1)


def test_the_hand_over_is_timed_apart_from_the_build():
    registry = GraphRegistry()
    built = cached(registry, pending_graph())
    assert registry.stats()["native_pending"] == 1
    assert registry.claim_hand_over(KEY, built)
    registry.finish_hand_over(KEY, built, (False, 0, "why"), {"native_hand_over": 0.004})
    assert built.phase_seconds == {"plan": 0.02, "first_execution": 0.001, "native_hand_over": 0.004}
    assert built.build_seconds == 0.02  # the first call's: the hand-over is no part of it
    assert registry.stats()["phase_seconds"] == {"native_hand_over": 0.004}


def test_a_graph_evicted_while_handed_over_stays_on_the_python_path():
    registry = GraphRegistry()
    built = cached(registry, pending_graph())
    assert registry.claim_hand_over(KEY, built)
    registry.drop_built()  # evicted (or dropped) by another thread meanwhile
    registry.finish_hand_over(KEY, built, (False, 0, "backend plan, run from C++"), {"native_hand_over": 0.004})
    assert not built.native and not built.native_pending
    assert built.path_reason.startswith("evicted from the cache while it was handed to the native path"), built.path_reason


def test_when_to_hand_over_is_one_of_two_and_a_typo_says_so():
    assert hand_over_when("second_call") == "second_call" and hand_over_when("build") == "build"
    with pytest.raises(ValueError, match="'build'.*'second_call', got 'first_call'.*TORCH_CUDNN_HANDLE_NATIVE_HAND_OVER"):
        hand_over_when("first_call")
    saved = (_registry.native_enabled, _registry.native_hand_over)
    try:
        with pytest.raises(ValueError, match="got 'later'"):
            tch.set_native_path(True, hand_over="later")
        assert _registry.native_hand_over == saved[1]  # refused: unchanged
        tch.set_native_path(True, hand_over="build")
        assert _registry.native_hand_over == "build"
        tch.set_native_path(True)
        assert _registry.native_hand_over == "build"  # None: unchanged
    finally:
        _registry.native_enabled, _registry.native_hand_over = saved


def test_the_default_is_the_build_and_the_environment_may_say_second_call(monkeypatch):
    monkeypatch.delenv("TORCH_CUDNN_HANDLE_NATIVE_HAND_OVER", raising=False)
    assert GraphRegistry().native_hand_over == "build"
    monkeypatch.setenv("TORCH_CUDNN_HANDLE_NATIVE_HAND_OVER", "second_call")
    assert GraphRegistry().native_hand_over == "second_call"
    monkeypatch.setenv("TORCH_CUDNN_HANDLE_NATIVE_HAND_OVER", "1")
    with pytest.raises(ValueError, match="got '1'"):
        GraphRegistry()
