"""settings.py, the one owner of every setting: each variable parsed strictly with a clear
error, setters returning the previous value, the order setter > environment > default, a
per-graph choice over all three, old spellings deprecated, unusable directories one
warning, and watchers (the C++ CUDA-graph switch, the graph cache's capacity) following."""

import os
import warnings

import pytest

from torch_cudnn_handle import settings
from torch_cudnn_handle.settings import SETTINGS

BOOLS = [s for s in SETTINGS if s.kind == "bool"]
BAD = {"bool": ["yes", "2", "abc", "enable", "t"], "choice": ["first_call", "Build", "1"], "int": ["0", "-3", "1.5", "many"],
       "count": ["-1", "1.5", "many"]}


@pytest.fixture(autouse=True)
def clean(monkeypatch, fresh_settings):
    for setting in SETTINGS:
        for variable in (setting.variable, *setting.old_variables):
            monkeypatch.delenv(variable, raising=False)


def test_one_row_per_setting_and_per_variable():
    assert len({s.name for s in SETTINGS}) == len(SETTINGS)
    variables = [v for s in SETTINGS for v in (s.variable, *s.old_variables)]
    assert len(set(variables)) == len(variables) and all(v.startswith("TORCH_CUDNN_HANDLE_") for v in variables)
    assert all(s.meaning and s.kind in ("bool", "choice", "int", "count", "directory", "file") for s in SETTINGS)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_the_default_stands_until_something_says_otherwise(setting):
    expected = os.path.expanduser(setting.default) if setting.kind in ("directory", "file") else setting.default
    assert settings.get(setting.name) == expected


@pytest.mark.parametrize("setting", BOOLS, ids=lambda s: s.name)
@pytest.mark.parametrize("text, value", [("1", True), ("true", True), ("ON", True), ("True", True), ("0", False), ("false", False), ("Off", False), (" on ", True)])
def test_a_boolean_takes_every_spelling_in_any_case(setting, text, value, monkeypatch):
    monkeypatch.setenv(setting.variable, text)
    assert settings.get(setting.name) is value


@pytest.mark.parametrize("setting, text", [(s, t) for s in SETTINGS for t in BAD.get(s.kind, [])], ids=str)
def test_a_bad_value_raises_naming_the_variable_the_value_and_what_it_takes(setting, text, monkeypatch):
    monkeypatch.setenv(setting.variable, text)
    with pytest.raises(ValueError) as raised:
        settings.get(setting.name)
    message = str(raised.value)
    assert setting.variable in message and repr(text) in message and setting.accepts() in message, message


def test_an_empty_value_counts_as_unset(monkeypatch):
    monkeypatch.setenv("TORCH_CUDNN_HANDLE_NATIVE", "")
    assert settings.get("native_path") is True


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_the_setter_wins_over_the_environment_and_returns_the_previous_value(setting, monkeypatch):
    choices = setting.choices or ("",)
    value = {"bool": not setting.default, "choice": choices[-1], "int": 7, "count": 0, "directory": "/tmp/d", "file": "/tmp/f.json"}[setting.kind]
    env_text = {"bool": "1" if setting.default is False else "0", "choice": choices[0], "int": "3", "count": "5", "directory": "/tmp/e",
                "file": "/tmp/e.json"}[setting.kind]
    monkeypatch.setenv(setting.variable, env_text)
    from_env = settings.get(setting.name)
    setter = getattr(settings, f"set_{setting.name}")
    assert setter(value) == from_env
    assert settings.get(setting.name) == value
    assert setter(value) == value
    settings.reset(setting.name)
    assert settings.get(setting.name) == from_env


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_a_setter_refuses_what_is_not_its_kind_and_changes_nothing(setting):
    before = settings.get(setting.name)
    wrong = {"bool": "yes", "choice": "nope", "int": 0, "count": -1, "directory": 3, "file": None}[setting.kind]
    with pytest.raises((TypeError, ValueError), match=f"{setting.name} takes"):
        settings.set(setting.name, wrong)
    assert settings.get(setting.name) == before


def test_an_unknown_setting_names_the_known_ones():
    with pytest.raises(KeyError, match="no setting 'plan_cache'; the settings are native_path, "):
        settings.get("plan_cache")


