"""The top-level names of the last release (torch_cudnn_handle/_deprecated.py): each still
works for one release and warns, naming its replacement; the plan store's old route name
stays in the old stats function."""

from __future__ import annotations

import pytest

import torch_cudnn_handle as tch
from torch_cudnn_handle import settings, stats

OLD_NAMES = ["set_native_path", "set_native_cuda_graphs", "set_dynamic_shapes", "set_plan_cache", "set_plan_tuning",
             "set_cache_capacity", "registry_stats", "pool_stats", "tuning_stats", "native_cuda_graph_stats"]


@pytest.mark.parametrize("name", OLD_NAMES)
def test_an_old_name_is_not_public_but_still_resolves(name):
    assert name not in tch.__all__
    assert callable(getattr(tch, name))


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'set_plan_stor'"):
        tch.set_plan_stor  # noqa: B018


def test_an_old_setter_warns_naming_its_replacement_and_sets_the_new_setting(fresh_settings, tmp_path):
    before = settings.get("plan_store")
    with pytest.warns(DeprecationWarning, match=r"set_plan_cache is deprecated.*settings\.set_plan_store\(enabled\)"):
        assert tch.set_plan_cache(not before, str(tmp_path)) is before  # the previous value, as the new setter returns
    assert settings.get("plan_store") is (not before)
    assert settings.get("plan_store_dir") == str(tmp_path)
    with pytest.warns(DeprecationWarning, match=r"set_cache_capacity is deprecated.*set_graph_cache_capacity"):
        tch.set_cache_capacity(7)
    assert settings.get("graph_cache_capacity") == 7


def test_registry_stats_keeps_the_old_disk_names(monkeypatch):
    # Plan sources are counted only where graphs build (a GPU): the counts given here, the renaming real.
    real = stats.graphs
    monkeypatch.setattr(stats, "graphs", lambda: dict(real(), plan_sources={"static": 2, "plan_store": 3, "build_process": 1}))
    with pytest.warns(DeprecationWarning, match=r"registry_stats is deprecated.*stats\.graphs\(\) and stats\.plan_store\(\)"):
        old = tch.registry_stats()
    new = stats.graphs()
    assert {key for key in old if not key.startswith("disk_")} == set(new)
    assert {f"disk_{name}" for name in stats.plan_store()} <= set(old)
    assert old["routes"] == {"static": 2, "disk_cache": 3, "build_process": 1}  # plan sources, the plan store's under its old name
    assert new["plan_sources"]["plan_store"] == 3  # the new function's dict is not changed by the old one
