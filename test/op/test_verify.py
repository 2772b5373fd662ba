"""Verify mode without a GPU: the tolerance rule (op/tolerance.py), and the comparison and
report (op/verify.py ``compare``, ``FirstExecution``) on CPU tensors, with outputs that
stand in for a plan's. test_verify_gpu.py runs the real thing."""

import types

import cudnn
import pytest
import torch

import torch_cudnn_handle as tch
from support import upstream_graphs as ug
from support.interpreter import CPU_REFERENCE, REFUSED
from torch_cudnn_handle import registry, settings, stats
from torch_cudnn_handle.op import reference, verify
from torch_cudnn_handle.op.tolerance import SLACK, OutputRule, check_output, rules_for, unit_of_types
from torch_cudnn_handle.registry.routes import Facts, Resolved, Route, decide


def _described(graph_id, inputs):
    return reference.description_for(graph_id, inputs, torch.device("cpu"))


# -- the rule ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "output, options, unit",
    [
        (torch.float16, {}, 2.0 ** -10),
        (torch.bfloat16, {}, 2.0 ** -7),
        (torch.float32, {}, 2.0 ** -23),
        (torch.float32, dict(tf32=True), 2.0 ** -10),
        (torch.float32, dict(approximate=True), 2.0 ** -11),
        (torch.float32, dict(reduced_types=[torch.bfloat16]), 2.0 ** -7),
        (torch.float32, dict(narrow_types=[torch.float16]), 2.0 ** -10),
        (torch.float16, dict(narrow_types=[torch.float32]), 2.0 ** -10),  # not narrower: no term
        (torch.float8_e4m3fn, {}, 2.0 ** -3),
        (torch.float64, {}, 2.0 ** -23),  # nothing computes wider than float32
    ],
)
def test_the_unit_is_the_widest_error_source_the_data_types_allow(output, options, unit):
    assert unit_of_types(output, **options)[0] == unit


def pointwise_fp32(graph, x, y):
    return graph.add(x, y)


def gelu_fp32(graph, x):
    return graph.gelu(x)


def matmul_fp32(graph, a, b):
    return graph.matmul(a, b)


def compare_to_mask(graph, x, y):
    return [graph.cmp_gt(x, y).set_data_type(cudnn.data_type.BOOLEAN), graph.add(x, y)]


def test_rules_read_the_description():
    x = torch.randn(2, 3, 4)
    cases = {
        pointwise_fp32: ([x, x], [(2.0 ** -23, "float32")]),
        gelu_fp32: ([x], [(2.0 ** -11, "approximate")]),
        matmul_fp32: ([x, torch.randn(2, 4, 5)], [(2.0 ** -10, "TF32")]),
        compare_to_mask: ([x, x], [(0.0, "exact"), (2.0 ** -23, "float32")]),
    }
    for builder, (inputs, expected) in cases.items():
        graph_id = tch.register_graph(builder)
        described = _described(graph_id, inputs)
        rules = rules_for(described.graph, described.outputs)
        assert len(rules) == len(expected), builder
        for rule, (unit, why) in zip(rules, expected):
            assert rule.unit == unit and why in rule.why, (builder, rule)
    sdpa = ug.BY_NAME["sdpa_forward"]
    described = _described(sdpa.graph_id, sdpa.make_inputs("cpu"))
    assert {(r.unit, r.why) for r in rules_for(described.graph, described.outputs)} == {(2.0 ** -10, "float16 output"), (2.0 ** -10, "a reduction over float16 data")}


def test_bounds_scale_with_the_largest_expected_value():
    rule = OutputRule(torch.float16, 2.0 ** -10, "float16 output")
    atol, rtol = rule.bounds(torch.tensor([0.5, -40.0, float("nan"), float("inf")]))
    assert rtol == SLACK * 2.0 ** -10 and atol == pytest.approx(SLACK * 2.0 ** -10 * 40.0 + torch.finfo(torch.float16).tiny)


