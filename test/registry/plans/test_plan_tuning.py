"""Plan tuning's cache and settings, which need no GPU: keys, the file, opt-in resolution."""

import json
import os
import subprocess
import sys

import pytest
import torch

import torch_cudnn_handle as tch
from torch_cudnn_handle import settings
from torch_cudnn_handle.registry.plans import tuning as plan_tuning
from torch_cudnn_handle.registry.plans.tuning import cache_key, read_cache, write_cache_entries
from torch_cudnn_handle.registry.routes import Facts, Resolved, decide

LAYOUT = [((2, 16, 32), (512, 32, 1), torch.float16), ((2, 32, 8), (256, 8, 1), torch.float16), ((2, 16, 8), (128, 8, 1), torch.float16)]
KEY_ARGS = dict(backend_version=91900, frontend_version="1.32.0", device="NVIDIA H200 sm90 132SMs", graph_key=1234567, layout=LAYOUT, deterministic=False)


def entry(plan="eng0_k2=1", index=0):
    return {"plan": plan, "index": index, "candidates": 3, "fastest_ms": 0.01, "heuristic_plan": "eng1", "heuristic_ms": 0.02}


def test_the_key_names_every_part_of_a_choice():
    key = cache_key(**KEY_ARGS)
    assert key == cache_key(**dict(KEY_ARGS, layout=[(list(s), list(t), d) for s, t, d in LAYOUT]))  # tuples or lists
    json.loads(key)  # one JSON string
    transposed = [LAYOUT[0], ((2, 32, 8), (256, 1, 32), torch.float16), LAYOUT[2]]
    other_dtype = [LAYOUT[0], LAYOUT[1], ((2, 16, 8), (128, 8, 1), torch.bfloat16)]
    variants = [
        dict(backend_version=91000),
        dict(frontend_version="1.31.0"),
        dict(device="NVIDIA H100 80GB HBM3 sm90 132SMs"),
        dict(graph_key=7654321),
        dict(layout=transposed),
        dict(layout=other_dtype),
        dict(deterministic=True),
    ]
    keys = {key} | {cache_key(**dict(KEY_ARGS, **change)) for change in variants}
    assert len(keys) == 1 + len(variants)


def test_entries_round_trip_through_the_file(tmp_path):
    path = str(tmp_path / "sub" / "tuning.json")  # the directory is created
    assert write_cache_entries(path, {"k": entry()})
    assert read_cache(path) == {"k": entry()}
    document = json.loads(open(path).read())
    assert document["format"] == 1 and document["entries"]["k"]["plan"] == "eng0_k2=1"
    assert sorted(os.listdir(tmp_path / "sub")) == ["tuning.json", "tuning.json.lock"]  # no temp file left behind


def test_a_missing_file_is_a_miss(tmp_path):
    assert read_cache(str(tmp_path / "absent.json")) == {}
    assert read_cache(str(tmp_path)) == {}  # a directory


def test_a_second_writer_merges_with_the_first(tmp_path):
    path = str(tmp_path / "tuning.json")
    assert write_cache_entries(path, {"a": entry("plan_a")})
    assert write_cache_entries(path, {"b": entry("plan_b", 2)})
    assert write_cache_entries(path, {"a": entry("plan_a2", 1)})  # a newer choice replaces its own key only
    assert read_cache(path) == {"a": entry("plan_a2", 1), "b": entry("plan_b", 2)}


def test_concurrent_writer_processes_lose_no_entry(tmp_path):
    path = str(tmp_path / "tuning.json")
    script = (
        "import sys\n"
        "from torch_cudnn_handle.registry.plans.tuning import write_cache_entries\n"
        "for i in range(15):\n"
        "    assert write_cache_entries(sys.argv[1], {f'{sys.argv[2]}-{i}': {'plan': 'p', 'index': i}})\n"
    )
    writers = [subprocess.Popen([sys.executable, "-c", script, path, f"w{n}"]) for n in range(4)]
    assert [writer.wait(timeout=120) for writer in writers] == [0] * 4
    assert sorted(read_cache(path)) == sorted(f"w{n}-{i}" for n in range(4) for i in range(15))


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"\x00\xff garbage", b"[1, 2]", b'{"entries": [1]}', b""],
    ids=["truncated", "binary", "a list", "entries not a dict", "empty"],
)
def test_a_corrupt_file_reads_as_empty_and_is_overwritten(tmp_path, content):
    path = tmp_path / "tuning.json"
    path.write_bytes(content)
    assert read_cache(str(path)) == {}
    assert write_cache_entries(str(path), {"k": entry()})
    assert read_cache(str(path)) == {"k": entry()}


