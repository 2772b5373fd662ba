"""In-place outputs on a GPU: cudnn_fe.execute_ (register_graph(..., in_place={output: input})).

* Upstream's batchnorm forward training (test/support/upstream_graphs/batchnorm.py), its running statistics
  written into the inputs they were read from, as upstream binds them: eagerly and under
  torch.compile(fullgraph=True) (inductor), every output and both written inputs BITWISE
  equal to the frontend's own execute of the same graph with the same in-place binding;
  the running statistics close to torch's batch_norm; version counters bumped on exactly
  the written inputs; a second call (on the statistics the first one wrote) equal again.
* A float32 accumulate (acc += x) written in place: equal to torch's add, in the same
  buffer, natively (no Python per call) once built; a misaligned written view staged
  through an aligned copy and copied back; captured into a CUDA graph and replayed.
* execute.out with an out that is one of the inputs is refused, pointing at execute_.
* opcheck on CUDA tensors (schema, autograd registration, fake tensors, AOT dispatch).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # test/: conftest and the support package

import cudnn  # noqa: E402

import torch_cudnn_handle as tch  # noqa: E402
from support.upstream_graphs import BY_NAME, path_of, run_with_frontend  # noqa: E402

pytestmark = pytest.mark.gpu

BATCHNORM = BY_NAME["batchnorm_relu_mask"]
RUNNING_MEAN, RUNNING_VAR = 3, 4  # inputs written in place by outputs 3 and 4


def accumulate(g, acc, x):
    return g.add(a=acc, b=x)


ACCUMULATE = tch.register_graph(accumulate, name="in_place_accumulate", in_place={0: 0})


def _fresh(inputs):
    """Copies with the same layouts, so each run writes its own buffers."""
    return [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t) for t in inputs]


def _frontend(inputs):
    try:
        return run_with_frontend(BATCHNORM, inputs)  # outputs 3 and 4 bound to inputs 3 and 4
    except cudnn.cudnnGraphNotSupportedError as error:
        pytest.skip(f"the frontend itself does not support batchnorm on this GPU: {error}")


def _all_outputs(others, inputs):
    """execute_'s returned outputs with the written inputs put back at their output positions."""
    writes = dict(BATCHNORM.in_place)
    count = len(others) + len(writes)
    others = iter(others)
    return [inputs[writes[o]] if o in writes else next(others) for o in range(count)]


def _assert_bitwise(what, got, expected):
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert (g.shape, g.dtype) == (e.shape, e.dtype), f"output {i}: {what} layout"
        if not torch.equal(g, e):
            diff = (g.double() - e.double()).abs().max().item()
            raise AssertionError(f"batchnorm output {i}: {what} differs from the frontend's in-place execute (max abs diff {diff})")