def test_check_output_counts_what_is_outside_and_treats_nan_and_inf_as_values():
    rule = OutputRule(torch.float32, 2.0 ** -23, "float32 output")
    expected = torch.tensor([1.0, float("nan"), float("inf"), 4.0])
    assert check_output(0, rule, expected.clone(), expected).ok
    off = expected.clone()
    off[3] = 4.001
    check = check_output(0, rule, off, expected)
    assert not check.ok and check.outside == 1 and check.max_abs == pytest.approx(1e-3, rel=1e-3)
    assert not check_output(0, rule, torch.tensor([1.0, 0.0, float("inf"), 4.0]), expected).ok  # a finite value for a NaN
    ints = OutputRule(torch.int32, 0.0, "exact")
    assert check_output(0, ints, torch.tensor([3, 4]), torch.tensor([3, 5])).ok  # a tie rounded the other way
    assert not check_output(0, ints, torch.tensor([3, 7]), torch.tensor([3, 5])).ok
    flags = OutputRule(torch.bool, 0.0, "exact")
    many = torch.zeros(2000, dtype=torch.bool)
    flipped = many.clone()
    flipped[:2] = True
    assert check_output(0, flags, flipped, many).ok and not check_output(0, flags, ~many, many).ok


# -- the comparison over real graphs --------------------------------------------------


@pytest.mark.parametrize("entry", [e for e in ug.GRAPHS if e.name not in REFUSED], ids=lambda e: e.name)
def test_the_rule_accepts_the_interpreter_against_float64_and_against_each_torch_reference(entry):
    """No false alarm on rounding: the float32 interpreter against the float64 one, and the
    interpreter against upstream's own torch reference (which cuDNN meets within upstream's
    tolerances on the GPU) both pass."""
    inputs = entry.make_inputs("cpu")
    described = _described(entry.graph_id, inputs)
    got = tch.execute(entry.graph_id, inputs)
    verify.compare(entry.name, "layout", "engine", described, got, tch.execute_reference(entry.graph_id, inputs, compute_dtype=torch.float64), inputs)
    expected = CPU_REFERENCE.get(entry.name, entry.reference)(inputs)
    verify.compare(entry.name, "layout", "engine", described, [e.to(g.dtype) if e is not None else g for e, g in zip(expected, got)], got, inputs)


def fma(graph, x, s, y):
    return graph.add(graph.mul(x, s), y)


FMA = tch.register_graph(fma, name="verify_fma")


def _fma_inputs(dtype=torch.float16):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(*shape, generator=gen).to(dtype) for shape in ((4, 64, 96), (1, 1, 96), (4, 64, 96))]


def test_a_wrong_broadcast_is_flagged_with_the_report():
    inputs = _fma_inputs()
    described = _described(FMA, inputs)
    (right,) = tch.execute(FMA, inputs)
    wrong = right.clone()
    wrong[1:] = (inputs[0][1:].float() * inputs[1].float()[0, 0, :1] + inputs[2][1:].float()).half()  # s's first element everywhere
    with pytest.raises(verify.VerifyMismatch) as raised:
        verify.compare("verify_fma", "float16[4, 64, 96] stride [6144, 96, 1], ...", "backend:some_engine", described, [wrong], [right], inputs)
    message = str(raised.value)
    for words in ("graph 'verify_fma'", "layout: float16[4, 64, 96]", "engine: backend:some_engine", "output 0: max abs error",
                  "max rel error", "tolerance atol", "rtol", "float16 output", "elements outside"):
        assert words in message, (words, message)


def test_a_padded_attention_is_compared_on_its_defined_rows_and_unwritten_elements_are_not_compared():
    entry = ug.BY_NAME["sdpa_forward_padding"]
    inputs = entry.make_inputs("cpu")
    described = _described(entry.graph_id, inputs)
    expected = tch.execute(entry.graph_id, inputs)
    got = [t.clone() for t in expected]
    lengths = inputs[3].reshape(-1).tolist()
    for t in got:
        for b, n in enumerate(lengths):
            t[b, :, n:] = 1234.0  # rows past the sequence lengths: undefined, never compared
    checks = verify.compare(entry.name, "l", "e", described, got, expected, inputs)
    assert all(c.ok for c in checks) and checks[0].ignored > 0
    ragged = ug.BY_NAME["sdpa_forward_ragged"]
    inputs = ragged.make_inputs("cpu")
    described = _described(ragged.graph_id, inputs)
    (o,) = tch.execute(ragged.graph_id, inputs)
    left = o.clone()
    left[-3:] = float("nan")  # the op's NaN prefill, where a plan wrote nothing
    verify.compare(ragged.name, "l", "e", described, [left], [o], inputs, unwritten_allowed=True)
    with pytest.raises(verify.VerifyMismatch):
        verify.compare(ragged.name, "l", "e", described, [left], [o], inputs, unwritten_allowed=False)