def test_malformed_entries_are_dropped(tmp_path):
    path = tmp_path / "tuning.json"
    good = entry()
    path.write_text(json.dumps({"format": 1, "entries": {"good": good, "no plan": {"index": 0}, "bad index": {"plan": "p", "index": "0"}, "not a dict": 3}}))
    assert read_cache(str(path)) == {"good": good}


def test_another_cudnn_frontend_or_gpu_is_a_miss(tmp_path):
    path = str(tmp_path / "tuning.json")
    write_cache_entries(path, {cache_key(**KEY_ARGS): entry()})
    cached = read_cache(path)
    assert cached.get(cache_key(**KEY_ARGS)) == entry()
    for change in (dict(backend_version=92000), dict(frontend_version="1.33.0"), dict(device="NVIDIA B200 sm100 148SMs"), dict(deterministic=True)):
        assert cached.get(cache_key(**dict(KEY_ARGS, **change))) is None


def test_an_unwritable_cache_warns_and_never_raises(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.warns(UserWarning, match="could not write the plan tuning cache"):
        assert write_cache_entries(str(blocker / "tuning.json"), {"k": entry()}) is False
    assert read_cache(str(blocker / "tuning.json")) == {}


@pytest.mark.parametrize(
    "per_graph, process, env, expected",
    [
        (None, None, {}, False),  # off by default
        (None, None, {"TORCH_CUDNN_HANDLE_TUNE": "1"}, True),
        (None, None, {"TORCH_CUDNN_HANDLE_TUNE": "0"}, False),
        (None, None, {"TORCH_CUDNN_HANDLE_TUNE": "ON"}, True),  # any case of on/off, true/false, 1/0
        (None, True, {"TORCH_CUDNN_HANDLE_TUNE": "0"}, True),  # settings.set_plan_tuning() over the environment
        (None, False, {"TORCH_CUDNN_HANDLE_TUNE": "1"}, False),
        (True, None, {}, True),  # register_graph(tune=True) opts in alone
        (True, False, {"TORCH_CUDNN_HANDLE_TUNE": "0"}, True),
        (False, True, {"TORCH_CUDNN_HANDLE_TUNE": "1"}, False),  # tune=False overrides the process-wide switch
    ],
)
def test_per_graph_beats_set_plan_tuning_beats_the_environment(per_graph, process, env, expected, monkeypatch, fresh_settings):
    monkeypatch.delenv("TORCH_CUDNN_HANDLE_TUNE", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if process is not None:
        settings.set_plan_tuning(process)
    definition = tch.registry.definition(tch.register_graph(lambda g, x: g.relu(x), name="tuned", tune=per_graph))
    assert decide(definition, Resolved.now(), Facts("cuda")).tuned is expected


def test_the_tuning_file_comes_from_the_setter_then_the_environment_then_home(monkeypatch, fresh_settings, tmp_path):
    monkeypatch.delenv("TORCH_CUDNN_HANDLE_TUNING_FILE", raising=False)
    monkeypatch.delenv("TORCH_CUDNN_HANDLE_TUNING_CACHE", raising=False)
    assert plan_tuning.cache_path().startswith(os.path.join(os.path.expanduser("~"), ".cache", "torch_cudnn_handle") + os.sep)
    monkeypatch.setenv("TORCH_CUDNN_HANDLE_TUNING_FILE", str(tmp_path / "env.json"))
    assert plan_tuning.cache_path() == str(tmp_path / "env.json")
    assert settings.set_tuning_file(tmp_path / "mine.json") == str(tmp_path / "env.json")  # the previous value
    assert plan_tuning.cache_path() == str(tmp_path / "mine.json")


def test_tuning_stats_are_a_snapshot_with_the_documented_counters():
    stats = plan_tuning.tuning_stats()
    assert {"tuned", "cache_hits", "cache_misses", "fallbacks", "cache_errors", "tune_seconds", "entries"} <= set(stats)
    stats["entries"]["mine"] = {}
    stats["tuned"] = -1
    again = plan_tuning.tuning_stats()
    assert "mine" not in again["entries"] and again["tuned"] >= 0


def test_the_tuning_setters_refuse_what_is_not_theirs(fresh_settings):
    with pytest.raises(TypeError, match=r"plan_tuning takes True or False, got 'yes' \(str\)"):
        settings.set_plan_tuning("yes")
    with pytest.raises(TypeError, match="got 1 \\(int\\)"):
        settings.set_plan_tuning(1)
    with pytest.raises(ValueError, match="tuning_file takes a file path, got 3"):
        settings.set_tuning_file(3)


def test_a_tuning_file_in_a_missing_directory_creates_it(fresh_settings, tmp_path):
    missing = tmp_path / "no" / "such" / "dir" / "plans.json"
    settings.set_tuning_file(missing)
    assert settings.usable_directory("tuning_file") == str(missing.parent) and missing.parent.is_dir()
