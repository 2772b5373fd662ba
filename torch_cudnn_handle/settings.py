"""torch_cudnn_handle's settings: every environment variable the library reads, and its setter.

``SETTINGS`` names each setting once: its variable, kind, default and meaning (README.md's
table is checked against it). A value comes from, first to last: ``set(name, value)`` (or
its named setter below), the environment variable (read at each use, so a launcher or a
test may change it), the default; a per-graph option of ``register_graph`` (``tune=``,
``dynamic_shapes=``, ``reference=``, ``serving_mode=``) wins over all three
(``resolve``). Setters return the previous value.

Variables are parsed strictly (a boolean takes ``0/1/true/false/on/off`` in any case; an empty
value is unset): anything else is a ``SettingError`` (naming the variable, the value and what it
takes) at its first read, never at import. ``check_all`` reads them all (the main job does,
first). An unusable directory is one warning, and its feature is off. Old spellings
(``old_variables``, ``set_background_builds``) work for a release, with a DeprecationWarning.

Thread safety: ``set`` is atomic; a reader sees the old value or the new one. Build-time
variables (``TORCH_CUDNN_HANDLE_DEBUG``, ``MAX_JOBS``, ``CUDNN_INCLUDE_DIR``) are setup.py's.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

__all__ = [
    "SETTINGS", "Setting", "SettingError", "check_all", "get", "set", "reset", "override", "resolve", "watch", "usable_directory", "set_native_path",
    "set_native_hand_over", "set_native_cuda_graphs", "set_dynamic_shapes", "set_plan_store", "set_plan_store_dir", "set_plan_tuning", "set_tuning_file",
    "set_graph_cache_capacity", "set_stand_in_calls", "set_serving_mode", "set_build_process", "set_attention_buckets", "set_verify", "set_reference_path",
]

_TRUE, _FALSE = ("1", "true", "on"), ("0", "false", "off")


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    variable: str
    kind: str  # "bool" | "choice" | "int" (at least 1) | "count" (at least 0) | "directory" | "file"
    default: Any
    meaning: str
    choices: Tuple[str, ...] = ()
    old_variables: Tuple[str, ...] = ()  # deprecated spellings, read with a DeprecationWarning

    def accepts(self) -> str:
        return " or ".join(map(repr, self.choices)) if self.kind == "choice" else _ACCEPTS[self.kind]


_ACCEPTS = dict(bool="0/1/true/false/on/off (any case)", int="a positive integer (at least 1)", count="a whole number (0 or more)",
                directory="a directory path", file="a file path")


class SettingError(ValueError):
    """A setting's variable holds a value it does not take; the message names the variable,
    the value and what it takes."""


_CACHE = os.path.join("~", ".cache", "torch_cudnn_handle")

SETTINGS: Tuple[Setting, ...] = (
    Setting("native_path", "TORCH_CUDNN_HANDLE_NATIVE", "bool", True,
            "run backend plans from C++, with no Python per call (graphs built from now on; CUDA builds only)"),
    Setting("native_hand_over", "TORCH_CUDNN_HANDLE_NATIVE_HAND_OVER", "choice", "build",
            "when a plan moves to the native path: at its build, or at its second call", choices=("build", "second_call")),
    Setting("native_cuda_graphs", "TORCH_CUDNN_HANDLE_NATIVE_CUDA_GRAPHS", "bool", True, "launch a native plan as a CUDA graph once a call's addresses repeat"),
    Setting("dynamic_shapes", "TORCH_CUDNN_HANDLE_DYNAMIC_SHAPES", "bool", False,
            "build with dynamic shapes and a kernel cache per graph structure (cuDNN 9.21 or newer)"),
    Setting("plan_store", "TORCH_CUDNN_HANDLE_PLAN_STORE", "bool", True,
            "keep built plans on disk, so later processes load them instead of building",
            old_variables=("TORCH_CUDNN_HANDLE_PLAN_CACHE",)),
    Setting("plan_store_dir", "TORCH_CUDNN_HANDLE_PLAN_STORE_DIR", "directory", os.path.join(_CACHE, "plans"),
            "where the plan store keeps its files", old_variables=("TORCH_CUDNN_HANDLE_CACHE_DIR",)),
    Setting("plan_tuning", "TORCH_CUDNN_HANDLE_TUNE", "bool", False, "time every candidate plan of a new graph once and keep the fastest"),
    Setting("tuning_file", "TORCH_CUDNN_HANDLE_TUNING_FILE", "file", os.path.join(_CACHE, "plan_tuning.json"),
            "the JSON file that keeps tuned plan choices", old_variables=("TORCH_CUDNN_HANDLE_TUNING_CACHE",)),
    Setting("graph_cache_capacity", "TORCH_CUDNN_HANDLE_GRAPH_CACHE_CAPACITY", "int", 1024, "built graphs kept in memory; the least recently used is evicted first"),
    Setting("stand_in_calls", "TORCH_CUDNN_HANDLE_STAND_IN_CALLS", "count", 2,
            "a new layout's first N calls run in torch's ops (nn modules) while its plan builds off the caller's path; call N+1 waits for it"),
    Setting("serving_mode", "TORCH_CUDNN_HANDLE_SERVING_MODE", "bool", False,
            "timing-dependent: torch ops serve a new layout until its plan, built off the caller's path, is ready (which calls they serve depends on the build's time)",
            old_variables=("TORCH_CUDNN_HANDLE_BACKGROUND_BUILDS",)),
    Setting("build_process", "TORCH_CUDNN_HANDLE_BUILD_PROCESS", "bool", True,
            "background builds run cuDNN's build in a helper process, so this process's Python does not wait on it (Note [The build process])"),
    Setting("attention_buckets", "TORCH_CUDNN_HANDLE_ATTENTION_BUCKETS", "bool", False,
            "nn.sdpa serves a new sequence length from one ragged plan per length bucket, with no build (Note [Length buckets])"),
    Setting("verify", "TORCH_CUDNN_HANDLE_VERIFY", "bool", False, "check each plan's first run at each layout against the torch interpreter (synchronizes then)"),
    Setting("reference_path", "TORCH_CUDNN_HANDLE_REFERENCE", "bool", False,
            "run CUDA calls through the torch interpreter instead of cuDNN (debugging; graphs built from now on)"),
)

_BY_NAME: Dict[str, Setting] = {s.name: s for s in SETTINGS}
_lock = threading.Lock()
_overrides: Dict[str, Any] = {}  # name -> the value set() gave
_watchers: Dict[str, List[Callable[[Any], None]]] = {}  # name -> called with each new value
_warned: set = set()  # (variable or setting, value) already warned about


def _setting(name: str) -> Setting:
    if name not in _BY_NAME:  # an earlier release's name is said so
        renamed = " (renamed 'serving_mode': its route depends on build timing)" if name == "background_builds" else ""
        raise KeyError(f"torch_cudnn_handle.settings: no setting {name!r}{renamed}; the settings are {', '.join(_BY_NAME)}")
    return _BY_NAME[name]


def _parse(setting: Setting, text: str, where: str) -> Any:
    """An environment value of ``setting`` (``where`` names the variable), strictly."""
    value = text.strip()
    if setting.kind == "bool" and value.lower() in _TRUE + _FALSE:
        return value.lower() in _TRUE
    if setting.kind == "choice" and value in setting.choices:
        return value
    if setting.kind in ("int", "count") and value.isdigit() and int(value) >= (setting.kind == "int"):
        return int(value)
    if setting.kind in ("directory", "file"):
        return os.path.expanduser(value)
    raise SettingError(f"{where}={text!r} is not a valid value; it takes {setting.accepts()} ({setting.meaning}); "
                       f"set it to one of those, or unset it for the default")


def _from_environment(setting: Setting) -> Tuple[bool, Any]:
    """(found, value) of the setting's variable, or of a deprecated spelling of it."""
    for variable in (setting.variable, *setting.old_variables):
        text = os.environ.get(variable)
        if text is None or not text.strip():
            continue
        if variable != setting.variable:
            _warn_once((variable, "deprecated"), f"{variable} is deprecated and will be removed in the next release; set "
                       f"{setting.variable} instead", DeprecationWarning)
        return True, _parse(setting, text, variable)
    return False, None


