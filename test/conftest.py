import os
import sys
import threading

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _shared_libstdcxx() -> list:
    """The libstdc++.so.6 this process runs with, named on the link line, as setup.py
    does for _C (a toolchain that links libstdc++ statically gives the extension a
    second copy of its locale machinery; see test/test_build.py)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if os.path.basename(path).startswith("libstdc++.so"):
                return [path]
    return []


def build_pool_seam():
    """The pool's CPU test seam (test/csrc/pool_seam.cpp), a test-only extension:
    compiled here on first use with torch.utils.cpp_extension.load (needs ninja; CPU-only
    C++, so the same with a CPU or a CUDA torch), cached under build/test_extensions/<python, torch>/
    and rebuilt only when its sources or flags change. It compiles its own copy of
    csrc/pool/fork_guard.cpp: its fork guard's state is its own, separate from _C's,
    which is what test_pool_seam.py tests (the pool template together with the guard).
    -fvisibility=hidden keeps that copy's symbols bound inside the seam."""
    from torch.utils.cpp_extension import load

    # One folder per Python and torch: load() rebuilds on changed sources or flags only.
    tag = f"py{sys.version_info.major}{sys.version_info.minor}_torch{torch.__version__}"
    build_directory = os.path.join(ROOT, "build", "test_extensions", tag, "pool_seam")
    os.makedirs(build_directory, exist_ok=True)
    return load(
        name="torch_cudnn_handle_pool_seam",
        sources=[os.path.join(HERE, "csrc", "pool_seam.cpp"), os.path.join(ROOT, "csrc", "pool", "fork_guard.cpp")],
        extra_include_paths=[os.path.join(ROOT, "csrc")],
        extra_cflags=["-O2", "-fvisibility=hidden"],
        extra_ldflags=_shared_libstdcxx(),
        build_directory=build_directory,
        with_cuda=False,
        verbose=False,
    )


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


def run_in_thread(fn):
    """``fn()`` on a new thread (a cold one: no handle, no CUDA context yet); its
    exception, if any, is re-raised here."""
    return run_concurrently(lambda _: fn(), 1)[0]
