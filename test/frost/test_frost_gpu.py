"""Frost-served graphs through torch.ops.cudnn_fe.execute on a real GPU, checked against torch.

"Frost" engines are the cuDNN frontend's JIT-compiled CuTe DSL (Python) engines. The graph
here is a causal inference SDPA with head dim 512 in bf16: no cuDNN backend engine serves
head dim 512, and on Hopper the frontend's ``sdpa_fwd_prefill_sm90`` does (a first JIT
build takes seconds). Every test checks which engine served it, through
``built_graphs(gid)[i].engine`` ("frost:<name>" or "backend:<plan>"): a graph the frontend
handed to a backend engine fails the test with the frost engines' own reasons, it never
skips.

Builds are expensive, so the tests share what they can: one registered graph, built once
on cuda:0 by a module fixture (whose first call is the build time the report prints), and
the frontend memoizes a compiled kernel per layout in the process, so a fresh graph id of
an already compiled layout costs the registry's build but no JIT. Two layouts are JIT
compiled in all: SHAPE, and SCOPED_SHAPE for the cross-device scoping tests, so that the
first of those is a real compile under ``build_scope`` of the other GPU.

Marked gpu and dsl: skipped without a GPU and without the CuTe DSL (``import cutlass``); the
tests on both GPUs are marked two_gpus.
"""

import time

import pytest
import torch

import cudnn
import torch.nn.functional as F
from cudnn.frost.device import build_scope_device, current_device

import torch_cudnn_handle as tch
from conftest import run_concurrently, run_in_thread
from support.graphs import MATMUL
from torch_cudnn_handle.nn.attention import sdpa_inference_forward

pytestmark = [pytest.mark.gpu, pytest.mark.dsl]  # dsl: the CuTe DSL the frost engines JIT-compile with

SHAPE = (2, 4, 128, 512)  # B, H, S, D: the shared layout
SCOPED_SHAPE = (1, 8, 256, 512)  # the cross-device scoping tests' layout (its own JIT compile)
DTYPE = torch.bfloat16
RELATIVE_TOLERANCE = 2e-2  # of max|reference|


def causal_sdpa_inference(graph, q, k, v):
    """The package's inference sdpa graph (no softmax stats), causal: what nn.sdpa runs
    when no gradient is needed; with head dim 512 on sm90 a frost engine serves it."""
    return sdpa_inference_forward(graph, q, k, v, causal=True)


def sdpa_inputs(device=0, seed=0, shape=SHAPE):
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return [torch.randn(*shape, generator=generator).to(dtype=DTYPE, device=f"cuda:{device}") for _ in range(3)]


def execute(graph_id, inputs):
    return torch.ops.cudnn_fe.execute(graph_id, list(inputs))


def assert_matches_torch(o, q, k, v, what=""):
    """``o`` against float32 ``F.scaled_dot_product_attention(is_causal=True)`` on the same
    (bf16-rounded) inputs: max|o - ref| <= 2e-2 * max|ref|."""
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert (tuple(o.shape), o.dtype, o.device) == (tuple(want.shape), DTYPE, q.device), what
    assert bool(torch.isfinite(o).all()), f"{what}: non-finite values in the output"
    error = (o.float() - want).abs().max().item()
    tolerance = RELATIVE_TOLERANCE * want.abs().max().item()
    assert error <= tolerance, f"{what}: max abs error {error:.3e} > tolerance {tolerance:.3e} (vs torch float32)"