def get(name: str) -> Any:
    """The value of setting ``name`` now: set() > environment variable > default."""
    setting = _setting(name)
    with _lock:
        if name in _overrides:
            return _overrides[name]
    found, value = _from_environment(setting)
    if found:
        return value
    return os.path.expanduser(setting.default) if setting.kind in ("directory", "file") else setting.default


def check_all() -> List[str]:
    """Every setting read now: the message of each whose variable is bad (``SettingError``), in table order."""
    problems = []
    for setting in SETTINGS:
        try:
            get(setting.name)
        except SettingError as error:
            problems.append(str(error))
    return problems


def resolve(name: str, per_graph: Optional[Any]) -> Any:
    """A per-graph choice (a ``register_graph`` option) if made, else ``get(name)``."""
    return get(name) if per_graph is None else per_graph


def _checked(setting: Setting, value: Any) -> Any:
    if (setting.kind == "bool" and isinstance(value, bool)) or (setting.kind == "choice" and value in setting.choices) or (
            setting.kind in ("int", "count") and isinstance(value, int) and not isinstance(value, bool) and value >= (setting.kind == "int")):
        return value
    if setting.kind in ("directory", "file") and isinstance(value, (str, os.PathLike)):
        return os.path.expanduser(os.fspath(value))
    raise (TypeError if setting.kind == "bool" else ValueError)(
        f"torch_cudnn_handle.settings: {setting.name} takes "
        f"{'True or False' if setting.kind == 'bool' else setting.accepts()}, got {value!r} ({type(value).__name__})"
    )


def set(name: str, value: Any) -> Any:  # noqa: A001 -- settings.set(name, value), as the module reads
    """Set ``name`` for this process (over its environment variable); returns the previous value."""
    setting = _setting(name)
    value = _checked(setting, value)
    previous = get(name)
    with _lock:
        _overrides[name] = value
        watchers = list(_watchers.get(name, ()))
    for watcher in watchers:
        watcher(value)
    return previous


