// Backend-served plans executed from C++: the native path of cudnn_fe.execute.
//
// The Python registry builds a graph once per (id, device, input layout); when the
// selected plan is a cuDNN backend plan, it hands over the plan's backend JSON and what
// the frontend would otherwise add per call (pass-by-value scalars, workspace tensors
// it zeroes, pointer replacements; torch_cudnn_handle/native.py decides what qualifies).
// A NativePlan deserializes the JSON with the backend C API on a pooled handle of its
// device and executes it: operand pointers in the graph's uid order, the workspace
// from the handle's scratch (native_scratch.h), cudnnBackendExecute on the thread's
// pooled handle, on torch's current stream, in the right context.
//
// Ownership: the NativePlanTable owns its plans through shared_ptrs until the
// registry's LRU drops them; a call that is executing a plan holds a reference, and a
// CUDA graph that captured a call holds one until the graph is destroyed
// (graph_keepalive.h). The backend descriptor dies with the last reference. The table
// itself is leaked on purpose (Note [Leaked on purpose], pool/device_thread_handle_pool.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pool/cudnn_handle_pool.h"

namespace torch_cudnn_handle::native {

class NativeScratch;

struct OperandLayout {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  c10::ScalarType dtype;
  // A host scalar: a one-element CPU tensor the graph takes by value. Its variant-pack
  // pointer is the CPU tensor's data_ptr, which cudnnBackendExecute dereferences on
  // the host before it returns (so the tensor may die right after the call; under
  // CUDA-graph capture the value read at capture is baked into the graph).
  bool host = false;
  // A packed (ragged) operand: its first size (the token count T) is that of input
  // `tokens_of`, whatever it is, and `sizes[0]` is a placeholder. A packed input names
  // the first packed input sharing its ragged offsets (itself: any T), a packed output
  // the input it is as long as. -1: every size is exact. cuDNN describes a ragged
  // tensor without T (registry/ragged.py), so one plan serves every token count.
  int64_t tokens_of = -1;

  // Same layout on the same kind of memory: a device operand on `device` with a
  // 16-byte aligned data pointer (plans are built for aligned operands, the frontend
  // sets no lower alignment, so a misaligned view takes the Python path, which stages
  // it through an aligned copy); a host scalar on the CPU. `inputs`: the call's, which
  // a packed operand's token count is read from.
  bool matches(const at::Tensor& tensor, int device, at::TensorList inputs) const;
  // The sizes of this operand in a call on `inputs` (a packed one's T filled in).
  std::vector<int64_t> sizes_for(at::TensorList inputs) const;
  // As matches(), except that the stride of a size-1 dimension may differ (it addresses
  // nothing): for an input buffer bound as an output too (an in-place write), whose
  // output descriptor cuDNN may stride differently there (batchnorm's running stats).
  bool matches_memory(const at::Tensor& tensor, int device, at::TensorList inputs) const;
};

// What the frontend adds to a call besides the operands, from its serialized graph.
struct PlanExtras {
  std::vector<std::pair<int64_t, std::string>> by_value;  // uid, the scalar's bytes (host)
  int64_t fe_workspace_size = 0;  // the frontend's region at the workspace's start
  struct WorkspaceTensor {
    int64_t uid, offset, zero_bytes;  // at workspace + offset; zero_bytes zeroed before each call
  };
  std::vector<WorkspaceTensor> workspace_tensors;
  struct Replacement {
    int64_t uid, source_uid, offset;  // pointer of `uid` = pointer of `source_uid` + offset bytes
  };
  std::vector<Replacement> replacements;
};

class NativePlan : public std::enable_shared_from_this<NativePlan> {
 public:
  // Deserializes `plan_json` for `device` (the calling thread's pooled handle there).
  // `output_positions`: which of the builder's returned values each output is (a
  // backward builder returns None for an input without a gradient); empty: in order.
  // `deterministic`: chosen among engines cuDNN does not mark non-deterministic.
  // `cuda_graph`: its engine has cuDNN's SUPPORTS_CUDA_GRAPH_NATIVE_API note, so cuDNN
  // populates the CUDA graphs its calls launch; other plans' graphs are captured from
  // their execute (Note [Native CUDA graph launch], plan_graphs.h).
  NativePlan(int device, const std::string& plan_json, std::vector<int64_t> operand_uids,
             std::vector<OperandLayout> inputs, std::vector<OperandLayout> outputs, PlanExtras extras,
             std::vector<int64_t> output_positions = {}, bool deterministic = false, bool cuda_graph = false);
  ~NativePlan();
  NativePlan(const NativePlan&) = delete;
  NativePlan& operator=(const NativePlan&) = delete;