def _assert_running_stats_match_torch(before, after):
    x, _, _, running_mean, running_var, epsilon, momentum, _ = before
    mean, var = running_mean.clone().view(-1), running_var.clone().view(-1)
    torch.nn.functional.batch_norm(x.float(), mean, var, training=True, momentum=momentum.item(), eps=epsilon.item())
    torch.testing.assert_close(after[RUNNING_MEAN].view(-1), mean, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(after[RUNNING_VAR].view(-1), var, atol=1e-3, rtol=1e-3)


def test_batchnorm_running_stats_in_place_eager_bitwise_against_the_frontend():
    inputs = BATCHNORM.make_inputs("cuda")
    fe_inputs, op_inputs = _fresh(inputs), _fresh(inputs)
    expected = _frontend(fe_inputs)
    pointers = [t.data_ptr() for t in op_inputs]
    versions = [t._version for t in op_inputs]
    others = tch.execute_(BATCHNORM.graph_id, op_inputs)
    print(f"\nbatchnorm in place: {path_of(BATCHNORM)}")
    assert len(others) == 4
    _assert_bitwise("eager execute_", _all_outputs(others, op_inputs), expected)
    assert [t.data_ptr() for t in op_inputs] == pointers  # written where they lie
    assert [t._version - v for t, v in zip(op_inputs, versions)] == [0, 0, 0, 1, 1, 0, 0, 0]
    assert not torch.equal(op_inputs[RUNNING_MEAN], inputs[RUNNING_MEAN])
    _assert_running_stats_match_torch(inputs, op_inputs)

    # Again, on the statistics each side wrote: the same plan reads what it wrote.
    expected = _frontend(fe_inputs)
    others = tch.execute_(BATCHNORM.graph_id, op_inputs)
    _assert_bitwise("a second eager execute_", _all_outputs(others, op_inputs), expected)


def test_batchnorm_running_stats_in_place_under_compile_bitwise_against_the_frontend():
    torch._dynamo.reset()
    inputs = BATCHNORM.make_inputs("cuda")
    fe_inputs, op_inputs = _fresh(inputs), _fresh(inputs)
    expected = _frontend(fe_inputs)
    step = torch.compile(lambda *xs: tch.execute_(BATCHNORM.graph_id, list(xs)), fullgraph=True)
    versions = [t._version for t in op_inputs]
    others = step(*op_inputs)
    _assert_bitwise("torch.compile(fullgraph=True) execute_", _all_outputs(others, op_inputs), expected)
    bumped = [t._version > v for t, v in zip(op_inputs, versions)]
    assert bumped == [False, False, False, True, True, False, False, False]
    expected = _frontend(fe_inputs)
    others = step(*op_inputs)
    _assert_bitwise("a second compiled execute_", _all_outputs(others, op_inputs), expected)


def test_the_functional_execute_of_an_in_place_graph_leaves_its_inputs():
    inputs = BATCHNORM.make_inputs("cuda")
    op_inputs = _fresh(inputs)
    outputs = tch.execute(BATCHNORM.graph_id, op_inputs)
    assert len(outputs) == 6
    assert all(torch.equal(a, b) for a, b in zip(op_inputs, inputs))
    expected = _frontend(_fresh(inputs))
    _assert_bitwise("the functional execute", outputs, expected)


def test_accumulate_in_place_equals_torch_and_runs_natively():
    gen = torch.Generator(device="cpu").manual_seed(3)
    acc, x = (torch.randn(1, 64, 128, generator=gen).cuda() for _ in range(2))
    pointer, version = acc.data_ptr(), acc._version
    for call in range(3):  # the first call builds; later ones run on the plan, natively where it is a backend plan
        expected = acc + x
        assert tch.execute_(ACCUMULATE, [acc, x]) == []
        assert torch.equal(acc, expected), f"call {call}"
    assert acc.data_ptr() == pointer and acc._version == version + 3
    built = tch.built_graphs(ACCUMULATE)
    print(f"\naccumulate in place: {'native' if built[0].native else 'python path'} ({built[0].engine})")
    assert len(built) == 1


def test_a_misaligned_written_view_is_staged_and_copied_back():
    gen = torch.Generator(device="cpu").manual_seed(4)
    storage = torch.zeros(64 * 128 + 1, device="cuda")
    acc = storage[1:].view(1, 64, 128)  # 4 bytes past an aligned address
    acc.copy_(torch.randn(1, 64, 128, generator=gen))
    x = torch.randn(1, 64, 128, generator=gen).cuda()
    expected = acc + x
    tch.execute_(ACCUMULATE, [acc, x])
    assert torch.equal(acc, expected)
    assert storage[0].item() == 0


def test_in_place_accumulate_under_compile():
    torch._dynamo.reset()
    acc, x = torch.randn(1, 64, 128, device="cuda"), torch.randn(1, 64, 128, device="cuda")
    expected = acc + x
    step = torch.compile(lambda a, b: tch.execute_(ACCUMULATE, [a, b]), fullgraph=True)
    step(acc, x)
    assert torch.equal(acc, expected)


def test_in_place_accumulate_is_captured_into_a_cuda_graph():
    acc, x = torch.randn(1, 64, 128, device="cuda"), torch.randn(1, 64, 128, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        tch.execute_(ACCUMULATE, [acc, x])  # warm up: the build happens outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tch.execute_(ACCUMULATE, [acc, x])
    start = torch.randn(1, 64, 128, device="cuda")
    acc.copy_(start)
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(acc, start + x + x)


def test_execute_out_into_an_input_is_refused_pointing_at_execute_():
    acc, x = torch.randn(1, 64, 128, device="cuda"), torch.randn(1, 64, 128, device="cuda")
    tch.execute_(ACCUMULATE, [acc.clone(), x])  # built: the refusal is not the first call's
    before = acc.clone()
    with pytest.raises(ValueError, match=r"out\[0\] .* overlaps inputs\[0\].*execute_"):
        tch.execute_out(ACCUMULATE, [acc, x], out=[acc])
    assert torch.equal(acc, before)


def test_opcheck_on_cuda_tensors():
    # The schema test runs the real kernel under torch's schema checker (a mutation of an
    # argument not declared mutable fails it); the AOT test runs the functionalized call.
    acc, x = torch.randn(1, 64, 128, device="cuda"), torch.randn(1, 64, 128, device="cuda")
    torch.library.opcheck(torch.ops.cudnn_fe.execute_.default, (ACCUMULATE, [x], [acc]))
    inputs = BATCHNORM.make_inputs("cuda")
    others, written = tch._C.split_in_place(BATCHNORM.graph_id, inputs)
    torch.library.opcheck(torch.ops.cudnn_fe.execute_.default, (BATCHNORM.graph_id, others, written))
