"""Where calls serialize across threads, measured in C++ (no GIL anywhere): calls per
second of T threads (1/4/16/64), each on its own stream and (for cuDNN) its own handle,
started together and timed until every stream is done, for

* ``cudnn_fe.execute``: the op through the dispatcher, its native path;
* ``torch.bmm``: the same product, the baseline;
* ``cudnnBackendExecute``: the op's floor, the same serialized plan executed alone
  (thread's own handle, a variant pack built once): one plan descriptor shared by all
  threads, as the op shares it, and one plan per thread.

If the op scales like the backend alone, what serializes is cuDNN's; if a plan per
thread scales better than a shared one, cuDNN serializes on the plan.

bench/csrc/thread_scaling.cpp is a bench-only extension built here on first use
(tools/extension_build.py; needs ninja, the CUDA toolkit and a CUDA torch).

    python bench/thread_scaling.py [--calls 2000] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
THREAD_COUNTS = (1, 4, 16, 64)
SIZES = ((1, 16, 16, 16), (8, 256, 256, 256))
CANDIDATES = ("cudnn_fe.execute", "torch.bmm", "cudnnBackendExecute, shared plan", "cudnnBackendExecute, plan per thread")


def build():
    """The extension, compiled on first use (tools/extension_build.py)."""
    sys.path.insert(0, ROOT)
    from tools.extension_build import load_cuda_bench

    return load_cuda_bench("thread_scaling", ["bench/csrc/thread_scaling.cpp", "csrc/backend/cudnn_library.cpp", "csrc/backend/descriptors.cpp"])


class BackendCall:
    """What cudnnBackendExecute alone needs to run the plan the op runs for ``inputs`` of
    ``graph_id``, once per thread: the plan's JSON and pack uids, and per thread the
    pointers the op would pass (its operands, pass-by-value scalars in host memory,
    workspace tensors, replacements), its workspace and the regions zeroed before each call.
    ``why`` says why there is none (the graph is not served by a native plan)."""

    def __init__(self, graph_id: int, inputs, threads: int, operand_sets=None):
        import torch

        import torch_cudnn_handle as tch
        from torch_cudnn_handle.native import backend_plan_of
        from torch_cudnn_handle.registry import TensorSpec

        with torch.no_grad():
            tch.execute(graph_id, inputs)  # built (and registered natively) here
        specs = tuple(TensorSpec.of(t) for t in inputs)
        device = inputs[0].device
        built = next(b for b in tch.built_graphs(graph_id) if b.inputs == specs and b.device == device.index)
        spec, self.why = backend_plan_of(built.graph, built.uids)
        self.device, self.plan_json, self.uids = device.index, None, []
        self.pointers, self.workspace, self.memsets, self._keep = [], [], [], []
        if spec is None:
            return
        self.plan_json = spec.plan_json
        self.uids = list(built.uids) + [uid for uid, _ in spec.by_value] + [uid for uid, _, _ in spec.workspace_tensors] + \
            [uid for uid, _, _ in spec.replacements]
        scalars = [torch.frombuffer(bytearray(value.ljust(8, b"\0")), dtype=torch.uint8) for _, value in spec.by_value]
        self._keep += scalars
        for t in range(threads):
            operands = list(operand_sets[t]) if operand_sets is not None else list(inputs)
            outputs = [torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device=device) for s in built.layout.outputs]
            workspace = torch.empty(max(built.workspace_size, 1), dtype=torch.uint8, device=device)
            self._keep += [operands, outputs, workspace]
            base = workspace.data_ptr()
            pointers = [tensor.data_ptr() for tensor in operands + outputs] + [scalar.data_ptr() for scalar in scalars]
            pointers += [base + offset for _, offset, _ in spec.workspace_tensors]
            by_uid = dict(zip(self.uids, pointers))
            pointers += [by_uid[source] + offset for _, source, offset in spec.replacements]
            self.pointers.append(pointers)
            self.workspace.append(base + spec.fe_workspace_size if built.workspace_size else 0)
            self.memsets.append([(base + offset, zeroed) for _, offset, zeroed in spec.workspace_tensors if zeroed])

    def issue_us(self, extension, calls: int) -> float:
        """Host microseconds one thread takes to issue one cudnnBackendExecute of the plan."""
        return extension.backend_issue_us(self.plan_json, self.uids, self.pointers[0], self.workspace[0], self.memsets[0],
                                          calls, device=self.device)

    def calls_per_second(self, extension, threads: int, calls: int, shared_plan: bool = True) -> float:
        return extension.backend_calls_per_second(self.plan_json, self.uids, self.pointers, self.workspace, self.memsets,
                                                  shared_plan, threads, calls, device=self.device)


def measure(calls: int = 2000, rounds: int = 3) -> List[dict]:
    import torch

    sys.path.insert(0, HERE)
    from bench_op import MATMUL

    extension = build()
    rows = []
    for batch, m, k, n in SIZES:
        size = f"{batch}x{m}x{k} @ {batch}x{k}x{n} fp16"
        operands = [
            [torch.randn(batch, m, k, device="cuda", dtype=torch.float16), torch.randn(batch, k, n, device="cuda", dtype=torch.float16)]
            for _ in range(max(THREAD_COUNTS))
        ]
        backend = BackendCall(MATMUL, operands[0], max(THREAD_COUNTS), operands)
        torch.cuda.synchronize()
        timers = {
            "cudnn_fe.execute": lambda t: extension.op_calls_per_second(MATMUL, operands, t, calls),
            "torch.bmm": lambda t: extension.bmm_calls_per_second(operands, t, calls),
        }
        if backend.plan_json is not None:
            for shared, name in ((True, CANDIDATES[2]), (False, CANDIDATES[3])):
                timers[name] = lambda t, shared=shared: backend.calls_per_second(extension, t, calls, shared)
        note = "" if backend.plan_json else f" (no backend-alone rows: {backend.why})"
        print(f"\n### C++ threads, {size}, {calls} calls per thread{note}\n", flush=True)
        print("| threads | " + " | ".join(f"{name} calls/s" for name in timers) + " | op / bmm | op / backend shared |")
        print("| ---: |" + " ---: |" * (len(timers) + 2))
        for threads in THREAD_COUNTS:
            samples: Dict[str, List[float]] = {name: [] for name in timers}
            for index in range(rounds):
                for name in (list(timers) if index % 2 == 0 else reversed(list(timers))):
                    samples[name].append(timers[name](threads))
            rate = {name: statistics.median(values) for name, values in samples.items()}
            row = dict(size=size, threads=threads, calls_per_thread=calls, rates=rate,
                       op_over_bmm=rate["cudnn_fe.execute"] / rate["torch.bmm"])
            if CANDIDATES[2] in rate:
                row["op_over_backend"] = rate["cudnn_fe.execute"] / rate[CANDIDATES[2]]
            rows.append(row)
            backend_ratio = f"{row['op_over_backend']:.2f}x" if "op_over_backend" in row else "-"
            print(f"| {threads} | " + " | ".join(f"{rate[name]:,.0f}" for name in timers) + f" | {row['op_over_bmm']:.2f}x | {backend_ratio} |", flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    rows = measure(args.calls, args.rounds)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