def test_the_serving_modes_old_names_say_its_new_one():
    with pytest.warns(DeprecationWarning, match="set_background_builds is deprecated; call settings.set_serving_mode"):
        old_setter = settings.set_background_builds
    old_setter(True)
    assert settings.get("serving_mode") is True
    with pytest.raises(KeyError, match="no setting 'background_builds' \\(renamed 'serving_mode': its route depends on build timing\\)"):
        settings.get("background_builds")
    with pytest.raises(AttributeError, match="has no attribute 'set_nothing'"):
        settings.set_nothing


def test_a_per_graph_choice_wins_over_everything(monkeypatch):
    monkeypatch.setenv("TORCH_CUDNN_HANDLE_TUNE", "1")
    settings.set_plan_tuning(True)
    assert settings.resolve("plan_tuning", False) is False and settings.resolve("plan_tuning", None) is True


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.old_variables], ids=lambda s: s.name)
def test_an_old_spelling_still_works_with_a_deprecation_warning_naming_the_new(setting, monkeypatch):
    old = setting.old_variables[0]
    monkeypatch.setenv(old, {"bool": "0", "directory": "/tmp/old", "file": "/tmp/old.json"}[setting.kind])
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated.*set {setting.variable} instead"):
        value = settings.get(setting.name)
    assert value == {"bool": False, "directory": "/tmp/old", "file": "/tmp/old.json"}[setting.kind]
    monkeypatch.setenv(setting.variable, {"bool": "1", "directory": "/tmp/new", "file": "/tmp/new.json"}[setting.kind])
    assert settings.get(setting.name) == {"bool": True, "directory": "/tmp/new", "file": "/tmp/new.json"}[setting.kind]  # the new one wins


def test_override_puts_back_what_was_there():
    settings.set_plan_store(False)
    with settings.override(plan_store=True, plan_tuning=True):
        assert settings.get("plan_store") is True and settings.get("plan_tuning") is True
    assert settings.get("plan_store") is False and settings.get("plan_tuning") is False


def test_an_unwritable_directory_is_one_warning(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("this user writes anywhere (root): a read-only directory cannot be made here")
        settings.set_tuning_file(locked / "plans.json")
        with pytest.warns(RuntimeWarning, match=r"tuning_file directory .*locked' is unusable: it is not writable"):
            assert settings.usable_directory("tuning_file") is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert settings.usable_directory("tuning_file") is None
    finally:
        locked.chmod(0o700)


def test_a_watcher_follows_every_change():
    seen = []
    settings.watch("dynamic_shapes", seen.append)
    settings.set_dynamic_shapes(True)
    settings.reset("dynamic_shapes")
    assert seen == [True, False]  # on each change, not when registered (registering reads no variable)


def test_the_import_reads_no_variable_and_each_is_checked_at_its_first_read():
    """Every bad value surfaces at the same moment, its first read (settings.py's docstring):
    never at import, whatever the setting, and check_all names every bad one."""
    import subprocess
    import sys

    bad = {s.variable: BAD[s.kind][0] for s in SETTINGS if s.kind in BAD}
    script = (
        "import torch_cudnn_handle as tch\n"
        "from torch_cudnn_handle import settings\n"
        "print(len(settings.check_all()))\n"
        "for s in settings.SETTINGS:\n"
        "    try:\n"
        "        settings.get(s.name)\n"
        "    except settings.SettingError as error:\n"
        "        print(s.variable, '|', error)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], env={**os.environ, **bad}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    count, *lines = result.stdout.splitlines()
    assert int(count) == len(bad) == len(lines)
    assert {line.split(" | ")[0] for line in lines} == set(bad)
    assert all(f"{variable}={bad[variable]!r} is not a valid value" in line for line in lines for variable in [line.split(" | ")[0]])


def test_the_graph_cache_capacity_setting_evicts_at_once():
    import torch_cudnn_handle as tch

    capacity = tch.stats.graphs()["capacity"]
    assert settings.set_graph_cache_capacity(3) == capacity
    assert tch.stats.graphs()["capacity"] == 3
