"""The route of a call (registry/routes.py, Note [One route per call]): one function decides it
from the definition, the settings and the call's facts. A table over every combination that
changes the outcome, and ``tch.explain``'s answer for a representative of each route, with
the setting or fact behind each choice. No GPU: ``decide`` is pure, and a CUDA call's facts
are written out."""

import dataclasses
import itertools

import pytest
import torch

import torch_cudnn_handle as tch
from torch_cudnn_handle import registry, settings
from torch_cudnn_handle.nn import sdpa
from torch_cudnn_handle.nn.attention import SDPA_GRAPHS
from torch_cudnn_handle.registry.routes import TAKE_OVER_CALLS, Facts, Resolved, Route, decide


def relu(g, x):
    return g.relu(x)


def definition(**options):
    return registry.definition(tch.register_graph(relu, name="routed", **options))


PLAIN = definition()
CUDA = Facts("cuda", stand_in="interpreter")
BOOLS = (False, True)


def test_cpu_and_fake_calls_never_reach_cudnn_whatever_the_settings():
    for everything_on in BOOLS:
        resolved = Resolved(**{f.name: everything_on for f in dataclasses.fields(Resolved) if f.type == "bool"})
        assert decide(PLAIN, resolved, Facts("cpu")).runs_on == "interpreter"
        assert decide(PLAIN, resolved, Facts("shapes", compiling=True)).runs_on == "shapes"
        assert decide(PLAIN, resolved, Facts("cpu")).plan_from == ()


@pytest.mark.parametrize("per_graph, setting", itertools.product((None, False, True), BOOLS))
def test_the_reference_route_is_the_graphs_choice_else_the_setting(per_graph, setting):
    route = decide(definition(reference=per_graph), Resolved(reference_path=setting), CUDA)
    expected = setting if per_graph is None else per_graph
    assert route.runs_on == ("interpreter" if expected else "cudnn")
    assert (route.native == "never") == expected  # the interpreter's entry is never native
    said = dict(route.why)["runs on"]
    assert ("register_graph(reference=" in said) == (per_graph is not None) and ("reference_path setting" in said) == (per_graph is None)


@pytest.mark.parametrize("per_graph, setting, count, deterministic, capturing, compiling, stand_in, failed_before",
                         itertools.product((None, False, True), BOOLS, (None, 0, 3), BOOLS, BOOLS, BOOLS, ("", "interpreter", "torch"), BOOLS))
def test_the_one_rule_of_stand_ins(per_graph, setting, count, deterministic, capturing, compiling, stand_in, failed_before):
    """A stand-in serves while the plan builds on a build thread only where it is asked for (the
    serving mode, serving_mode, until the plan is ready; else stand_in_calls, a fixed count:
    the graph's own, else the setting's where torch's ops stand in, never for the interpreter),
    the caller has a stand-in, and the call is neither deterministic, captured, traced, nor the
    retry of a failed background build."""
    facts = Facts("cuda", deterministic, capturing, compiling, stand_in, background_failed=failed_before)
    route = decide(definition(serving_mode=per_graph, stand_in_calls=count), Resolved(serving_mode=setting, stand_in_calls=2), facts)
    serving = setting if per_graph is None else per_graph
    calls = count if count is not None else 2 if stand_in == "torch" else 0
    serves = (serving or calls > 0) and bool(stand_in) and not (deterministic or capturing or compiling or failed_before)
    assert route.stand_in == (stand_in if serves else "")
    assert route.stand_in_calls == ((-1 if serving else calls) if serves else 0)
    assert route.build_on == ("build_thread" if serves else "refused" if capturing else "caller")
    assert route.native == ("second_call" if serves else "at_build")  # never native before the stand-in's calls, nor on the build thread
    assert route.deterministic == deterministic


@pytest.mark.parametrize("store, build_process, dynamic, tuned, background", itertools.product(BOOLS, BOOLS, BOOLS, BOOLS, BOOLS))
def test_where_the_plan_comes_from(store, build_process, dynamic, tuned, background):
    resolved = Resolved(plan_store=store, build_process=build_process, dynamic_shapes=dynamic, plan_tuning=tuned, serving_mode=background)
    route = decide(PLAIN, resolved, CUDA)
    expected = (("plan_store",) if store else ()) + (("build_process",) if background and build_process and not (dynamic or tuned) else ())
    assert route.plan_from == expected + (("kernel_cache",) if dynamic else ("static",))
    assert route.tuned == tuned


@pytest.mark.parametrize("option, setting", [("tune", "plan_tuning"), ("dynamic_shapes", "dynamic_shapes")])
def test_a_per_graph_choice_wins_over_its_setting(option, setting):
    for per_graph, value in itertools.product(BOOLS, BOOLS):
        route = decide(definition(**{option: per_graph}), Resolved(**{setting: value}), CUDA)
        assert (route.tuned if option == "tune" else "kernel_cache" in route.plan_from) == per_graph


@pytest.mark.parametrize("with_cuda, native_path, hand_over", itertools.product(BOOLS, BOOLS, ("build", "second_call")))
def test_when_the_native_path_takes_the_plan(with_cuda, native_path, hand_over):
    route = decide(PLAIN, Resolved(native_path=native_path, native_hand_over=hand_over), Facts("cuda", with_cuda=with_cuda))
    expected = "never" if not (with_cuda and native_path) else ("at_build" if hand_over == "build" else "second_call")
    assert route.native == expected


@pytest.mark.parametrize("setting", BOOLS)
def test_verify_follows_its_setting(setting):
    assert decide(PLAIN, Resolved(verify=setting), CUDA).verify == setting


@pytest.mark.parametrize("buckets_setting, uniform, background, registered_buckets",
                         itertools.product(BOOLS, BOOLS, BOOLS, BOOLS))