def reset(name: Optional[str] = None) -> None:
    """Forget what set() gave ``name`` (every setting when None, and the warnings given once
    are armed again): back to the environment and defaults."""
    names = [name] if name is not None else list(_BY_NAME)
    if name is None:
        with _lock:
            _warned.clear()
    for each in names:
        _setting(each)
        with _lock:
            had = _overrides.pop(each, None) is not None
            watchers = list(_watchers.get(each, ())) if had else []
        for watcher in watchers:
            watcher(get(each))


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Set settings for the duration of a ``with`` block, then put back what was there."""
    with _lock:
        before = {name: (_overrides[name] if name in _overrides else _UNSET) for name in values}
    try:
        for name, value in values.items():
            set(name, value)
        yield
    finally:
        for name, old in before.items():
            if old is _UNSET:
                reset(name)
            else:
                set(name, old)


_UNSET = object()


def watch(name: str, watcher: Callable[[Any], None]) -> None:
    """Call ``watcher(value)`` on every later set()/reset() of ``name``, not now (an import reads
    no variable): how a setting that lives in C++ (the CUDA-graph switch) follows this table."""
    _setting(name)
    with _lock:
        _watchers.setdefault(name, []).append(watcher)


def usable_directory(name: str) -> Optional[str]:
    """The directory a ``directory`` or ``file`` setting names (a file's own folder for the
    latter), created if missing; None, after one warning naming it, when it cannot be
    created or written (the feature using it is then off)."""
    setting = _setting(name)
    path = get(name)
    directory = os.path.abspath(path if setting.kind == "directory" else os.path.dirname(os.path.abspath(path)))
    try:
        os.makedirs(directory, exist_ok=True)
        problem = None if os.access(directory, os.W_OK | os.X_OK) else "it is not writable"
    except OSError as error:
        problem = f"it cannot be created ({error.strerror or error})"
    if problem is None:
        return directory
    _warn_once((name, directory), f"torch_cudnn_handle: the {setting.name} directory {directory!r} is unusable: {problem}; "
               f"{setting.meaning} is off until {setting.variable} (or settings.set({setting.name!r}, ...)) names a writable one", RuntimeWarning)
    return None


def _warn_once(key, message: str, category) -> None:
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, category, stacklevel=4)


# -- the named setters: one per setting, each returning the previous value -------------


def _setter(name: str, what: str):
    def setter(value):
        return set(name, value)

    setter.__name__ = setter.__qualname__ = f"set_{name}"
    setter.__doc__ = f"{what} (the ``{name}`` setting, ``{_BY_NAME[name].variable}``); returns the previous value."
    return setter


set_native_path = _setter("native_path", "Whether graphs built from now on may run natively, from C++ (CUDA builds only)")
set_native_hand_over = _setter("native_hand_over", "When a graph moves to the native path: 'build' or 'second_call' (Note [The native hand-over])")
set_native_cuda_graphs = _setter("native_cuda_graphs", "Launch native plans as CUDA graphs (Note [Native CUDA graph launch])")
set_dynamic_shapes = _setter("dynamic_shapes", "Build graphs from now on with dynamic shapes and a kernel cache")
set_plan_store = _setter("plan_store", "Keep built plans on disk and load them from there")
set_plan_store_dir = _setter("plan_store_dir", "The plan store's directory")
set_plan_tuning = _setter("plan_tuning", "Tune graphs built from now on (tune=False graphs excepted)")
set_tuning_file = _setter("tuning_file", "The JSON file tuned choices persist in")
set_graph_cache_capacity = _setter("graph_cache_capacity", "How many built graphs are kept (least recently used evicted first)")
set_stand_in_calls = _setter("stand_in_calls", "A new layout's first N calls on a stand-in while its plan builds; call N+1 waits (0: build in the call)")
set_serving_mode = _setter("serving_mode", "Serving mode (timing-dependent): a stand-in serves a new layout until its plan, built off the caller's path, is ready")
set_build_process = _setter("build_process", "Run background builds of backend-only graphs in a helper process")
set_attention_buckets = _setter("attention_buckets", "Serve nn.sdpa's new lengths from one plan per length bucket")
set_verify = _setter("verify", "Check each plan's first run at each layout against the torch interpreter")
set_reference_path = _setter("reference_path", "Run every CUDA call through the torch interpreter instead of cuDNN (graphs built are dropped)")


def __getattr__(name: str):
    if name != "set_background_builds":  # an earlier release's name of the serving mode's setter
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn("settings.set_background_builds is deprecated; call settings.set_serving_mode", DeprecationWarning, stacklevel=2)
    return set_serving_mode


def frontend_dumps_tensors() -> bool:
    """Whether the frontend logs a plan's ``tensors_to_dump`` per execute: levels 1-9 of its
    own ``CUDNN_FRONTEND_LOG_INFO`` (atoi: not a number is 0). The frontend's variable, read here."""
    level = os.environ.get("CUDNN_FRONTEND_LOG_INFO", "0").strip()
    return level.isdigit() and 1 <= int(level) < 10
