"""``Route``: how the calls of one graph at one layout are served, and ``decide``, the one function that says so.

Note [One route per call]: a call's route is one frozen value: where it runs (cuDNN or
the torch interpreter), where its plan comes from (the plan store, a build process, a
kernel cache or a static build; tuned or not; among deterministic engines or not), where
that plan builds and who serves the calls until it is ready (the call waits, or a named
stand-in serves), when the native path takes it, whether verify mode checks its first
launch, and which buckets serve its sizes. ``decide`` computes it from three things and
nothing else: the graph's definition (its per-graph choices), the settings (``Resolved``,
read once into a frozen record) and the call's facts (``Facts``: its device, deterministic
mode, a capture, a trace, the stand-in its caller has). The graph cache decides it at a
layout's first lookup (and again for a call that meets that layout still building, whose
facts may differ: a capture waits) and keeps it on the built graph; build.py, plans/, the
native binding, the Python path and nn.sdpa read it, and the C++ kernel runs the plan the
route handed it; none of them decides again. Each choice carries the setting or fact
that made it (``why``), which ``tch.explain`` prints without building.

One rule per setting: ``stand_in_calls`` and ``serving_mode`` (each over its
``register_graph`` option) let a stand-in serve while a plan builds on a build thread, for
a caller that has one (a graph's torch stand-in, nn.sdpa's torch attention; the
interpreter only for a graph that asks with its own count): a layout's first N calls, or
until the plan is ready (the serving mode), never under deterministic algorithms, a
capture or a trace (Note [A new layout's first calls], first_calls.py); ``build_process``
sends such a build to a helper process when it is static and untuned; ``attention_buckets``
serves nn.sdpa's self-attention from length buckets, and in the serving mode a length's
``TAKE_OVER_CALLS``-th bucketed call starts its exact plan.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Tuple

from .. import settings

__all__ = ["Route", "Facts", "Resolved", "decide", "TAKE_OVER_CALLS"]

TAKE_OVER_CALLS = 16  # nn.sdpa: a length's bucketed calls before its exact plan builds (Note [Attention off the caller's path])


@dataclasses.dataclass(frozen=True)
class Resolved:
    """The settings a route reads, each read once (``now``): a frozen record."""

    reference_path: bool = False
    plan_store: bool = True
    build_process: bool = True
    dynamic_shapes: bool = False
    plan_tuning: bool = False
    serving_mode: bool = False
    stand_in_calls: int = 0
    attention_buckets: bool = False
    native_path: bool = True
    native_hand_over: str = "build"
    verify: bool = False

    @classmethod
    def now(cls) -> "Resolved":
        return cls(**{field.name: settings.get(field.name) for field in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class Facts:
    """What a call is, as far as its route goes."""

    device: str = "cuda"  # "cuda" | "cpu" | "shapes" (meta and fake tensors: the fake kernel describes, nothing runs)
    deterministic: bool = False  # torch.use_deterministic_algorithms(True)
    capturing: bool = False  # the device's current stream captures a CUDA graph
    compiling: bool = False  # traced by torch.compile
    stand_in: str = ""  # what the caller can serve a call with while its plan builds: "interpreter", "torch_attention", "" (nothing)
    uniform_lengths: bool = False  # nn.sdpa: q, k and v of one shape, which length buckets serve
    with_cuda: bool = True  # the extension was built with CUDA (else there is no native path)
    background_failed: bool = False  # this layout's background build failed: it builds in the caller's path, which sees the error


@dataclasses.dataclass(frozen=True)
class Route:
    """How a call is served; ``why`` holds, per choice, the setting or fact that made it."""

    runs_on: str  # "cudnn" | "interpreter" | "shapes"
    plan_from: Tuple[str, ...] = ()  # tried in order: "plan_store", "build_process", then "kernel_cache" or "static"; ("registered",)
    tuned: bool = False  # every candidate plan timed, the fastest kept
    deterministic: bool = False  # among the engines cuDNN does not mark nondeterministic
    build_on: str = ""  # "caller" (the call waits) | "build_thread" (a stand-in serves) | "refused" (a capture) | "" (nothing to build)
    stand_in: str = ""  # who serves the calls while the plan builds: "interpreter", "torch_attention"; "": they wait
    stand_in_calls: int = 0  # how many: N (a layout's first N calls; call N+1 waits: reproducible), -1 (until ready: timing), 0
    native: str = "never"  # when the native path takes the plan: "at_build" | "second_call" | "never"
    verify: bool = False  # the plan's first launch checked against the interpreter
    buckets: str = ""  # "size" (register_graph(buckets=)) | "length" (nn.sdpa's attention_buckets) | ""
    take_over_after: int = 0  # nn.sdpa: a length's bucketed calls before its exact plan builds (0: never)
    why: Tuple[Tuple[str, str], ...] = ()  # (choice, the setting or fact that made it)

    @functools.cached_property
    def label(self) -> str:
        """A short name of the route, what ``stats.graphs()["routes"]`` counts calls by."""
        if self.runs_on != "cudnn":
            return self.runs_on + ("/length_buckets" if self.buckets == "length" else "")
        parts = ["cudnn", "+".join(self.plan_from)]
        if self.stand_in:
            parts.append(f"stand_in={self.stand_in}" + ("" if self.stand_in_calls < 0 else f"x{self.stand_in_calls}"))
        if self.buckets:
            parts.append(f"{self.buckets}_buckets")
        parts.append(f"native@{self.native}" if self.native != "never" else "python_path")
        return "/".join(parts)

    def explain(self) -> str:
        """The route in words: one line per choice, with what made it."""
        return "\n".join([f"route: {self.label}"] + [f"  {choice}: {reason}" for choice, reason in self.why])

    def __str__(self) -> str:
        return self.explain()


def _chosen(definition, option: str, setting: str, resolved: Resolved) -> Tuple[bool, str]:
    """A per-graph option of ``register_graph`` if given, else the setting: (value, the reason)."""
    given = getattr(definition, option)
    if given is not None:
        return bool(given), f"register_graph({option}={given!r})"
    value = getattr(resolved, setting)
    return bool(value), f"the {setting} setting is {'on' if value else 'off'}"


def decide(definition, resolved: Resolved, facts: Facts) -> Route:
    """The route of a call of ``definition`` (a registry Definition: its per-graph choices)
    under ``resolved`` settings with ``facts`` (Note [One route per call])."""
    why = []
    buckets, take_over = "", 0
    if definition.buckets is not None:
        buckets = "size"
        why.append(("size buckets", "register_graph(buckets=...): inputs padded to their bucket's plan, outputs narrowed back"))
    elif facts.uniform_lengths and resolved.attention_buckets:
        buckets = "length"
        why.append(("length buckets", "the attention_buckets setting is on, and q, k and v have one shape"))
    if facts.device != "cuda":
        where = ("interpreter", "the inputs are CPU tensors: the op's CPU kernel runs the interpreter") if facts.device == "cpu" else (
            "shapes", "meta or fake tensors: the fake kernel describes the graph, nothing runs or builds")
        why.append(("runs on", where[1]))
        return Route(where[0], buckets=buckets, why=tuple(why))
    reference, reason = _chosen(definition, "reference", "reference_path", resolved)
    if reference:
        why.append(("runs on", f"the torch interpreter, never cuDNN: {reason}"))
        return Route("interpreter", buckets=buckets, why=tuple(why))
    why.append(("runs on", f"cuDNN: CUDA tensors, and {reason}"))
    if definition.builder is None:  # a registered built graph: its plan is the one registered, run on the Python path
        why.append(("plan from", "register_built_graph: the graph registered, built"))
        return Route("cudnn", ("registered",), buckets=buckets, why=tuple(why))

    stand_in, calls, reason = _stand_in(definition, resolved, facts)
    why.append(("until the plan is ready", reason))
    tuned, tuned_reason = _chosen(definition, "tune", "plan_tuning", resolved)
    kernel_cache, cache_reason = _chosen(definition, "dynamic_shapes", "dynamic_shapes", resolved)
    plan_from = ("plan_store",) if resolved.plan_store else ()
    why.append(("plan store", f"the plan_store setting is {'on: loaded if stored, stored once built' if resolved.plan_store else 'off'}"))
    if stand_in and resolved.build_process and not (kernel_cache or tuned):
        plan_from += ("build_process",)
        why.append(("build process", "the build_process setting is on and the build is off the caller's path, static and untuned "
                                     "(a helper builds it from the backend's JSON or from the graph's recipe; one it cannot take builds on the build thread)"))
    plan_from += ("kernel_cache",) if kernel_cache else ("static",)
    why.append(("build", f"{'with a kernel cache (cuDNN 9.21 or newer, else static)' if kernel_cache else 'static'}: {cache_reason}"))
    why.append(("tuned", f"{'yes' if tuned else 'no'}: {tuned_reason}"))
    if facts.deterministic:
        why.append(("deterministic", "torch.use_deterministic_algorithms(True): deterministic engines only"))
    if buckets == "length" and calls < 0:  # the timing-dependent route alone: a fixed count waits for its plan anyway
        take_over = TAKE_OVER_CALLS
        why.append(("exact plan", f"a length's {TAKE_OVER_CALLS}th bucketed call builds its exact plan, which then serves it"))
    native, native_reason = _native(resolved, facts, bool(stand_in))
    why.append(("native path", native_reason))
    if resolved.verify:
        why.append(("verify", "the verify setting is on: the first launch is checked against the interpreter (it synchronizes)"))
    build_on = "build_thread" if stand_in else ("refused" if facts.capturing else "caller")
    return Route("cudnn", plan_from, tuned, facts.deterministic, build_on, stand_in, calls, native, resolved.verify, buckets, take_over,
                 tuple(why))


def _stand_in(definition, resolved: Resolved, facts: Facts) -> Tuple[str, int, str]:
    """The one rule of ``stand_in_calls`` and ``serving_mode`` (Note [A new layout's first
    calls]): (the stand-in or "", how many calls it serves, why). The serving mode
    (serving_mode) wins where both are asked for; neither under deterministic algorithms."""
    serving, serving_reason = _chosen(definition, "serving_mode", "serving_mode", resolved)
    stand_in = "torch" if facts.stand_in == "interpreter" and definition.stand_in is not None else facts.stand_in  # the op's: the graph's own
    given = definition.stand_in_calls
    if given is not None:
        count, count_reason = given, f"register_graph(stand_in_calls={given})"
    elif stand_in == "interpreter":  # float32 and unfused: a graph opts in to it, with its own count
        count, count_reason = 0, "the interpreter would stand in (no torch stand-in: register_graph(stand_in=)), which needs register_graph(stand_in_calls=N)"
    else:
        count, count_reason = resolved.stand_in_calls, f"the stand_in_calls setting is {resolved.stand_in_calls}"
    if not serving and not count:
        return "", 0, f"the call builds its plan and waits: {count_reason}, the serving_mode setting is off"
    reason = serving_reason if serving else count_reason
    for fact, said in ((facts.deterministic, "under deterministic algorithms (one implementation per run)"),
                       (facts.capturing, "while capturing a CUDA graph (no build can be part of it: warm up first)"),
                       (facts.compiling, "while tracing"), (not stand_in, "(its caller has no stand-in)"),
                       (facts.background_failed, "(its background build failed: this call builds it and sees the error)")):
        if fact:
            return "", 0, f"the call waits for its plan {said}, though {reason}"
    if serving:
        return stand_in, -1, (f"{stand_in} serves while the plan builds on a build thread, until it is ready (which calls it serves "
                              f"depends on the build's time: the serving mode): {reason}")
    return stand_in, count, (f"{stand_in} serves this layout's first {count} calls at each call site (an nn module, else the layout) "
                             f"while the plan builds on a build thread; a site's call {count + 1} waits for it (reproducible: the "
                             f"same calls whatever the build takes): {reason}")


def _native(resolved: Resolved, facts: Facts, off_path: bool) -> Tuple[str, str]:
    if not facts.with_cuda:
        return "never", "never: this build of the extension has no CUDA"
    if not resolved.native_path:
        return "never", "never: the native_path setting is off"
    if off_path:  # never before the calls the stand-in serves (C++ would serve them), nor on the build thread
        return "second_call", ("a backend plan runs from C++ from the first call it serves on, after the stand-in's (the calls "
                               "register it: registering deserializes, never on the build thread: Note [A fetched plan is loaded by the call that takes it])")
    when = "at_build" if resolved.native_hand_over == "build" else "second_call"
    return when, (f"a backend plan runs from C++ from {'its build' if when == 'at_build' else 'its second call'} on "
                  f"(the native_hand_over setting is {resolved.native_hand_over!r}); a plan cuDNN's backend alone "
                  "does not serve, or with a bool operand, stays on the Python path")
