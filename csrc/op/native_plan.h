// Backend-served plans executed from C++: the native path of cudnn_fe.execute.
//
// The Python registry builds a graph once per (id, device, input layout); when the
// selected plan is a cuDNN backend plan that needs nothing from the frontend per call,
// it hands over the plan's backend JSON (torch_cudnn_handle/native.py says how that
// crosses over and why it is safe). A NativePlan deserializes it with the backend C
// API on a pooled handle of its device, and executes it: variant pack from the
// tensors' data pointers in the graph's uid order, workspace from torch's caching
// allocator on the current stream, the thread's pooled handle on torch's current
// stream with the right context bound.
//
// Per call, the pooled handle's scratch (pool/cudnn_handle_pool.h) supplies the
// workspace for the stream and, when the pointers repeat, the last variant pack.
//
// Ownership: the NativePlanTable owns its plans through shared_ptrs; a call that is
// executing a plan holds a reference, so the registry's LRU can drop a plan while
// another thread still runs it. The backend descriptor dies with the last reference.
// The table itself is never destroyed (process exit must not call into cuDNN).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace torch_cudnn_handle {

struct OperandLayout {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  c10::ScalarType dtype;

  bool matches(const at::Tensor& tensor) const;
};

class NativePlan {
 public:
  // Deserializes `plan_json` for `device` (the calling thread's pooled handle there).
  NativePlan(int device, const std::string& plan_json, std::vector<int64_t> uids,
             std::vector<OperandLayout> inputs, std::vector<OperandLayout> outputs);
  ~NativePlan();
  NativePlan(const NativePlan&) = delete;
  NativePlan& operator=(const NativePlan&) = delete;

  int device() const { return device_; }
  int64_t workspace_size() const { return workspace_size_; }
  const std::vector<OperandLayout>& inputs() const { return inputs_; }
  const std::vector<OperandLayout>& outputs() const { return outputs_; }
  const std::vector<int64_t>& uids() const { return uids_; }
  cudnnBackendDescriptor_t descriptor() const { return plan_; }  // owned by this plan
  const std::string& plan_json() const { return plan_json_; }

  bool matches(at::TensorList inputs) const;

  // Runs the plan on torch's current stream of the plan's device.
  void execute(at::TensorList inputs, at::TensorList outputs) const;

 private:
  int device_;
  std::vector<int64_t> uids_;  // inputs then outputs: the op's operand order
  std::vector<OperandLayout> inputs_;
  std::vector<OperandLayout> outputs_;
  cudnnBackendDescriptor_t plan_ = nullptr;
  std::string plan_json_;  // the backend's JSON it was deserialized from
  int64_t workspace_size_ = 0;
  uint64_t serial_;  // unique per plan for the process: keys the handles' cached variant packs
};

// A backend execution plan from its JSON representation, finalized with `handle` (so
// for that handle's device). The caller owns the descriptor.
cudnnBackendDescriptor_t deserialize_plan(const std::string& plan_json, cudnnHandle_t handle);

// The native plans, by graph id. Thread-safe; lookups take a shared lock.
class NativePlanTable {
 public:
  static NativePlanTable& instance();

  void add(int64_t graph, std::shared_ptr<const NativePlan> plan);
  // Drops the plan of `graph` for `device` and these input layouts; true if there was one.
  bool remove(int64_t graph, int device, const std::vector<OperandLayout>& inputs);
  // The plan of `graph` built for exactly these inputs (device and layouts), or null.
  std::shared_ptr<const NativePlan> find(int64_t graph, at::TensorList inputs) const;
  size_t size() const;

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<int64_t, std::vector<std::shared_ptr<const NativePlan>>> plans_;
};

}  // namespace torch_cudnn_handle
