"""A process that exits while other threads are inside cuDNN builds: the registry's exit
hook waits for the builds in flight (a bounded time: graph_cache.EXIT_WAIT_SECONDS) before
the interpreter tears down, so a daemon thread is never inside a build while Python
finalizes (that was a SIGSEGV on the H200). Without a GPU the build is a stand-in that
takes its time (a CPU seam: the cache's build function); on a GPU the builds are real."""

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from support.paths import REPO
from support.timed_builds import define_relu, timed_cache

SLOW_BUILD = """
import sys, time
from torch_cudnn_handle.registry import build as build_module, graph_cache

def slow_build(definition, device, specs, route, fetch_only=False):
    time.sleep({seconds})
    built = build_module.BuiltGraph(graph=None, device=device, inputs=specs, layout=build_module.GraphLayout((), ()), uids=(),
                                    workspace_size=0, phase_seconds={{}})
    print("built " + definition.name, flush=True)  # one write per line: whole lines
    sys.stdout.flush()
    return built

graph_cache.build = slow_build  # the seam: no cuDNN on this machine
graph_cache._capturing = lambda device: False
"""


def test_wait_for_builds_returns_once_none_is_in_flight(monkeypatch):
    import torch

    cache = timed_cache(monkeypatch, 0.3)
    ids = [define_relu(cache.definitions, f"g{i}") for i in range(4)]
    x = torch.empty(2, 3, 4)
    threads = [threading.Thread(target=cache.lookup, args=(gid, 0, [x], ((2, 3, 4),)), daemon=True) for gid in ids]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while cache.wait_for_builds(0) == 0 and time.monotonic() < deadline:
        time.sleep(0.001)  # until the builds are in flight
    assert cache.wait_for_builds(0.01) == 4  # bounded: still building
    assert cache.wait_for_builds(5) == 0
    assert cache.stats()["builds"] == 4


@pytest.mark.parametrize("threads", [4, 8])
def test_a_process_exiting_with_builds_in_flight_waits_for_them(threads):
    script = textwrap.dedent(SLOW_BUILD.format(seconds=0.5)) + textwrap.dedent(f"""
        import threading, torch
        from torch_cudnn_handle import registry
        ids = [registry.register_graph(lambda g, x: g.relu(x), name=f"g{{i}}") for i in range({threads})]
        x = torch.empty(2, 3, 4)
        started = threading.Barrier({threads} + 1)
        def call(gid):
            started.wait()
            registry.built_for(gid, 0, [x], ((2, 3, 4),), False)
        for gid in ids:
            threading.Thread(target=call, args=(gid,), daemon=True).start()
        started.wait()
        time.sleep(0.05)
        print("exiting", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("built g") == threads and done.stdout.index("exiting") < done.stdout.index("built"), done.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("threads", [4, 8])
def test_exiting_with_real_builds_in_flight_never_segfaults(threads):
    """20 runs (5 at a time): daemon threads each inside a cuDNN build (a new layout per
    thread) when the main thread exits. None may die of SIGSEGV (-11); each exits 0 or,
    like a process whose threads are mid-call in torch.bmm (test_semantics_gpu's exit
    test), aborts (-6) when a daemon thread takes the GIL back during finalization."""
    script = textwrap.dedent(f"""
        import threading, torch, torch_cudnn_handle as tch
        from torch_cudnn_handle.nn import FusedLinear
        layer = FusedLinear(1024, 1024, "gelu", device="cuda", dtype=torch.bfloat16)
        started = threading.Barrier({threads} + 1)
        def build(i):
            x = torch.randn(1, 64 + 8 * i, 1024, device="cuda", dtype=torch.bfloat16)
            started.wait()
            layer(x)
        for i in range({threads}):
            threading.Thread(target=build, args=(i,), daemon=True).start()
        started.wait()
    """)
    runs = []
    for _ in range(4):
        batch = [subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for _ in range(5)]
        runs += [(run.returncode, err) for run, (_, err) in ((run, run.communicate(timeout=300)) for run in batch)]
    codes = [code for code, _ in runs]
    aborted = next((err for code, err in runs if code != 0), "")
    print(f"exit codes over 20 runs: {dict((c, codes.count(c)) for c in sorted(set(codes)))}; first non-zero's stderr:\n{aborted[-1200:]}")
    assert -11 not in codes and set(codes) <= {0, -6}, (codes, aborted[-2000:])
