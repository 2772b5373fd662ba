"""Every bench/ entry point that measures on a GPU, run on a machine without one, says so
in one line on stderr ("bench/<script>: needs a CUDA GPU (...)", bench/timing.py's
require_cuda_gpu) and exits with status 2: no traceback. The entry points are found, not
listed: every bench/*.py with a ``__main__`` block. What works without a GPU is tested
elsewhere: ``--help`` and ``report.py --from-json`` (test_bench_render.py)."""

import glob
import os
import subprocess
import sys

import pytest
import torch
from support.paths import REPO

ROOT = REPO
BENCH = os.path.join(ROOT, "bench")


def _entry_points():
    scripts = []
    for path in sorted(glob.glob(os.path.join(BENCH, "*.py"))):
        with open(path, encoding="utf-8") as file:
            if 'if __name__ == "__main__":' in file.read():
                scripts.append(os.path.basename(path))
    return scripts


SCRIPTS = _entry_points()


def test_the_entry_points_are_found():
    assert {"new_shapes.py", "report.py", "modules.py", "bench_op.py", "thread_scaling.py"} <= set(SCRIPTS), SCRIPTS


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the scripts would measure")
@pytest.mark.parametrize("script", SCRIPTS)
def test_a_gpu_script_without_a_gpu_says_so_and_exits_2(script):
    result = subprocess.run([sys.executable, os.path.join(BENCH, script)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines, "nothing on stderr"
    line = lines[-1]
    assert line.startswith(f"bench/{script}: needs a CUDA GPU ("), line
    why = "is a CPU-only build" if torch.version.cuda is None else "torch.cuda.is_available() is False"
    assert why in line, line
    assert result.stdout == "", result.stdout  # it stopped before measuring anything
