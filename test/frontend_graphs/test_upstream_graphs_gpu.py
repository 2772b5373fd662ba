"""The frontend's own upstream graphs (test/support/upstream_graphs/) through torch.ops.cudnn_fe.execute.

Each graph runs three ways on the same inputs: the frontend itself (the graph described as the
registry describes it, built in ``tch.build_scope`` with ``graph.build([A, FALLBACK])``, run by
``graph.execute``), the op eagerly (``tch.execute``), and the op under
``torch.compile(fullgraph=True)`` (inductor). The op's outputs must be BITWISE equal to the
frontend's (``torch.equal``; same plan, same kernels), and close to upstream's torch reference
within upstream's tolerances. A graph the op refuses today is an xfail(strict=False) with the
reason, so the run lists exactly which upstream graphs run as written. Each test prints the
path (native or Python) and engine that served it.

``python test/frontend_graphs/test_upstream_graphs_gpu.py --table`` runs every graph and prints a markdown table
per family, as docs/testing.md shows it.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # test/: conftest and the support package

import cudnn  # noqa: E402

import torch_cudnn_handle as tch  # noqa: E402
from conftest import skip_where_cudnn_lacks_engines  # noqa: E402
from support.upstream_graphs import BY_NAME, GRAPHS, compare_region, path_of, run_with_frontend  # noqa: E402

pytestmark = pytest.mark.gpu


def _fresh(inputs):
    """Each run gets its own copies (a graph may write an input: sdpa's rng_dump), same layouts."""
    copies = []
    for t in inputs:
        c = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        copies.append(c.copy_(t))
    return copies


def _compiled(graph_id):
    def call(*inputs):
        return torch.ops.cudnn_fe.execute(graph_id, list(inputs))

    return torch.compile(call, fullgraph=True)


def _frontend_or_skip(entry, inputs):
    try:
        return run_with_frontend(entry, inputs)
    except cudnn.cudnnGraphNotSupportedError as error:  # upstream waives these too
        pytest.skip(f"the frontend itself does not support {entry.name} on this GPU: {error}")


def _frontend_repeats_itself(entry, inputs, expected, i) -> str:
    """Whether a second frontend run gives the same output i: a kernel that is not
    deterministic (atomics in a reduction) differs from itself, not only from the op."""
    again = compare_region(entry, run_with_frontend(entry, _fresh(inputs)), inputs)[i]
    return "the frontend's own second run agrees" if torch.equal(again, expected) else (
        "the frontend's own second run differs too: this kernel is not deterministic")


def _assert_bitwise(entry, what, got, expected, inputs):
    assert len(got) == len(expected), f"{entry.name}: {what} gave {len(got)} outputs, the frontend {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        assert (g.shape, g.stride(), g.dtype) == (e.shape, e.stride(), e.dtype), f"{entry.name} output {i}: {what} layout"
    for i, (g, e) in enumerate(zip(compare_region(entry, got, inputs), compare_region(entry, expected, inputs))):
        if not torch.equal(g, e):
            diff = (g.double() - e.double()).abs().nan_to_num(float("inf")).max().item()
            raise AssertionError(
                f"{entry.name} output {i}: {what} differs from the frontend's execute of the same graph (max abs diff "
                f"{diff}; {_frontend_repeats_itself(entry, inputs, e, i)})"
            )


def _assert_reference(entry, outputs, inputs):
    try:
        expected = entry.reference(inputs)  # torch's own ops, which may use cuDNN too
    except RuntimeError as error:
        skip_where_cudnn_lacks_engines(error, f"torch's reference of {entry.name}")
    checked = 0
    for i, (out, ref, (atol, rtol)) in enumerate(zip(outputs, expected, entry.tolerances)):
        if ref is None:
            continue
        (got,) = compare_region(entry, [out], inputs)  # a reference has its output's shape; compare what the graph defines
        (want,) = compare_region(entry, [ref.to(out.dtype)], inputs)
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol, msg=lambda m, i=i: f"{entry.name} output {i}: {m}")
        checked += 1
    assert checked, f"{entry.name}: no output compared with the reference"


@pytest.mark.parametrize(
    "entry",
    [pytest.param(e, id=e.name, marks=[pytest.mark.xfail(strict=True, reason=e.known_issue)] if e.known_issue else []) for e in GRAPHS],
)
def test_upstream_graph(entry):
    torch._dynamo.reset()
    device = torch.device("cuda", torch.cuda.current_device())
    inputs = entry.make_inputs(str(device))
    fe_inputs = _fresh(inputs)
    frontend = _frontend_or_skip(entry, fe_inputs)
    torch.cuda.synchronize()

    eager_inputs = _fresh(inputs)
    eager = tch.execute(entry.graph_id, eager_inputs)  # the first call: the Python path
    _assert_bitwise(entry, "eager tch.execute", eager, frontend, inputs)

    compiled = _compiled(entry.graph_id)(*_fresh(inputs))  # the second: natively where the plan allows
    print(f"\n{entry.name}: {path_of(entry)}")
    _assert_bitwise(entry, "torch.compile(fullgraph=True)", compiled, frontend, inputs)

    # The reference reads the inputs as the graph left them (sdpa's rng_dump holds the mask it drew).
    _assert_reference(entry, eager, eager_inputs)