  int device() const { return device_; }
  bool deterministic() const { return deterministic_; }
  // Whether calls may be launched as CUDA graphs: no input is a host scalar, and making
  // its graphs has not failed repeatedly.
  bool launches_cuda_graphs() const;
  // How its graphs are made: "populated by cuDNN", "captured from its execute", or
  // null (never: a host-scalar input).
  const char* cuda_graph_route() const;
  uint64_t serial() const { return serial_; }
  int64_t workspace_size() const { return extras_.fe_workspace_size + engine_workspace_size_; }
  const std::vector<OperandLayout>& outputs() const { return outputs_; }
  const std::vector<int64_t>& output_positions() const { return output_positions_; }
  int64_t last_used_ns() const { return last_used_ns_.load(std::memory_order_relaxed); }
  // Calls it ran, for stats.graphs()'s calls by route (a relaxed count: a report, never a decision).
  uint64_t calls() const { return calls_.load(std::memory_order_relaxed); }

  bool matches(at::TensorList inputs) const;
  bool matches_outputs(at::TensorList inputs, at::TensorList outputs) const;

  // Runs the plan on `handle` (this thread's, for the plan's device, set to `stream`),
  // with the right context already current.
  void execute(PooledCudnnHandle* handle, cudaStream_t stream, at::TensorList inputs, at::TensorList outputs) const;

  // Plans alive in the process: in the table, executing, or kept by a CUDA graph.
  static int64_t alive();

 private:
  void mark_used() const;
  // Launches this call as a CUDA graph of the handle's (Note [Native CUDA graph launch]);
  // false: it did not, and the caller executes it.
  bool launch_graph(PooledCudnnHandle* handle, cudaStream_t stream, c10::ArrayRef<void*> pointers,
                    void* engine_workspace) const;
  bool populates_cuda_graphs() const;  // the engine's note, and a libcudnn with the API
  // Records one cudnnBackendExecute of `pack` into `graph` on the handle's capture stream.
  bool capture_execute(PooledCudnnHandle* handle, cudaStream_t stream, NativeScratch& scratch,
                       cudnnBackendDescriptor_t pack, cudaGraph_t* graph) const;

  int device_;
  bool deterministic_;
  std::vector<int64_t> operand_uids_;  // inputs then outputs
  std::vector<OperandLayout> inputs_;
  std::vector<OperandLayout> outputs_;
  PlanExtras extras_;
  std::vector<int64_t> output_positions_;
  std::vector<int64_t> pack_uids_;       // operands, by-value scalars, workspace tensors, replacements
  std::vector<int64_t> by_value_storage_;  // the scalars' bytes, 8-byte aligned slots
  std::vector<std::pair<size_t, int64_t>> replacement_sources_;  // pack index of the source, offset
  cudnnBackendDescriptor_t plan_ = nullptr;
  int64_t engine_workspace_size_ = 0;
  bool populated_by_cudnn_;  // the engine's SUPPORTS_CUDA_GRAPH_NATIVE_API note
  bool host_inputs_ = false;
  mutable std::atomic<int> graph_failures_{0};  // graphs that could not be made, on any handle
  uint64_t serial_;  // unique per plan for the process: keys the handles' cached variant packs
  mutable std::atomic<int64_t> last_used_ns_{0};
  mutable std::atomic<uint64_t> calls_{0};
};

// The native plans, by graph id. Thread-safe; lookups take a shared lock.
class NativePlanTable {
 public:
  static NativePlanTable& instance();

  void add(int64_t graph, std::shared_ptr<const NativePlan> plan);
  bool remove(int64_t graph, uint64_t serial);
  // The plan of `graph` built for exactly these inputs (device, layouts, alignment), or
  // null; under torch.use_deterministic_algorithms(True), a deterministic plan only.
  std::shared_ptr<const NativePlan> find(int64_t graph, at::TensorList inputs) const;
  size_t size() const;
  // serial -> when each plan in the table last ran (steady_clock ns; 0 = never).
  std::map<uint64_t, int64_t> last_used() const;
  // serial -> how many calls each plan in the table ran.
  std::map<uint64_t, uint64_t> calls() const;

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<int64_t, std::vector<std::shared_ptr<const NativePlan>>> plans_;
};

}  // namespace torch_cudnn_handle::native
