"""bench/report.py renders a saved report.json (``--from-json``) without a GPU: the
module table (untuned and tuned runs), the GPU-work and thread-scaling sections, and
reports in the earlier format. The benchmark scripts answer ``--help`` on a CPU machine.
Nothing here measures or asserts a time."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from support.paths import REPO as ROOT

BENCH = os.path.join(ROOT, "bench")
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None

MACHINE = {"python": "3.11", "torch": "2.11.0+cu130 (CUDA 13.0)", "GPU": "NVIDIA H200, sm_90, 132 SMs, 139 GiB"}


def module_row(run, key, module, config, size, shape, mode, ms, unavailable=None):
    alternatives = {name: value for name, value in ms.items() if name != "library"}
    fastest = min(alternatives, key=alternatives.get)
    return dict(key=key, module=module, config=config, size=size, input=shape, mode=mode, dtype="bf16", run=run,
                tuned=run == "tuned", ms=ms, unavailable=unavailable or {}, fastest=fastest,
                ratio=ms["library"] / alternatives[fastest], iters=10, rounds=5, max_abs_diff={})


def synthetic_report() -> dict:
    rows = []
    for run, scale in (("untuned", 1.0), ("tuned", 0.8)):
        for mode, base in (("fwd", 0.1), ("fwd+bwd", 0.3)):
            rows.append(module_row(run, "sdpa", "sdpa (causal)", "sdpa(causal) D=64", "small", "q, k, v [4, 16, 1024, 64]", mode,
                                   {"library": 2 * base * scale, "torch flash": base * 1.5, "torch cuDNN": base, "frontend op": base * 1.1}))
            block = module_row(run, "block", "TransformerBlock", "TransformerBlock(512, 8)", "small", "x [8, 256, 512]", mode,
                               {"library": base * 3, "torch eager": base * 4, "torch compile": base * 2, "library compile": base * 1.5})
            block["ratio"] = base * 3 / (base * 2)
            block["fastest"] = "torch compile"
            block["compiled_ratio"] = 0.75
            rows.append(block)
            rows.append(module_row(run, "linear_gelu", "FusedLinear(gelu)", "FusedLinear(1024, 4096, 'gelu')", "small", "x [2048, 1024]", mode,
                                   {"library": base * scale, "torch eager": base * 2, "torch compile": base * 4},
                                   {"frontend op": "no torch op for a dense linear + bias + gelu"}))
    return {
        "date": "2026-01-01 00:00 UTC",
        "command": "python bench/report.py",
        "machine": MACHINE,
        "host_overhead": [
            dict(table="1x16x16 @ 1x16x16 fp16: against torch.bmm", candidate=name, us=us, ratio=us / 12.0, baseline="torch.bmm", goal=goal,
                 source="bench_op.py")
            for name, us, goal in (("torch.bmm", 12.0, None), ("cudnn_fe.execute (functional)", 13.0, 1.0))
        ],
        "thread_scaling": [
            dict(size="1x16x16 @ 1x16x16 fp16", threads=t, calls_per_thread=1000, op_calls_per_s=70000.0 / t, eager_calls_per_s=80000.0 / t,
                 bmm_calls_per_s=90000.0 / t, ratio=7 / 9, eager_ratio=8 / 9)
            for t in (1, 4, 16, 64)
        ],
        "thread_scaling_cpp": [
            dict(size="1x16x16 @ 1x16x16 fp16", threads=t, calls_per_thread=2000, op_over_bmm=0.5, op_over_backend=0.95,
                 rates={"cudnn_fe.execute": 40000.0, "torch.bmm": 80000.0, "cudnnBackendExecute, shared plan": 42000.0,
                        "cudnnBackendExecute, plan per thread": 41000.0})
            for t in (1, 4, 16, 64)
        ],
        "measured": {"threads": "2026-01-01 00:00 UTC", "modules": "2026-01-01 00:10 UTC"},
        "notes": ["**sdpa small fwd+bwd**: host-bound, the same kernels as torch's cuDNN backend"],
        "gpu_work": [
            dict(graph="matmul [8, 2048, 2048] @ [8, 2048, 2048] fp16", graph_id=3, native=True, path_reason="backend plan, run from C++",
                 workspace_bytes=0, op_ms=0.2101, frontend_ms=0.2100, ratio=0.2101 / 0.2100, op_kernels={"sm90_gemm_kernel": [1.0, 209.0]},
                 frontend_kernels={"sm90_gemm_kernel": [1.0, 209.0]}, same_kernels=True, outputs_equal=True, calls=100, rounds=7)
        ],
        "module_table": rows,
        "module_table_runs": {
            "untuned": dict(returncode=0, seconds=120.0, complete=True, env={"TORCH_CUDNN_HANDLE_TUNE": None}),
            "tuned": dict(returncode=0, seconds=60.0, complete=True, env={"TORCH_CUDNN_HANDLE_TUNE": "1", "TORCH_CUDNN_HANDLE_TUNING_CACHE": "<tmp>/tuning_cache"}),
        },
    }


def render(tmp_path, data) -> str:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, os.path.join(BENCH, "report.py"), "--from-json", str(path), "--out", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    if HAVE_MATPLOTLIB:
        assert (out / "report.png").stat().st_size > 10_000
    else:
        assert "matplotlib is not installed" in result.stdout
    return (out / "REPORT.md").read_text()


def test_renders_the_module_table_both_runs(tmp_path):
    report = render(tmp_path, synthetic_report())
    assert "## 4. The nn modules against every alternative" in report
    assert "| module | size | input | mode | library / fastest (untuned) | fastest (untuned) | library / fastest (tuned) | fastest (tuned) |" in report
    # sdpa small fwd: untuned 0.2 / 0.1 (torch cuDNN), tuned 0.16 / 0.1
    assert "| sdpa(causal) D=64 | small | q, k, v [4, 16, 1024, 64] | fwd | 2.00x | torch cuDNN | 1.60x | torch cuDNN |" in report
    assert "### untuned run: every candidate" in report and "### tuned run: every candidate" in report
    assert "torch flash 0.150, torch cuDNN 0.100, frontend op 0.110" in report
    assert "frontend op -" in report and "no torch op for a dense linear + bias + gelu" in report
    # the other new sections
    assert "## 3. The op adds no GPU work" in report and "1.000x" in report
    assert "| 1 | 70,000 | 80,000 | 90,000 | 0.78x | 0.89x |" in report
    assert "### The library's module under torch.compile" in report
    assert "| TransformerBlock(512, 8) | small | fwd | untuned | 0.300 | 0.150 | torch compile 0.200 | 0.75x |" in report
    assert "### C++ threads: where calls serialize" in report
    assert "| 16 | 40,000 | 80,000 | 42,000 | 41,000 | 0.50x | 0.95x |" in report
    assert "sections measured: threads 2026-01-01 00:00 UTC; modules 2026-01-01 00:10 UTC" in report
    assert "## Goals not met: the measured reasons" in report and "- **sdpa small fwd+bwd**: host-bound" in report
    assert "![plots](report.png)" in report


def test_renders_an_earlier_report(tmp_path):
    data = synthetic_report()
    for key in ("gpu_work", "module_table", "module_table_runs", "thread_scaling_cpp", "measured", "notes"):
        del data[key]
    for row in data["thread_scaling"]:
        del row["eager_calls_per_s"], row["eager_ratio"]
    data["module_steps"] = [dict(module="RMSNorm(4096)", input="x [8, 512, 4096]", cudnn_ms=0.36, torch_ms=0.82, ratio=0.44)]
    report = render(tmp_path, data)
    assert "| 1 | 70,000 | - | 90,000 | 0.78x | - |" in report
    assert "| RMSNorm(4096) | x [8, 512, 4096] | 0.360 | 0.820 | 0.44x |" in report
    assert "## 4." not in report


@pytest.mark.parametrize("script", ["report.py", "modules.py", "profile_steps.py", "gpu_work.py", "thread_scaling.py"])
def test_scripts_answer_help_without_a_gpu(script):
    result = subprocess.run([sys.executable, os.path.join(BENCH, script), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