def test_nan_in_a_graph_that_writes_everything_is_a_mismatch():
    inputs = _fma_inputs()
    (right,) = tch.execute(FMA, inputs)
    nan = right.clone()
    nan[0, 0, 0] = float("nan")
    assert not verify.may_leave_unwritten(_described(FMA, inputs))
    with pytest.raises(verify.VerifyMismatch, match="1 of 24576 elements outside"):
        verify.compare("verify_fma", "l", "e", _described(FMA, inputs), [nan], [right], inputs, unwritten_allowed=False)


# -- FirstExecution: the check the Python path makes ------------------------------------


def _built(engine="backend:test", verify=True):
    """What a check reads of a BuiltGraph: its route decided verify (registry/routes.py) from the setting."""
    return types.SimpleNamespace(device=0, engine=engine, route=Route("cudnn", verify=verify))


def test_off_there_is_no_check_and_on_each_check_counts():
    inputs = _fma_inputs(torch.float32)
    with settings.override(verify=False):
        assert verify.first_execution(FMA, _built(verify=False), inputs) is None
        assert not decide(registry.definition(FMA), Resolved.now(), Facts("cuda")).verify
    before = stats.verify()
    with settings.override(verify=True):
        assert decide(registry.definition(FMA), Resolved.now(), Facts("cuda")).verify
        check = verify.first_execution(FMA, _built(), inputs)
        assert stats.verify()["enabled"]
    (right,) = tch.execute(FMA, inputs)
    assert check.prefilled([right.clone()])[0].isnan().all()  # where a launch writes nothing, NaN stays
    check.finish([right])
    wrong = right + 1.0
    with pytest.raises(verify.VerifyMismatch, match="engine: backend:test"):
        verify.FirstExecution(FMA, _built(), inputs).finish([wrong])
    after = stats.verify()
    assert after["checked"] == before["checked"] + 2 and after["mismatches"] == before["mismatches"] + 1
    assert after["seconds"] >= before["seconds"] and "verify" in stats.everything()


def test_the_inputs_a_launch_writes_are_kept_as_they_were():
    inputs = _fma_inputs(torch.float32)
    check = verify.FirstExecution(FMA, _built(), inputs, written=[2])
    (expected,) = tch.execute(FMA, inputs)
    inputs[2].fill_(7.0)  # what an in-place launch does to its written input
    check.finish([expected])  # against the inputs as they were


def test_a_graph_the_interpreter_does_not_know_is_skipped_and_counted():
    entry = ug.BY_NAME["sdpa_forward_dropout"]
    inputs = entry.make_inputs("cpu")
    before = stats.verify()["skipped"].get("a node the interpreter does not know", 0)
    with pytest.warns(RuntimeWarning, match="is not checked: interpreter: node 'sdpa_forward'"):
        assert verify.FirstExecution(entry.graph_id, _built(), inputs).finish([torch.empty(0)]) is None
    assert stats.verify()["skipped"]["a node the interpreter does not know"] == before + 1


def test_out_into_a_graph_that_may_leave_memory_unwritten_is_skipped():
    entry = ug.BY_NAME["sdpa_forward_ragged"]
    inputs = entry.make_inputs("cpu")
    assert verify.FirstExecution(entry.graph_id, _built(), inputs).finish(tch.execute(entry.graph_id, inputs), prefilled=False) is None
    assert stats.verify()["skipped"]["execute.out into outputs the graph may leave partly unwritten"] >= 1
