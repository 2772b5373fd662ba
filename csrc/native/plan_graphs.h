// Note [Native CUDA graph launch]
//
// cudnnBackendExecute serializes across threads inside cuDNN (about 65-90k calls/s for
// the whole process on an H200, whatever the plan; bench/thread_scaling.py), and it is
// most of a small call's host time. A CUDA graph of the call, made once for one set of
// operand and workspace addresses and launched with cudaGraphLaunch, does not enter
// cuDNN at all and scales with threads. The graph is made one of two ways:
// * populated by cuDNN (cudnnBackendPopulateCudaGraph, cuDNN >= 9.5) for a plan whose
//   engine carries the SUPPORTS_CUDA_GRAPH_NATIVE_API note;
// * otherwise captured from one cudnnBackendExecute, on the handle's own capture
//   stream in thread-local mode: what torch.cuda.graph records of a cuDNN call, so the
//   same engines that run under a user's capture run here (an engine whose execute
//   cannot be captured fails the capture, and its calls keep executing).
//
// So each pooled handle (one per thread and device) keeps a few such graphs, keyed by
// (plan, every address the call binds). A call whose addresses repeat launches the
// graph; torch's caching allocator hands a steady loop the same blocks, and the
// workspace is the handle's kept block, so training and serving loops repeat. Addresses
// seen once are never made into a graph (that happens on the second sighting), so a
// call with new addresses each time pays one hash over them and runs
// cudnnBackendExecute as before. Not used while the stream is capturing (the capture
// records the execute), for a per-call workspace, for a plan with a host scalar (its
// value is read when the graph is made, not per launch), or when switched off
// (set_native_cuda_graphs). The graph runs the same plan's kernels on the same
// addresses as its execute would: results are bitwise equal, and a graph launched after
// other plans ran on its handle reads nothing they left (test_native_cuda_graphs_gpu.py).
//
// Ownership: an entry holds its plan (the graph's kernels are the plan's, see
// graph_keepalive.h) and its executable graph; both die when the entry is evicted (the
// least recently used beyond kMaxGraphs), when the registry forgets the plan
// (forget_native_graphs), or never: handles live forever, and nothing is destroyed at
// process exit. An executable destroyed while a launch is in flight is freed by CUDA
// when that launch completes.
#pragma once

#include <c10/util/ArrayRef.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace torch_cudnn_handle::native {

class NativePlan;

// Whether `kept` (operands, then the workspace) holds exactly these addresses.
bool same_addresses(const std::vector<void*>& kept, c10::ArrayRef<void*> pointers, void* workspace);

// The graphs of one pooled handle; used under its NativeScratch mutex.
class PlanGraphs {
 public:
  PlanGraphs() = default;
  PlanGraphs(const PlanGraphs&) = delete;
  PlanGraphs& operator=(const PlanGraphs&) = delete;
  ~PlanGraphs();

  struct Lookup {
    cudaGraphExec_t exec = nullptr;  // a graph to launch
    bool populate = false;           // none, and these addresses were seen before: make one
    size_t hash = 0;
  };
  // The graph for `plan_serial` at these addresses (operands, then the workspace).
  Lookup find(uint64_t plan_serial, c10::ArrayRef<void*> pointers, void* workspace);

  // Keeps `exec` (populated for the addresses find() was given) as the newest entry.
  void add(const Lookup& found, std::shared_ptr<const NativePlan> plan, c10::ArrayRef<void*> pointers, void* workspace,
           cudaGraphExec_t exec);

  // Destroys the graphs of one plan (0: of every plan); returns how many.
  size_t forget(uint64_t plan_serial);
  size_t size() const { return entries_.size(); }

  // This handle's counts: graphs populated by cuDNN, graphs captured, launches, graphs
  // that could not be made.
  int64_t populated = 0, captured = 0, launched = 0, failed = 0;

  static constexpr size_t kMaxGraphs = 16;

 private:
  struct Entry {
    size_t hash;
    std::vector<void*> addresses;  // operands, then the workspace
    cudaGraphExec_t exec;
    std::shared_ptr<const NativePlan> plan;
  };
  std::vector<Entry> entries_;  // most recently used last
  std::array<size_t, 8> seen_{};  // hashes of recent misses: populated on a second sighting
  size_t seen_next_ = 0;
};

// Whether the native path may launch plans as CUDA graphs (on by default; the package's
// native_cuda_graphs setting sets it, torch_cudnn_handle/settings.py).
bool native_cuda_graphs_enabled();
bool set_native_cuda_graphs(bool enabled);  // returns the previous setting

// The counts of every pooled handle together, and the graphs kept: for
// native_cuda_graph_stats() (a graph that could not be made leaves the call to
// cudnnBackendExecute).
struct PlanGraphCounts {
  int64_t populated = 0, captured = 0, launched = 0, failed = 0, kept = 0;
};
PlanGraphCounts plan_graph_counts();

// Destroys the kept graphs of one plan on every pooled handle (0: every plan's), from
// any thread; returns how many.
size_t forget_native_graphs(uint64_t plan_serial);

}  // namespace torch_cudnn_handle::native
