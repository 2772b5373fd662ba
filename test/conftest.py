import contextlib
import functools
import importlib.util
import os
import sys
import threading

import pytest
import torch

# The suite's graphs are built, not loaded from a plan store an earlier run (or another
# test's same graph) left behind: tests of built graphs' plans, tuning and routes stay
# about this run. test_plan_store*.py and test_plan_cache_gpu.py turn it on, per test,
# in a tmp_path (settings.set_plan_store, or the variables for a subprocess).
os.environ.setdefault("TORCH_CUDNN_HANDLE_PLAN_STORE", "0")
# Likewise a layout's first call builds its plan, whatever a launcher's stand_in_calls: the tests
# of built plans run on plans from their first call; test/nn/test_first_calls_gpu.py and
# test/registry/test_first_calls.py set it where they test the stand-ins.
os.environ.setdefault("TORCH_CUDNN_HANDLE_STAND_IN_CALLS", "0")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)  # the tests' helpers: the support package (support/graphs.py, ...)


def _load_by_path(name: str, path: str):
    """A module from its file, without putting the repository on sys.path: the tests
    import torch_cudnn_handle as installed (editable or not), never the checkout's copy
    by accident of the path."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


load_auxiliary = _load_by_path("extension_build", os.path.join(ROOT, "tools", "extension_build.py")).load_auxiliary


def _missing_cute_dsl():
    try:
        import cutlass  # noqa: F401  -- the CuTe DSL the frost engines (and one adopted seam) need
    except Exception as error:  # noqa: BLE001 -- ImportError, or its CUDA libraries failing to load
        return f"needs the CuTe DSL (nvidia-cutlass-dsl with its CUDA libraries; import cutlass: {type(error).__name__}: {error})"
    return None


# The markers pyproject.toml registers, each with what its test needs: a reason when that is
# missing here, else None. Checked in this order (a GPU, then the DSL, then a second GPU: the
# order test_frost_gpu.py checked them in), each at most once per process.
REQUIREMENTS = {
    "gpu": functools.cache(lambda: None if torch.cuda.is_available() else "needs a CUDA GPU"),
    "dsl": functools.cache(_missing_cute_dsl),
    "two_gpus": functools.cache(lambda: None if torch.cuda.device_count() >= 2 else "needs two CUDA GPUs"),
}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """The one skip rule for hardware and the CuTe DSL: a test marked gpu, two_gpus or dsl
    (itself, or its module by ``pytestmark``) is skipped where that is missing, before its
    fixtures, with the first missing one's reason. The skip is a skipif mark put ahead of the
    test's own, so the report names the test's file and line, and no other skipif of the
    test (the native path off, say) speaks first. Runs ahead of pytest's own skipping."""
    for marker, missing in REQUIREMENTS.items():
        if item.get_closest_marker(marker) is not None:
            reason = missing()
            if reason is not None:
                item.add_marker(pytest.mark.skipif(True, reason=reason), append=False)
                return


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist's ``--dist loadgroup`` (the GPU rounds: .ci/gpu-round), each file
    is one group, as under ``loadfile`` (a file's tests share its graphs), except the
    documentation's code blocks, each run in a fresh interpreter: left ungrouped, they
    spread over the workers (in one worker, one after another, they were the long pole of
    a GPU round: docs/testing.md)."""
    if getattr(config.option, "dist", "no") != "loadgroup":
        return
    for item in items:
        if "block" not in getattr(getattr(item, "callspec", None), "params", {}):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


ENGINELESS = ("unable to find an engine", "SUBLIBRARY_UNAVAILABLE")


def skip_where_cudnn_lacks_engines(error: BaseException, what: str):
    """Skip, with the reason, where the cuDNN loaded has no engine for ``what`` (the
    runtime-compiled-only wheel of 9.27 has no precompiled engines and no legacy
    sub-libraries: torch's own convolutions and batch norm fail there too); else re-raise."""
    if not any(marker in str(error) for marker in ENGINELESS):
        raise error
    import cudnn

    pytest.skip(f"cuDNN {cudnn.backend_version()} here has no engine for {what} (no precompiled engines): {str(error)[:200]}")


requires_native_path = pytest.mark.skipif(
    os.environ.get("TORCH_CUDNN_HANDLE_NATIVE", "1") == "0",
    reason="the native path is off (TORCH_CUDNN_HANDLE_NATIVE=0): every backward goes through Python",
)


def build_pool_seam():
    """The pool's CPU test seam (test/support/csrc/pool_seam.cpp), a test-only extension:
    compiled on first use (tools/extension_build.py; CPU-only C++, so the same with a CPU or
    a CUDA torch). It compiles its own copy of
    csrc/pool/fork_guard.cpp: its fork guard's state is its own, separate from _C's,
    which is what test_pool_seam.py tests (the pool template together with the guard).
    -fvisibility=hidden keeps that copy's symbols bound inside the seam."""
    return load_auxiliary("pool_seam", ["test/support/csrc/pool_seam.cpp", "csrc/pool/fork_guard.cpp"], kind="test", with_cuda=False,
                          extra_cflags=("-O2", "-fvisibility=hidden"))


@pytest.fixture(scope="session")
def pool_seam():
    """The built seam module: reserve(device), counts(), set_create_delay_us(us),
    max_concurrent_creates(). A build failure errors the tests that use it (once)."""
    return build_pool_seam()


def outcome_in_forked_child(action) -> str:
    """Fork, run ``action()`` in the child and return what happened there: "no error",
    or the message of the RuntimeError it raised. The child leaves with os._exit, so
    it runs nothing of the parent's (no atexit, no pytest teardown)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            action()
            message = b"no error"
        except RuntimeError as error:
            message = str(error).encode()
        os.write(write, message)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode()
    os.waitpid(pid, 0)
    return message


def run_concurrently(fn, count: int) -> list:
    """``[fn(0), ..., fn(count - 1)]``, each on its own new thread, all released
    together by a barrier; the first exception any thread raised is re-raised here."""
    barrier = threading.Barrier(count)
    results, errors = [None] * count, []

    def body(i):
        try:
            barrier.wait()
            results[i] = fn(i)
        except BaseException as error:  # noqa: BLE001 -- re-raised on the calling thread
            errors.append(error)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


@pytest.fixture
def fresh_settings():
    """torch_cudnn_handle.settings with every value set() back to the environment and
    defaults after the test."""
    from torch_cudnn_handle import settings

    settings.reset()
    yield settings
    settings.reset()


@pytest.fixture
def fresh_dynamo():
    """torch._dynamo reset before and after the test: no frame compiled by another test
    counts or is reused (a module takes it with ``pytest.mark.usefixtures``)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def frontend_outputs_of(built, inputs) -> list:
    """The frontend's own execute of ``built`` (a BuiltGraph) on ``inputs``, on the pooled
    handle, into fresh outputs of the layouts the build writes; synchronized."""
    import torch_cudnn_handle as tch

    device = torch.device("cuda", built.device)
    outputs = [torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device=device) for s in built.layout.outputs]
    workspace = torch.empty(max(built.workspace_size, 1), dtype=torch.uint8, device=device)
    built.graph.execute([*inputs, *outputs], workspace, handle=tch.current_handle(device), tensor_uids=built.uids)
    torch.cuda.synchronize(device)
    return outputs


def run_in_thread(fn):
    """``fn()`` on a new thread (a cold one: no handle, no CUDA context yet); its
    exception, if any, is re-raised here."""
    return run_concurrently(lambda _: fn(), 1)[0]


@contextlib.contextmanager
def python_backward_calls():
    """Records the graph id of every backward that reaches Python (a backward function,
    or a declared backward graph no native plan serves yet); a declared backward that a
    native plan serves runs in C++ and is not recorded."""
    from torch_cudnn_handle.op import backward as op_backward

    calls = []

    def recording(graph, grad_outputs, inputs, outputs):
        calls.append(graph)
        return op_backward.backward(graph, grad_outputs, inputs, outputs)

    def recording_declared(graph, operands, num_inputs):
        calls.append(graph)
        return op_backward.run_declared_backward(graph, operands, num_inputs)

    with python_kernels(backward=recording, run_declared_backward=recording_declared):
        yield calls


@contextlib.contextmanager
def python_kernels(**replacements):
    """The op's Python kernels (op/python_path.py, op/backward.py) with some replaced for the
    duration: ``execute``, ``execute_out``, ``execute_in_place``, ``backward``,
    ``run_declared_backward``; the originals are put back after."""
    from torch_cudnn_handle import _C
    from torch_cudnn_handle.op import backward as op_backward, python_path

    kernels = dict(execute=python_path.execute, execute_out=python_path.execute_out, execute_in_place=python_path.execute_in_place,
                   backward=op_backward.backward, run_declared_backward=op_backward.run_declared_backward)
    order = ("execute", "execute_out", "execute_in_place", "backward", "run_declared_backward")
    _C._set_python_kernels(*(replacements.get(name, kernels[name]) for name in order))
    try:
        yield kernels
    finally:
        _C._set_python_kernels(*(kernels[name] for name in order))


def pytest_runtest_logreport(report):
    """GPU rounds (.ci/gpu-round) can be cut short by their stage timeout before pytest prints
    its summary; with $LIVE_FAILURES set, the controller appends each failure (traceback
    included) and each test slower than 10 s (with the tail of what it printed) to that file
    as the report arrives."""
    path = os.environ.get("LIVE_FAILURES")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if report.failed or (report.when == "call" and report.duration > 10):
        with open(path, "a") as log:
            outcome = "FAILED" if report.failed else "slow"
            log.write(f"=== {outcome} {report.nodeid} ({report.when}, {report.duration:.1f} s)\n")
            if report.failed:
                log.write(report.longreprtext[-4000:] + "\n")
            elif report.capstdout:
                log.write(report.capstdout[-1500:] + "\n")
