"""Where a build's time goes (registry/build_timing.py), without a GPU: the clock that
charges each interval to its phase, the phase sets, and the registry's record of a
graph's first execution. A real build's record is test_build_timing_gpu.py's."""

import time

import pytest

from torch_cudnn_handle.registry.build import BuiltGraph
from torch_cudnn_handle.registry.build_timing import AFTER_BUILD_PHASES, LIBRARY_PHASES, OBTAIN_PHASES, PHASES, PhaseClock
from torch_cudnn_handle.registry.definition import Definitions
from torch_cudnn_handle.registry.graph_cache import GraphCache
from torch_cudnn_handle.registry.specs import GraphLayout


def test_each_interval_is_charged_to_the_phase_that_ends_it():
    clock = PhaseClock()
    time.sleep(0.02)
    clock.lap("describe")
    clock.lap("plan")
    time.sleep(0.01)
    clock.lap("describe")  # a phase that runs twice (a kernel-cache build redescribed) adds up
    assert set(clock.seconds) == {"describe", "plan"}
    assert clock.seconds["describe"] >= 0.03
    assert clock.seconds["plan"] < clock.seconds["describe"]


def test_an_unknown_phase_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="unknown phase 'build'.*'operation_graph'"):
        PhaseClock().lap("build")


def test_the_phases_split_into_cudnn_work_the_library_share_and_later_calls():
    groups = [set(OBTAIN_PHASES), set(LIBRARY_PHASES), set(AFTER_BUILD_PHASES)]
    assert sum(map(len, groups)) == len(set.union(*groups))  # disjoint
    assert set.union(*groups) == set(PHASES)
    assert set(AFTER_BUILD_PHASES) == {"first_execution", "native_hand_over"}
    assert len(PHASES) == len(set(PHASES))


def built_graph(phase_seconds):
    return BuiltGraph(graph=None, device=0, inputs=(), layout=GraphLayout((), ()), uids=(), workspace_size=0, phase_seconds=phase_seconds)


def test_the_first_execution_is_recorded_once_per_built_graph_and_summed():
    registry = GraphCache(Definitions())
    built = built_graph({"describe": 0.001, "plan": 0.002})
    registry.record_first_execution(built, 0.005)
    registry.record_first_execution(built, 0.5)  # a later launch is no first execution
    assert built.phase_seconds == {"describe": 0.001, "plan": 0.002, "first_execution": 0.005}
    registry.record_first_execution(built_graph({"describe": 0.001}), 0.25)
    assert registry.stats()["phase_seconds"] == {"first_execution": pytest.approx(0.255)}


def test_a_registered_built_graph_has_no_build_to_time():
    registry = GraphCache(Definitions())
    built = built_graph(None)
    registry.record_first_execution(built, 0.005)
    assert built.phase_seconds is None and registry.stats()["phase_seconds"] == {}