def why_not_frost(graph, device) -> str:
    """What the frost engines say about a built ``cudnn.pygraph`` they did not serve (best effort)."""
    notes = []
    try:
        major, minor = torch.cuda.get_device_capability(device)
        notes.append(f"cuda:{device} is {torch.cuda.get_device_name(device)} (sm{major}{minor})")
    except Exception as error:  # noqa: BLE001 -- a report, never a second failure
        notes.append(f"device query failed: {error}")
    try:
        from cudnn.frost import buffers

        too_old = buffers.cutedsl_requirement_error("frost SDPA")
        if too_old:
            notes.append(too_old)
    except Exception:  # noqa: BLE001
        pass
    try:
        notes.append("ranked plans: " + ", ".join(graph.get_plan_name_at_index(i) for i in range(graph.get_execution_plan_count())))
    except Exception as error:  # noqa: BLE001
        notes.append(f"(no plan list: {type(error).__name__}: {error})")
    try:
        from cudnn.engines.heuristics import decline_reasons

        with tch.build_scope(device):
            declined, accepted = decline_reasons(graph._candidate_engines(), graph)
        notes.append("frost engines declining it: " + ("; ".join(f"{name}: {why}" for name, why in declined.items()) or "none"))
        notes.append("frost engines accepting it: " + (", ".join(accepted) or "none"))
    except Exception as error:  # noqa: BLE001
        notes.append(f"(could not ask the frost engines why: {type(error).__name__}: {error})")
    return "; ".join(notes)


def assert_served_by_frost(graph_id, device):
    """The registry's built graphs of ``graph_id`` on ``device`` exist and a frost engine serves them."""
    built = [b for b in tch.built_graphs(graph_id) if b.device == device]
    assert built, f"graph {tch.graph_name(graph_id)!r} has no built graph on cuda:{device} (evicted, or never built)"
    for graph in built:
        if not graph.engine.startswith("frost:"):
            pytest.fail(
                f"graph {tch.graph_name(graph_id)!r} on cuda:{device} is served by {graph.engine!r}, not a frost engine. "
                f"Why: {why_not_frost(graph.graph, device)}"
            )
        assert not graph.native, f"a frost plan cannot run natively, yet it is marked native ({graph.path_reason})"
    return built


def exception_messages(error):
    """``error``'s message and those of the exceptions it was raised from or during."""
    messages, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        messages.append(f"{type(error).__name__}: {error}")
        error = error.__cause__ or error.__context__
    return messages


def compiled_cache_stats():
    """The frontend's compiled-kernel cache counters (disk hits/misses, in-process memo hits)."""
    try:
        from cudnn.frost import compiled_cache

        return compiled_cache.stats()
    except Exception:  # noqa: BLE001 -- a report only
        return {}


def counter_delta(before, after):
    return {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)}


