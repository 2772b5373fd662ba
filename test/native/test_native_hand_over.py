"""The native hand-over's state machine without a GPU (native/binding.py, Note [The native
hand-over]): a pending graph is handed over by one thread however many claim it, the
result is published once, a graph evicted meanwhile stays on the Python path, and the
settings say when. The hand-over itself (serialize, register, the call running natively)
is test_native_hand_over_gpu.py's."""

import pytest

import torch_cudnn_handle as tch
from conftest import run_concurrently
from torch_cudnn_handle.native import HandOverSource, NativeBinding
from torch_cudnn_handle.native.binding import PENDING_REASON


def pending_binding() -> NativeBinding:
    source = HandOverSource(graph=None, graph_id=1, device=0, inputs=(), outputs=(), output_positions=(), uids=(), deterministic=False)
    return NativeBinding("pending", PENDING_REASON, source)


def test_eight_threads_claiming_at_once_hand_over_once():
    binding = pending_binding()
    claims = run_concurrently(lambda _: binding.claim(), 8)
    assert sorted(claims) == [False] * 7 + [True]
    assert binding.pending  # claimed, not yet handed over: calls meanwhile run on the Python path
    binding.finish(False, 0, "not serializable (RuntimeError: why)")
    assert (binding.state, binding.serial) == ("python", 0)
    assert binding.reason == "not serializable (RuntimeError: why)"
    assert not binding.claim()  # once: a later call finds nothing pending


def test_a_graph_evicted_while_handed_over_stays_on_the_python_path():
    binding = pending_binding()
    assert binding.claim()
    binding.on_evict()  # evicted by another thread meanwhile
    assert binding.pending  # the hand-over in flight decides
    binding.finish(False, 0, "backend plan, run from C++")
    assert not binding.native and not binding.pending
    assert binding.reason.startswith("evicted from the graph cache while it was handed to the native path"), binding.reason


def test_a_disabled_native_path_and_bool_operands_stay_on_the_python_path():
    source = pending_binding()._source
    assert NativeBinding.on_build(source, when="never", has_bool=False).reason == "native path disabled"
    assert "Note [Bit-packed booleans]" in NativeBinding.on_build(source, when="at_build", has_bool=True).reason


def test_when_to_hand_over_is_one_of_two_and_a_typo_says_so(fresh_settings):
    with pytest.raises(ValueError, match=r"native_hand_over takes 'build' or 'second_call', got 'later'"):
        tch.settings.set_native_hand_over("later")
    assert fresh_settings.get("native_hand_over") == "build"  # refused: unchanged
    assert tch.settings.set_native_hand_over("second_call") == "build"  # the previous value
    assert fresh_settings.get("native_hand_over") == "second_call"


def test_the_default_is_the_build_and_the_environment_may_say_second_call(monkeypatch, fresh_settings):
    monkeypatch.delenv("TORCH_CUDNN_HANDLE_NATIVE_HAND_OVER", raising=False)
    assert fresh_settings.get("native_hand_over") == "build"
    monkeypatch.setenv("TORCH_CUDNN_HANDLE_NATIVE_HAND_OVER", "second_call")
    assert fresh_settings.get("native_hand_over") == "second_call"
    monkeypatch.setenv("TORCH_CUDNN_HANDLE_NATIVE_HAND_OVER", "1")
    with pytest.raises(ValueError, match=r"TORCH_CUDNN_HANDLE_NATIVE_HAND_OVER='1' is not a valid value; it takes 'build' or 'second_call'"):
        fresh_settings.get("native_hand_over")
