"""Where calls serialize across threads, and which route around it scales, measured in
C++ (no GIL anywhere): calls per second of T threads (1/4/16/64), each on its own stream
and (for cuDNN) its own handle, started together and timed until every stream is done, for

* ``cudnn_fe.execute``: the op through the dispatcher, its native path, on the plan the
  registry picks (an engine without cuDNN's SUPPORTS_CUDA_GRAPH_NATIVE_API note here), so
  once a call's addresses repeat it launches a CUDA graph captured from one execute
  (Note [Native CUDA graph launch], csrc/native/plan_graphs.h); each thread's output
  buffer comes back from torch's caching allocator at the same address every call;
* ``cudnn_fe.execute, graph-capable plan``: the same op on a matmul whose builder selects
  engines with the note, so cuDNN populates the graphs it launches;
* ``torch.bmm``: the same product, the baseline;
* (a) ``cudnnBackendExecute, shared plan``: the op's floor without graph launch, the same serialized plan
  executed alone (thread's own handle, a variant pack built once), one plan descriptor
  shared by all threads, as the op shares it;
* (b) ``cudnnBackendExecute, plan per thread``: each thread its own plan, finalized
  separately (if the contention were per plan, this would scale);
* (d) ``cudnnBackendExecute, graph-capable plan``: as (a), with the plan the graph rows
  use (an engine with cuDNN's SUPPORTS_CUDA_GRAPH_NATIVE_API note), so (c) against (d)
  is the launch route alone, not a different engine;
* (c) cuDNN's native CUDA graph of that plan, populated and instantiated once per thread:
  ``graph launch`` (pointers unchanged: the steady inference case), ``graph update +
  exec update`` (per call cudnnBackendUpdateCudaGraph to the other of two pointer sets,
  cudaGraphExecUpdate, launch); updating per kernel node instead failed (see GRAPH_ROUTES).

Every run's outputs are checked against ``torch.bmm`` of the same operands (fp16, within
atol 5e-2 / rtol 1e-2); the graph rows are also checked bitwise against (d), the same
plan executed by cudnnBackendExecute. Outputs are filled with NaN before each run, so a
route that wrote nothing fails. ``--python-calls`` adds the same from Python threads
(``torch.ops.cudnn_fe.execute`` and ``tch.execute`` against ``torch.bmm``, with
``torch.ops.aten.bmm`` beside them: torch's own product through torch.ops' Python entry,
what that entry costs under the GIL; 0 skips it).

bench/csrc/thread_scaling.cpp is a bench-only extension built here on first use
(tools/extension_build.py; needs ninja, the CUDA toolkit and a CUDA torch).

    python bench/thread_scaling.py [--calls 2000] [--rounds 3] [--python-calls 250] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
from typing import Callable, Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
THREAD_COUNTS = (1, 4, 16, 64)
SIZES = ((1, 16, 16, 16), (8, 256, 256, 256))
OP, BMM = "cudnn_fe.execute", "torch.bmm"
OP_GRAPH = "cudnn_fe.execute, graph-capable plan"
EAGER_GRAPH = "tch.execute, graph-capable plan"  # Python threads only: the C++ eager entry
ATEN_BMM = "torch.ops.aten.bmm"  # Python threads only: torch.bmm through torch.ops' Python entry
SHARED, PER_THREAD, CAPABLE = ("cudnnBackendExecute, shared plan", "cudnnBackendExecute, plan per thread",
                               "cudnnBackendExecute, graph-capable plan")
# mode in the C++. Mode 2 (the executable graph re-pointed per kernel node,
# cudaGraphExecKernelNodeSetParams) is not a candidate: on the H200 it failed with "invalid
# device function" for cuDNN's kernels (loaded through the driver API, not the runtime's).
GRAPH_ROUTES = {"graph launch": 0, "graph update + exec update": 1}
CANDIDATES = (OP, OP_GRAPH, BMM, SHARED, PER_THREAD, CAPABLE) + tuple(GRAPH_ROUTES)
ATOL, RTOL = 5e-2, 1e-2  # fp16 outputs of two different GEMM kernels, fp32 accumulation


def build():
    """The extension, compiled on first use (tools/extension_build.py)."""
    sys.path.insert(0, ROOT)
    from tools.extension_build import load_cuda_bench

    return load_cuda_bench("thread_scaling", ["bench/csrc/thread_scaling.cpp", "csrc/backend/cudnn_library.cpp", "csrc/backend/descriptors.cpp"])


@functools.cache
def graph_capable_op() -> int:
    """The bench matmul, registered with a builder that keeps only engines cuDNN can
    populate into a CUDA graph (as a frontend user filters plans by behavior note)."""
    import cudnn

    import torch_cudnn_handle as tch

    def matmul(graph, a, b):
        graph.select_behavior_notes([cudnn.behavior_note.SUPPORTS_CUDA_GRAPH_NATIVE_API])
        return graph.matmul(a, b, name="mm")

    return tch.register_graph(matmul, name="bench_matmul_graph_capable")


def calls_at(calls: int, threads: int) -> int:
    """Calls per thread: ``calls``, a quarter of it at more than 16 threads (keeps the run
    inside the GPU round's time limit; a rate, not a count, is compared)."""
    return calls if threads <= 16 else max(calls // 4, 100)


def check(outputs: Sequence, operands: Sequence, what: str, expected: Optional[Sequence] = None) -> None:
    """Each thread's output within fp16 tolerance of torch.bmm of its operands, and
    bitwise equal to ``expected`` (the same plan's output) when given."""
    import torch

    for t, out in enumerate(outputs):
        reference = torch.bmm(*operands[t])
        try:
            torch.testing.assert_close(out, reference, atol=ATOL, rtol=RTOL)
        except AssertionError as error:
            raise AssertionError(f"{what}: thread {t}'s output differs from torch.bmm: {error}") from None
        if expected is not None and not torch.equal(out, expected[t]):
            raise AssertionError(f"{what}: thread {t}'s output is not bitwise the same plan's cudnnBackendExecute output")


class BackendCall:
    """What cudnnBackendExecute alone (and cuDNN's native CUDA graph) needs to run one
    serialized plan of the matmul, once per thread: the plan's JSON and pack uids, and per
    thread two pointer sets (its operands, output buffers, pass-by-value scalars in host
    memory, workspace tensors, replacements; the second set has its own output buffer),
    its workspace and the regions zeroed before each call. ``why`` says why there is none."""

    def __init__(self, graph, uids, workspace_size: int, output_like, operand_sets, threads: int, serialized=None):
        import torch

        from torch_cudnn_handle.native import backend_plan_of

        spec, self.why = backend_plan_of(graph, tuple(uids), serialized)
        outputs_like = list(output_like) if isinstance(output_like, (list, tuple)) else [output_like]
        device = operand_sets[0][0].device
        self.device, self.plan_json, self.uids = device.index, None, []
        self.operands = [list(operand_sets[t]) for t in range(threads)]
        self.pointers, self.other_pointers, self.workspace, self.memsets, self._keep = [], [], [], [], []
        self.outputs, self.other_outputs = [], []
        if spec is None:
            return
        self.plan_json = spec.plan_json
        self.uids = list(uids) + [uid for uid, _ in spec.by_value] + [uid for uid, _, _ in spec.workspace_tensors] + \
            [uid for uid, _, _ in spec.replacements]
        scalars = [torch.frombuffer(bytearray(value.ljust(8, b"\0")), dtype=torch.uint8) for _, value in spec.by_value]
        self._keep += scalars
        for t in range(threads):
            workspace = torch.empty(max(workspace_size, 1), dtype=torch.uint8, device=device)
            self._keep.append(workspace)
            base = workspace.data_ptr()
            sets = []
            for outputs in (self.outputs, self.other_outputs):
                outs = [torch.empty_strided(like.shape, like.stride(), dtype=like.dtype, device=device) for like in outputs_like]
                outputs.append(outs[0])  # what the checks read; the others are kept
                self._keep += outs[1:]
                pointers = [tensor.data_ptr() for tensor in self.operands[t] + outs] + [scalar.data_ptr() for scalar in scalars]
                pointers += [base + offset for _, offset, _ in spec.workspace_tensors]
                by_uid = dict(zip(self.uids, pointers))
                pointers += [by_uid[source] + offset for _, source, offset in spec.replacements]
                sets.append(pointers)
            self.pointers.append(sets[0])
            self.other_pointers.append(sets[1])
            self.workspace.append(base + spec.fe_workspace_size if workspace_size else 0)
            self.memsets.append([(base + offset, zeroed) for _, offset, zeroed in spec.workspace_tensors if zeroed])

    @classmethod
    def of_registry(cls, graph_id: int, inputs, threads: int, operand_sets):
        """The plan the op runs for ``inputs`` of ``graph_id`` (the registry's choice)."""
        import torch

        import torch_cudnn_handle as tch
        from torch_cudnn_handle.registry import TensorSpec

        with torch.no_grad():
            outs = tch.execute(graph_id, inputs)  # built here (handed to the native path at its second call)
        specs = tuple(TensorSpec.of(t) for t in inputs)
        built = next(b for b in tch.built_graphs(graph_id) if b.inputs == specs and b.device == inputs[0].device.index)
        return cls(built.graph, built.uids, built.workspace_size, list(outs), operand_sets, threads)

    @classmethod
    def graph_capable(cls, inputs, threads: int, operand_sets):
        """The same matmul built with only engines cuDNN marks SUPPORTS_CUDA_GRAPH_NATIVE_API."""
        import cudnn
        import torch

        import torch_cudnn_handle as tch

        a, b = inputs
        with tch.build_scope(a.device.index) as handle:
            graph = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
                                  compute_data_type=cudnn.data_type.FLOAT, handle=handle)
            A, B = graph.tensor_like(a), graph.tensor_like(b)
            C = graph.matmul(A, B)
            C.set_output(True).set_data_type(cudnn.data_type.HALF)
            graph.select_behavior_notes([cudnn.behavior_note.SUPPORTS_CUDA_GRAPH_NATIVE_API])
            graph.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        out = torch.bmm(a, b)  # the layout the graph infers for C (checked)
        if C.get_dim() and (C.get_dim() != list(out.shape) or C.get_stride() != list(out.stride())):
            raise RuntimeError(f"the graph's output is {C.get_dim()} strides {C.get_stride()}, not torch.bmm's layout")
        return cls(graph, (A.uid, B.uid, C.uid), graph.get_workspace_size(), out, operand_sets, threads)

    def reset(self) -> None:
        for out in self.outputs + self.other_outputs:
            out.fill_(float("nan"))

    def issue_us(self, extension, calls: int) -> float:
        """Host microseconds one thread takes to issue one cudnnBackendExecute of the plan."""
        return extension.backend_issue_us(self.plan_json, self.uids, self.pointers[0], self.workspace[0], self.memsets[0],
                                          calls, device=self.device)

    def calls_per_second(self, extension, threads: int, calls: int, shared_plan: bool = True, warmup: int = 20) -> float:
        return extension.backend_calls_per_second(self.plan_json, self.uids, self.pointers, self.workspace, self.memsets,
                                                  shared_plan, threads, calls, warmup, device=self.device)

    def graph_calls_per_second(self, extension, threads: int, calls: int, mode: int) -> float:
        return extension.graph_calls_per_second(self.plan_json, self.uids, self.pointers, self.other_pointers, self.workspace,
                                                self.memsets, mode, threads, calls, device=self.device)


def timers_for(extension, operands, threads_max: int, calls: int) -> Dict[str, Callable[[int], float]]:
    """Each candidate: threads -> calls/s, its outputs checked after the run."""
    import torch

    sys.path.insert(0, HERE)
    from bench_op import MATMUL

    def op_or_bmm(run, what):
        def timer(threads):
            rate, outputs = run(threads)
            torch.cuda.synchronize()
            check(outputs, operands, what)
            return rate
        return timer

    timers: Dict[str, Callable[[int], float]] = {
        OP: op_or_bmm(lambda t: extension.op_calls_per_second(MATMUL, operands, t, calls_at(calls, t)), OP),
        OP_GRAPH: op_or_bmm(lambda t: extension.op_calls_per_second(graph_capable_op(), operands, t, calls_at(calls, t)), OP_GRAPH),
        BMM: op_or_bmm(lambda t: extension.bmm_calls_per_second(operands, t, calls_at(calls, t)), BMM),
    }
    import torch_cudnn_handle as tch

    notes = []
    with torch.no_grad():
        for name, graph_id in ((OP, MATMUL), (OP_GRAPH, graph_capable_op())):
            tch.execute(graph_id, operands[0])
            notes.append(f"{name}: " + "; ".join(f"{b.engine}, {b.path_reason}" for b in tch.built_graphs(graph_id)))
    registry = BackendCall.of_registry(MATMUL, operands[0], threads_max, operands)
    if registry.plan_json is None:
        notes.append(f"no backend-alone rows: {registry.why}")
    else:
        for name, shared in ((SHARED, True), (PER_THREAD, False)):
            def timer(threads, shared=shared, name=name):
                registry.reset()
                rate = registry.calls_per_second(extension, threads, calls_at(calls, threads), shared)
                torch.cuda.synchronize()
                check(registry.outputs[:threads], operands, name)
                return rate
            timers[name] = timer
    try:
        capable = BackendCall.graph_capable(operands[0], threads_max, operands)
    except Exception as error:  # noqa: BLE001 -- no engine with the note: the graph rows are left out, the reason printed
        capable, why = None, f"{type(error).__name__}: {error}"
    else:
        why = capable.why if capable.plan_json is None else None
    if why:
        notes.append(f"no graph rows: no plan with SUPPORTS_CUDA_GRAPH_NATIVE_API ({why})")
        return timers, notes
    capable.reset()
    capable.calls_per_second(extension, threads_max, 1, warmup=0)  # one call per thread: the bitwise reference
    torch.cuda.synchronize()
    expected = [out.clone() for out in capable.outputs]
    check(expected, operands, CAPABLE)

    def capable_timer(threads):
        capable.reset()
        rate = capable.calls_per_second(extension, threads, calls_at(calls, threads))
        torch.cuda.synchronize()
        check(capable.outputs[:threads], operands, CAPABLE, expected)
        return rate

    timers[CAPABLE] = capable_timer
    for name, mode in GRAPH_ROUTES.items():
        def timer(threads, name=name, mode=mode):
            capable.reset()
            rate = capable.graph_calls_per_second(extension, threads, calls_at(calls, threads), mode)
            torch.cuda.synchronize()
            check(capable.outputs[:threads], operands, name, expected)
            if mode:  # an updating route alternates between both pointer sets
                check(capable.other_outputs[:threads], operands, name, expected)
            return rate
        timers[name] = timer
    return timers, notes


def usable(timers: Dict[str, Callable[[int], float]], notes: List[str]) -> Dict[str, Callable[[int], float]]:
    """The timers that run (and pass their check) at one thread; each one that does not is
    dropped with its error in ``notes``."""
    kept = {}
    for name, timer in timers.items():
        try:
            timer(1)
        except Exception as error:  # noqa: BLE001 -- reported in the table's notes
            notes.append(f"{name} left out: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        else:
            kept[name] = timer
    return kept


def size_and_operands(batch: int, m: int, k: int, n: int):
    """The size's label, and one pair of fp16 matmul operands per thread (the most threads measured)."""
    import torch

    operands = [
        [torch.randn(batch, m, k, device="cuda", dtype=torch.float16), torch.randn(batch, k, n, device="cuda", dtype=torch.float16)]
        for _ in range(max(THREAD_COUNTS))
    ]
    return f"{batch}x{m}x{k} @ {batch}x{k}x{n} fp16", operands


def measure(calls: int = 2000, rounds: int = 3) -> List[dict]:
    import torch

    extension = build()
    rows = []
    for batch, m, k, n in SIZES:
        size, operands = size_and_operands(batch, m, k, n)
        torch.cuda.synchronize()
        timers, notes = timers_for(extension, operands, max(THREAD_COUNTS), calls)
        timers = usable(timers, notes)
        print(f"\n### C++ threads, {size}, {calls} calls per thread ({calls_at(calls, 64)} at 64 threads)\n", flush=True)
        for note in notes:
            print(f"- {note}")
        names = list(timers)
        print("\n| threads | " + " | ".join(f"{name} calls/s" for name in names) + " | op / bmm | op / backend shared |")
        print("| ---: |" + " ---: |" * (len(names) + 2))
        for threads in THREAD_COUNTS:
            samples: Dict[str, List[float]] = {name: [] for name in names}
            for index in range(rounds):
                for name in (names if index % 2 == 0 else reversed(names)):
                    samples[name].append(timers[name](threads))
            rate = {name: statistics.median(values) for name, values in samples.items()}
            row = dict(size=size, threads=threads, calls_per_thread=calls_at(calls, threads), rates=rate,
                       op_over_bmm=rate[OP] / rate[BMM], over_bmm={name: value / rate[BMM] for name, value in rate.items()},
                       notes=notes)
            if SHARED in rate:
                row["op_over_backend"] = rate[OP] / rate[SHARED]
            rows.append(row)
            backend_ratio = f"{row['op_over_backend']:.2f}x" if "op_over_backend" in row else "-"
            print(f"| {threads} | " + " | ".join(f"{rate[name]:,.0f}" for name in names) + f" | {row['op_over_bmm']:.2f}x | {backend_ratio} |", flush=True)
        print(f"\nEach route / torch.bmm, {size}:\n")
        print("| threads | " + " | ".join(name for name in names if name != BMM) + " |")
        print("| ---: |" + " ---: |" * (len(names) - 1))
        for row in rows[-len(THREAD_COUNTS):]:
            print(f"| {row['threads']} | " + " | ".join(f"{row['over_bmm'][name]:.2f}x" for name in names if name != BMM) + " |", flush=True)
    return rows


def measure_python(calls: int, rounds: int) -> List[dict]:
    """Python threads (timing.py's ThreadGang: own stream each, started together, timed
    until every stream is done): ``torch.ops.cudnn_fe.execute`` against ``torch.bmm``."""
    import torch

    sys.path.insert(0, HERE)
    from bench_op import MATMUL
    from timing import ThreadGang

    import torch_cudnn_handle as tch

    rows = []
    for batch, m, k, n in SIZES:
        size, operands = size_and_operands(batch, m, k, n)
        graph_op = graph_capable_op()
        last: Dict[str, list] = {name: [None] * len(operands) for name in (OP, OP_GRAPH, EAGER_GRAPH, ATEN_BMM, BMM)}

        def op(i):
            last[OP][i] = torch.ops.cudnn_fe.execute(MATMUL, operands[i])[0]

        def op_graph(i):
            last[OP_GRAPH][i] = torch.ops.cudnn_fe.execute(graph_op, operands[i])[0]

        def eager_graph(i):
            last[EAGER_GRAPH][i] = tch.execute(graph_op, operands[i])[0]

        def aten_bmm(i):  # torch.bmm's product through torch.ops' Python entry: what that entry costs
            last[ATEN_BMM][i] = torch.ops.aten.bmm.default(*operands[i])

        def bmm(i):
            last[BMM][i] = torch.bmm(*operands[i])

        candidates = {OP: op, OP_GRAPH: op_graph, EAGER_GRAPH: eager_graph, ATEN_BMM: aten_bmm, BMM: bmm}
        names = list(candidates)
        print(f"\n### Python threads, {size}, {calls} calls per thread\n", flush=True)
        print("| threads | " + " | ".join(f"{name} calls/s" for name in names) + " | " +
              " | ".join(f"{name} / bmm" for name in names if name != BMM) + " |")
        print("| ---: |" + " ---: |" * (2 * len(names) - 1))
        for threads in THREAD_COUNTS:
            gang = ThreadGang(threads)
            try:
                for fn in candidates.values():
                    gang.run(fn, 20)
                seconds: Dict[str, List[float]] = {name: [] for name in candidates}
                for index in range(rounds):
                    for name in (list(candidates) if index % 2 == 0 else reversed(list(candidates))):
                        seconds[name].append(gang.run(candidates[name], calls))
                        check(last[name][:threads], operands, f"{name} (Python threads)")
            finally:
                gang.close()
            rate = {name: threads * calls / statistics.median(values) for name, values in seconds.items()}
            rows.append(dict(size=size, threads=threads, calls_per_thread=calls, rates=rate, op_over_bmm=rate[OP] / rate[BMM],
                             over_bmm={name: value / rate[BMM] for name, value in rate.items()}, python_threads=True))
            print(f"| {threads} | " + " | ".join(f"{rate[name]:,.0f}" for name in names) + " | " +
                  " | ".join(f"{rate[name] / rate[BMM]:.2f}x" for name in names if name != BMM) + " |", flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--python-calls", type=int, default=250, help="calls per Python thread (0: no Python-thread rows)")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    sys.path.insert(0, HERE)
    from timing import require_cuda_gpu

    require_cuda_gpu(__file__)
    rows = measure(args.calls, args.rounds)
    if args.python_calls > 0:
        rows += measure_python(args.python_calls, args.rounds)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