def warm_up_and_capture(graph_id, static):
    """Warm up on a side stream (the handle there, the plan, whatever a frost engine
    creates lazily), then capture one call on that stream. Returns (cuda_graph, output)
    or raises what the capture raised."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            execute(graph_id, static)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    cuda_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cuda_graph, stream=side):
        (captured,) = execute(graph_id, static)
    return cuda_graph, captured


def replay_with(cuda_graph, static, captured, seeds, what):
    for seed in seeds:
        fresh = sdpa_inputs(static[0].device.index, seed=seed, shape=tuple(static[0].shape))
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        cuda_graph.replay()
        torch.cuda.synchronize()
        assert_matches_torch(captured, *fresh, what=f"{what}, replay with seed {seed}")


class SharedFrostGraph:
    """One registered frost graph, built once on cuda:0 (SHAPE) by the module fixture."""

    def __init__(self):
        self.graph_id = tch.register_graph(causal_sdpa_inference, name="frost_sdpa_d512_causal")
        inputs = sdpa_inputs(0, seed=0)
        torch.cuda.synchronize()
        self.cache_before = compiled_cache_stats()
        self.error = None
        start = time.perf_counter()
        try:
            (output,) = execute(self.graph_id, inputs)
            torch.cuda.synchronize(0)
        except Exception as error:  # noqa: BLE001 -- reported by every test that needs the graph
            self.error = error
        self.first_call_s = time.perf_counter() - start
        self.cache_delta = counter_delta(self.cache_before, compiled_cache_stats())
        if self.error is None:
            self.first_output = (output, inputs)

    def require(self):
        """Its built graph on cuda:0. Fails the calling test (not an error, not a skip) when
        the shared build failed or a backend engine serves it."""
        if self.error is not None:
            pytest.fail(f"building the frost graph on cuda:0 failed: {' <- '.join(exception_messages(self.error))}")
        return assert_served_by_frost(self.graph_id, 0)


@pytest.fixture(scope="module")
def frost_sdpa():
    return SharedFrostGraph()


# -- a: through the op, on each GPU -------------------------------------------------------


@pytest.mark.parametrize("device", [pytest.param(0, id="cuda0"), pytest.param(1, id="cuda1", marks=pytest.mark.two_gpus)])
def test_the_op_runs_a_frost_graph_and_matches_torch(frost_sdpa, device):
    frost_sdpa.require()
    if device == 0:
        output, inputs = frost_sdpa.first_output
        assert_matches_torch(output, *inputs, what="cuda:0, the building call")
    inputs = sdpa_inputs(device, seed=10 + device)
    with torch.cuda.device(0):  # the ambient device is cuda:0 in both cases
        (output,) = execute(frost_sdpa.graph_id, inputs)
    (built,) = assert_served_by_frost(frost_sdpa.graph_id, device)
    assert built.device == device and built.inputs[0].shape == SHAPE
    assert any(engine.startswith("frost:") for engine in tch.stats.graphs()["engines"]), tch.stats.graphs()["engines"]
    print(f"\ncuda:{device}: engine {built.engine} ({built.path_reason}), workspace {built.workspace_size} bytes")
    assert_matches_torch(output, *inputs, what=f"cuda:{device}")


# -- b: builds scoped to the target device --------------------------------------------------


DIRECTIONS = pytest.mark.parametrize("target, other", [(1, 0), (0, 1)], ids=["cuda1-from-cuda0", "cuda0-from-cuda1"])


@pytest.mark.two_gpus
@DIRECTIONS
def test_the_op_builds_for_the_inputs_device_from_another_current_device(target, other):
    seen = []

    def recording_builder(graph, q, k, v):
        seen.append((current_device(), build_scope_device(), torch.cuda.current_device()))
        return causal_sdpa_inference(graph, q, k, v)

    graph_id = tch.register_graph(recording_builder, name=f"frost_sdpa_scoped_to_cuda{target}")
    inputs = sdpa_inputs(target, seed=20 + target, shape=SCOPED_SHAPE)
    torch.cuda.synchronize(target)
    with torch.cuda.device(other):
        start = time.perf_counter()
        (output,) = execute(graph_id, inputs)
        torch.cuda.synchronize(target)
        elapsed = time.perf_counter() - start
        # The op's build scope (and its context guard) leave the caller's device as they found it.
        assert torch.cuda.current_device() == other
    # (frost's current device, the build scope's device, torch's device) while the builder ran.
    assert seen and all(entry == (target, target, target) for entry in seen), f"during the build: {seen}, expected ({target}, {target}, {target})"
    assert build_scope_device() is None
    (built,) = assert_served_by_frost(graph_id, target)
    print(f"\ncuda:{target} built from cuda:{other}: engine {built.engine}, first call {elapsed:.2f} s")
    assert_matches_torch(output, *inputs, what=f"cuda:{target}, built and run from cuda:{other}")


@pytest.mark.two_gpus
@DIRECTIONS
def test_a_pygraph_built_in_build_scope_targets_that_device(target, other):
    inputs = sdpa_inputs(target, seed=30 + target, shape=SCOPED_SHAPE)
    torch.cuda.synchronize(target)

    def in_thread():
        torch.cuda.set_device(other)  # this thread's current device is the other GPU
        seen = []

        def recording_builder(graph, q, k, v):
            seen.append((current_device(), build_scope_device(), torch.cuda.current_device()))
            return causal_sdpa_inference(graph, q, k, v)

        with tch.build_scope(target) as handle:
            assert handle.device.ordinal == target
            graph = cudnn.pygraph(
                name="frost_sdpa_direct",
                io_data_type=cudnn.data_type.BFLOAT16,
                intermediate_data_type=cudnn.data_type.FLOAT,
                compute_data_type=cudnn.data_type.FLOAT,
                handle=handle,
            )
            q, k, v = (graph.tensor_like(t) for t in inputs)
            o = recording_builder(graph, q, k, v).set_output(True)
            graph.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        after_scope = (torch.cuda.current_device(), build_scope_device())
        # Run it as a user would after the scope: this thread's pooled handle for the target.
        output = torch.empty_strided(tuple(o.dim), tuple(o.stride), dtype=DTYPE, device=f"cuda:{target}")
        size = graph.get_workspace_size()
        workspace = torch.empty(size, dtype=torch.uint8, device=f"cuda:{target}") if size else None
        graph.execute([*inputs, output], workspace, handle=tch.current_handle(target), tensor_uids=[q.uid, k.uid, v.uid, o.uid])
        torch.cuda.synchronize(target)
        return seen, after_scope, graph, output

    seen, after_scope, graph, output = run_in_thread(in_thread)
    engine = graph.selected_engine
    assert seen == [(target, target, target)], f"during the build: {seen}, expected [({target}, {target}, {target})]"
    assert after_scope == (other, None), f"after build_scope: (current device, build scope) = {after_scope}, expected ({other}, None)"
    if engine is None:
        pytest.fail(f"the frontend served the direct pygraph with a backend plan, not a frost engine. Why: {why_not_frost(graph, target)}")
    print(f"\ndirect pygraph for cuda:{target} built from cuda:{other}: engine frost:{engine.name}")
    assert_matches_torch(output, *inputs, what=f"direct pygraph on cuda:{target}, built and run from cuda:{other}")


# -- c: concurrent first calls ----------------------------------------------------------


def test_eight_threads_racing_a_first_call_build_it_once():
    graph_id = tch.register_graph(causal_sdpa_inference, name="frost_sdpa_race")  # nothing built yet
    inputs = sdpa_inputs(0, seed=40)
    torch.cuda.synchronize()
    before = tch.stats.graphs()["builds"]

    def call(_):
        (output,) = execute(graph_id, inputs)
        torch.cuda.synchronize(0)
        return output

    results = run_concurrently(call, 8)
    assert tch.stats.graphs()["builds"] - before == 1
    assert_served_by_frost(graph_id, 0)
    for i, output in enumerate(results):
        assert_matches_torch(output, *inputs, what=f"thread {i}")


# -- d: torch.compile -------------------------------------------------------------------


def test_compiled_fullgraph_matches_eager(frost_sdpa):
    frost_sdpa.require()
    graph_id = frost_sdpa.graph_id

    def attention_epilogue(q, k, v):
        (o,) = torch.ops.cudnn_fe.execute(graph_id, [q, k, v])
        return o.float() * 2.0 + 1.0

    inputs = sdpa_inputs(0, seed=50)
    eager = attention_epilogue(*inputs)
    torch._dynamo.reset()
    builds = tch.stats.graphs()["builds"]
    compiled = torch.compile(attention_epilogue, fullgraph=True)(*inputs)
    print(f"\ncompiled call: {tch.stats.graphs()['builds'] - builds} new builds")
    torch.testing.assert_close(compiled, eager, atol=1e-2, rtol=1e-2)
    assert_matches_torch(((compiled - 1.0) / 2.0).to(DTYPE), *inputs, what="compiled")


# -- e: CUDA-graph capture ----------------------------------------------------------------


def test_cuda_graph_capture_of_a_frost_plan(frost_sdpa, record_property):
    frost_sdpa.require()
    static = sdpa_inputs(0, seed=60)
    try:
        cuda_graph, captured = warm_up_and_capture(frost_sdpa.graph_id, static)
    except RuntimeError as error:
        messages = exception_messages(error)
        print("\nfrost capture: REFUSED: " + " <- ".join(messages))
        record_property("frost_capture", "refused: " + " <- ".join(messages))
        assert any("captur" in message.lower() for message in messages), f"capture failed without saying why: {messages}"
        torch.cuda.synchronize()
        fresh = sdpa_inputs(0, seed=61)
        assert_matches_torch(execute(frost_sdpa.graph_id, fresh)[0], *fresh, what="the first eager call after a refused capture")
        return
    replay_with(cuda_graph, static, captured, (61, 62), "captured frost call")
    print("\nfrost capture: captured and replayed correctly")
    record_property("frost_capture", "captured and replayed")


# -- f: a cold thread -------------------------------------------------------------------


def test_a_cold_thread_runs_and_builds_frost_graphs(frost_sdpa):
    frost_sdpa.require()
    inputs = sdpa_inputs(0, seed=70)
    torch.cuda.synchronize()

    def run(graph_id):
        (output,) = execute(graph_id, inputs)
        torch.cuda.synchronize(0)
        return output

    # A thread that never touched CUDA runs a built frost plan ...
    assert_matches_torch(run_in_thread(lambda: run(frost_sdpa.graph_id)), *inputs, what="cold thread, built graph")
    # ... and builds one (the registry's build, on a thread with no context of its own).
    graph_id = tch.register_graph(causal_sdpa_inference, name="frost_sdpa_cold_thread")
    assert_matches_torch(run_in_thread(lambda: run(graph_id)), *inputs, what="cold thread, first call")
    assert_served_by_frost(graph_id, 0)


# -- h: build time (a report, no assertion on it) ----------------------------------------


def test_report_frost_build_time(frost_sdpa, record_property):
    frost_sdpa.require()
    inputs = sdpa_inputs(0, seed=80)
    # A fresh id of the same layout: the registry builds again, the compiled kernel is reused.
    graph_id = tch.register_graph(causal_sdpa_inference, name="frost_sdpa_second_build")
    torch.cuda.synchronize()
    before = compiled_cache_stats()
    start = time.perf_counter()
    execute(graph_id, inputs)
    torch.cuda.synchronize()
    second_build_s = time.perf_counter() - start
    second_delta = counter_delta(before, compiled_cache_stats())
    times = []
    for _ in range(20):
        start = time.perf_counter()
        execute(frost_sdpa.graph_id, inputs)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    warm_ms = sorted(times)[len(times) // 2] * 1e3
    (built,) = frost_sdpa.require()
    print(
        f"\nfrost build time on cuda:0 (engine {built.engine}, B,H,S,D={SHAPE}, bf16): first call {frost_sdpa.first_call_s:.2f} s "
        f"(frontend compiled-kernel cache: {frost_sdpa.cache_delta or 'no change: compiled in-process earlier, or by its own lru cache'}); "
        f"a second graph id of the same layout {second_build_s:.3f} s ({second_delta or 'no cache counter moved'}); "
        f"warm call {warm_ms:.3f} ms (median of 20, synchronized)"
    )
    record_property("frost_engine", built.engine)
    record_property("frost_first_call_s", round(frost_sdpa.first_call_s, 3))
    record_property("frost_first_call_compiled_cache", str(frost_sdpa.cache_delta))
    record_property("frost_second_build_s", round(second_build_s, 3))
    record_property("frost_warm_call_ms", round(warm_ms, 3))


# -- g: eviction while a capture holds the plan (last: it empties the registry's cache) ------


def test_a_captured_frost_call_survives_eviction():
    graph_id = tch.register_graph(causal_sdpa_inference, name="frost_sdpa_evicted")
    static = sdpa_inputs(0, seed=90)
    try:
        cuda_graph, captured = warm_up_and_capture(graph_id, static)  # builds it (warm-up) first
    except RuntimeError as error:
        pytest.skip(f"a frost plan cannot be captured here, so nothing to evict under capture: {' <- '.join(exception_messages(error))}")
    assert_served_by_frost(graph_id, 0)
    stats = tch.stats.graphs()
    try:
        tch.settings.set_graph_cache_capacity(1)
        for m in (16, 32, 48):  # other layouts through the op: each build evicts the least recently used
            a = torch.randn(1, m, 16, device="cuda", dtype=torch.float16)
            b = torch.randn(1, 16, 16, device="cuda", dtype=torch.float16)
            torch.testing.assert_close(execute(MATMUL, [a, b])[0], torch.bmm(a, b), atol=2e-2, rtol=2e-2)
        assert tch.built_graphs(graph_id) == [], "the frost graph is still cached"
        assert tch.stats.graphs()["evictions"] > stats["evictions"]
        replay_with(cuda_graph, static, captured, (91, 92), "captured frost call after its graph was evicted")
    finally:
        tch.settings.set_graph_cache_capacity(stats["capacity"])
    del cuda_graph, captured
    torch.cuda.synchronize()
    # The next call builds it again and is still right.
    fresh = sdpa_inputs(0, seed=93)
    assert_matches_torch(execute(graph_id, fresh)[0], *fresh, what="rebuilt after eviction")