def test_buckets_and_the_exact_plans_take_over(buckets_setting, uniform, background, registered_buckets):
    """Size buckets are the graph's (register_graph(buckets=)); nn.sdpa's length buckets the
    attention_buckets setting's, for self-attention; with a stand-in, a length's exact plan
    takes over after TAKE_OVER_CALLS bucketed calls."""
    chosen = definition(buckets=tch.Buckets({0: 1})) if registered_buckets else PLAIN
    facts = Facts("cuda", stand_in="torch_attention", uniform_lengths=uniform)
    route = decide(chosen, Resolved(attention_buckets=buckets_setting, serving_mode=background, stand_in_calls=2), facts)
    length = buckets_setting and uniform and not registered_buckets
    assert route.buckets == ("size" if registered_buckets else "length" if length else "")
    assert route.take_over_after == (TAKE_OVER_CALLS if length and background else 0)  # the serving mode's alone
    assert route.stand_in == "torch_attention" and route.stand_in_calls == (-1 if background else 2)  # the serving mode, else the count


def test_a_registered_built_graph_has_its_plan_and_nothing_to_decide():
    built_definition = registry.Definition(0, "pinned", None, {}, 1)
    route = decide(built_definition, Resolved(serving_mode=True, verify=True), CUDA)
    assert (route.runs_on, route.plan_from, route.stand_in, route.native) == ("cudnn", ("registered",), "", "never")


def test_resolved_reads_each_setting_once_into_a_frozen_record(fresh_settings):
    settings.set_serving_mode(True)
    resolved = Resolved.now()
    settings.set_serving_mode(False)
    assert resolved.serving_mode is True and Resolved.now().serving_mode is False
    with pytest.raises(AttributeError):
        resolved.verify = True


# -- explain: each route, with what made each choice ------------------------------


def test_explain_a_cpu_call_says_the_interpreter_runs_it_and_why():
    graph = tch.register_graph(relu, name="explained")
    route = tch.explain(graph, [torch.randn(2, 3, 4)])
    assert isinstance(route, Route) and route.runs_on == "interpreter" and route.label == "interpreter"
    assert "CPU tensors" in str(route)
    (y,) = tch.execute(graph, [torch.randn(2, 3, 4)])  # explaining built nothing, and the call's route is the one explained
    assert tch.stats.graphs()["routes"].get("interpreter", 0) >= 1


def test_explain_a_traced_call_says_nothing_runs():
    graph = tch.register_graph(relu, name="explained_meta")
    assert tch.explain(graph, [torch.empty(2, 3, 4, device="meta")]).runs_on == "shapes"


@pytest.mark.parametrize("settings_on, words", [
    ({}, ["route: cudnn/static/native@at_build", "the call builds its plan and waits: the interpreter would stand in",
          "plan store: the plan_store setting is off", "tuned: no: the plan_tuning setting is off"]),
    (dict(plan_store=True, serving_mode=True), ["route: cudnn/plan_store+build_process+static/stand_in=interpreter/native@second_call",
                                                     "interpreter serves while the plan builds on a build thread",
                                                     "build process: the build_process setting is on"]),
    (dict(dynamic_shapes=True, plan_tuning=True, native_hand_over="second_call"),
     ["cudnn/kernel_cache/native@second_call", "with a kernel cache", "tuned: yes: the plan_tuning setting is on",
      "from its second call on"]),
    (dict(native_path=False, verify=True), ["cudnn/static/python_path", "never: the native_path setting is off",
                                            "verify: the verify setting is on"]),
    (dict(reference_path=True), ["route: interpreter", "the torch interpreter, never cuDNN: the reference_path setting is on"]),
    (dict(stand_in_calls=4), ["cudnn/build_process+static/stand_in=torchx4/native@second_call", "torch serves this layout's first 4 calls at each call site",
                              "a site's call 5 waits for it (reproducible", "from the first call it serves on, after the stand-in's"]),
])
def test_each_cuda_route_explains_each_choice_with_its_setting(settings_on, words):
    resolved = Resolved(**dict(dict(plan_store=False), **settings_on))
    facts = Facts("cuda", stand_in="torch") if "stand_in_calls" in settings_on else CUDA  # the count needs torch's own stand-in
    text = decide(PLAIN, resolved, facts).explain()
    for word in words:
        assert word in text, text


def test_explain_an_sdpa_call_names_its_buckets_and_its_stand_in(fresh_settings):
    q = torch.randn(1, 2, 16, 8, dtype=torch.bfloat16)
    assert tch.explain(sdpa, [q, q, q], causal=True).buckets == ""
    settings.set_attention_buckets(True)
    route = tch.explain(sdpa, [q, q, q], causal=True)
    assert route.buckets == "length" and "attention_buckets setting is on" in str(route)
    text = decide(registry.definition(SDPA_GRAPHS[True]), Resolved(attention_buckets=True, serving_mode=True),
                  Facts("cuda", stand_in="torch_attention", uniform_lengths=True)).explain()
    assert "torch_attention serves while the plan builds" in text and f"{TAKE_OVER_CALLS}th bucketed call builds its exact plan" in text
    with pytest.raises(TypeError, match="pass a graph id"):
        tch.explain(len, [q])


def test_the_ops_stand_in_is_the_graphs_torch_stand_in_where_it_has_one():
    """The op's Python path offers the interpreter; a graph registered with stand_in= is served
    by that instead, and so takes the stand_in_calls setting (the interpreter needs its own count)."""
    resolved = Resolved(stand_in_calls=2)
    assert decide(definition(stand_in=torch.relu), resolved, CUDA).stand_in == "torch"
    assert decide(definition(stand_in=torch.relu), resolved, CUDA).stand_in_calls == 2
    assert decide(PLAIN, resolved, CUDA).stand_in == ""