# ---------------------------------------------------------------------------------------
# The table of docs/testing.md


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:160]}{'...' if len(text) > 160 else ''}"


def table_rows():
    """One row per graph: family, graph, runs as written?, bitwise equal to the frontend
    (eager, compiled), path, and what refused it (the op's or the frontend's own message)."""
    device = torch.device("cuda", torch.cuda.current_device())
    for entry in GRAPHS:
        torch._dynamo.reset()
        row = dict(family=entry.family, graph=entry.name, runs="", bitwise="", path="", note="")
        try:
            inputs = entry.make_inputs(str(device))
            frontend = run_with_frontend(entry, _fresh(inputs))
        except Exception as error:  # noqa: BLE001 -- reported in the table
            row.update(runs="frontend refuses", note=f"frontend: {_short(error)}")
            yield row
            continue
        try:
            eager_inputs = _fresh(inputs)
            eager = tch.execute(entry.graph_id, eager_inputs)
            compiled = _compiled(entry.graph_id)(*_fresh(inputs))
            torch.cuda.synchronize()
        except Exception as error:  # noqa: BLE001 -- reported in the table
            row.update(runs="no", note=f"op: {_short(error)}")
            yield row
            continue
        row["runs"] = "yes"
        row["path"] = path_of(entry)
        equal = []
        for what, got in (("eager", eager), ("compiled", compiled)):
            try:
                _assert_bitwise(entry, what, got, frontend, inputs)
                equal.append(f"{what} yes")
            except AssertionError as error:
                equal.append(f"{what} NO")
                row["note"] = str(error).splitlines()[0]
        row["bitwise"] = ", ".join(equal)
        try:
            _assert_reference(entry, eager, eager_inputs)
        except AssertionError as error:
            row["note"] = (row["note"] + "; " if row["note"] else "") + "reference: " + " ".join(str(error).split())[:160]
        yield row


def print_table() -> None:
    print(f"Upstream graphs on {torch.cuda.get_device_name()} (torch {torch.__version__}, cuDNN "
          f"{cudnn.backend_version_string()}, frontend {cudnn.__version__})\n")
    rows = list(table_rows())
    for family in dict.fromkeys(r["family"] for r in rows):
        print(f"**{family}**\n")
        print("| graph | runs as written? | bitwise equal to the frontend? | path | refusal / note |")
        print("| --- | --- | --- | --- | --- |")
        for r in rows:
            if r["family"] == family:
                print(f"| `{r['graph']}` | {r['runs']} | {r['bitwise'] or '-'} | {r['path'] or '-'} | {r['note'].replace('|', '/') or '-'} |")
        print()


if __name__ == "__main__":
    if "--table" not in sys.argv:
        sys.exit(pytest.main([__file__, "-q", "-s"]))
    if not torch.cuda.is_available():
        sys.exit("--table needs a CUDA GPU")
    print_table()


# ---------------------------------------------------------------------------------------
# torch.bool operands: bits in cuDNN (Note [Bit-packed booleans] in op/bool_operands.py)


def test_a_bool_mask_output_is_every_element_and_a_bool_input_is_read_as_torch_means_it_under_capture():
    entry = BY_NAME["batchnorm_relu_mask"]
    inputs = entry.make_inputs("cuda")
    outputs = tch.execute(entry.graph_id, _fresh(inputs))
    y, mask = outputs[0], outputs[5]
    assert mask.dtype == torch.bool and mask.stride() == y.stride()
    assert torch.equal(mask, y > 0)  # every element, not the first eighth
    assert torch.equal(tch.execute(entry.graph_id, _fresh(inputs))[5], mask)  # nothing left unwritten
    assert "bool" in tch.built_graphs(entry.graph_id)[0].path_reason

    drelu = BY_NAME["drelu_dadd_dbn"]
    static = drelu.make_inputs("cuda")  # x, x_mask, scale, mean, inv_var, dY
    torch.ops.cudnn_fe.execute(drelu.graph_id, static)  # built before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = torch.ops.cudnn_fe.execute(drelu.graph_id, static)
    static[1].copy_(~static[1])  # a new mask: the replay packs it again
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured[0], static[5] * static[1])
