#include "native/native_plan.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>

#include "backend/cudnn_library.h"
#include "backend/descriptors.h"
#include "native/graph_keepalive.h"
#include "native/native_scratch.h"
#include "native/plan_graphs.h"

namespace torch_cudnn_handle::native {
namespace {

std::atomic<uint64_t> next_plan_serial{1};
std::atomic<int64_t> plans_alive{0};

// A plan's last use is recorded at this resolution, so threads sharing a hot plan
// write its cache line at most once a millisecond each.
constexpr int64_t kUseResolutionNs = 1000000;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

bool is_aligned(const at::Tensor& tensor) {
  return (reinterpret_cast<uintptr_t>(tensor.data_ptr()) & 15) == 0;
}

}  // namespace

bool OperandLayout::matches(const at::Tensor& tensor, int device, at::TensorList inputs) const {
  const bool same_memory = host ? tensor.is_cpu() : (tensor.is_cuda() && tensor.get_device() == device && is_aligned(tensor));
  if (!same_memory || tensor.scalar_type() != dtype || !tensor.strides().equals(strides)) return false;
  if (tokens_of < 0) return tensor.sizes().equals(sizes);
  const auto actual = tensor.sizes();
  if (actual.size() != sizes.size() || actual.empty() || inputs[tokens_of].dim() == 0) return false;
  if (actual[0] != inputs[tokens_of].size(0)) return false;
  return std::equal(actual.begin() + 1, actual.end(), sizes.begin() + 1);
}

std::vector<int64_t> OperandLayout::sizes_for(at::TensorList inputs) const {
  if (tokens_of < 0) return sizes;
  std::vector<int64_t> out = sizes;
  out[0] = inputs[tokens_of].size(0);  // matches() checked that input is packed (dim > 0)
  return out;
}

bool OperandLayout::matches_memory(const at::Tensor& tensor, int device, at::TensorList inputs) const {
  if (host || !tensor.is_cuda() || tensor.get_device() != device || !is_aligned(tensor)) return false;
  if (tokens_of >= 0 && (tokens_of >= static_cast<int64_t>(inputs.size()) || inputs[tokens_of].dim() == 0)) return false;
  const auto expected = sizes_for(inputs);
  if (tensor.scalar_type() != dtype || !tensor.sizes().equals(expected)) return false;
  const auto given = tensor.strides();
  for (size_t d = 0; d < expected.size(); ++d) {
    if (expected[d] != 1 && given[d] != strides[d]) return false;
  }
  return true;
}

NativePlan::NativePlan(int device, const std::string& plan_json, std::vector<int64_t> operand_uids,
                       std::vector<OperandLayout> inputs, std::vector<OperandLayout> outputs, PlanExtras extras,
                       std::vector<int64_t> output_positions, bool deterministic, bool cuda_graph)
    : device_(device),
      deterministic_(deterministic),
      operand_uids_(std::move(operand_uids)),
      inputs_(std::move(inputs)),
      outputs_(std::move(outputs)),
      extras_(std::move(extras)),
      output_positions_(std::move(output_positions)),
      populated_by_cudnn_(cuda_graph),
      serial_(next_plan_serial.fetch_add(1, std::memory_order_relaxed)) {
  TORCH_CHECK(operand_uids_.size() == inputs_.size() + outputs_.size(),
              "torch_cudnn_handle: a native plan needs one uid per input and output");
  if (output_positions_.empty()) {
    for (size_t i = 0; i < outputs_.size(); ++i) output_positions_.push_back(static_cast<int64_t>(i));
  }
  TORCH_CHECK(output_positions_.size() == outputs_.size(), "torch_cudnn_handle: a native plan needs one position per output");
  for (const auto* layouts : {&inputs_, &outputs_}) {
    for (const auto& layout : *layouts) {
      TORCH_CHECK(layout.tokens_of < static_cast<int64_t>(inputs_.size()) && (layout.tokens_of < 0 || !layout.sizes.empty()),
                  "torch_cudnn_handle: a packed operand's token count must come from one of the plan's inputs");
    }
  }
  // A host scalar's value would be read once, when the graph is made, not per launch.
  for (const auto& layout : inputs_) host_inputs_ = host_inputs_ || layout.host;
  pack_uids_ = operand_uids_;
  by_value_storage_.resize(extras_.by_value.size());
  for (size_t i = 0; i < extras_.by_value.size(); ++i) {
    const auto& [uid, bytes] = extras_.by_value[i];
    TORCH_CHECK(bytes.size() <= sizeof(int64_t), "torch_cudnn_handle: a pass-by-value scalar of ", bytes.size(), " bytes");
    std::memcpy(&by_value_storage_[i], bytes.data(), bytes.size());
    pack_uids_.push_back(uid);
  }
  for (const auto& tensor : extras_.workspace_tensors) {
    TORCH_CHECK(tensor.offset >= 0 && tensor.offset + tensor.zero_bytes <= extras_.fe_workspace_size,
                "torch_cudnn_handle: a workspace tensor outside the frontend's workspace region");
    pack_uids_.push_back(tensor.uid);
  }
  for (const auto& replacement : extras_.replacements) {
    auto source = std::find(pack_uids_.begin(), pack_uids_.end(), replacement.source_uid);
    TORCH_CHECK(source != pack_uids_.end(), "torch_cudnn_handle: a pointer replacement from unknown uid ",
                replacement.source_uid);
    replacement_sources_.emplace_back(static_cast<size_t>(source - pack_uids_.begin()), replacement.offset);
    pack_uids_.push_back(replacement.uid);
  }
  // Deserialized on this device, with this thread's pooled handle there: a backend
  // plan is finalized for the device of the handle it is given.
  c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(device));
  PooledCudnnHandle* handle = handle_for_call(device, c10::cuda::getCurrentCUDAStream(device).stream());
  backend::ScopedDescriptor plan(backend::deserialize_plan(plan_json, handle->backend_handle));
  int64_t count = 0;
  backend::check_cudnn(backend::cudnn_library().get_attribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                              CUDNN_TYPE_INT64, 1, &count, &engine_workspace_size_),
                       "reading the execution plan's workspace size");
  plan_ = plan.release();
  plans_alive.fetch_add(1, std::memory_order_relaxed);
}

NativePlan::~NativePlan() {
  if (plan_) backend::cudnn_library().destroy_descriptor(plan_);
  plans_alive.fetch_sub(1, std::memory_order_relaxed);
}

int64_t NativePlan::alive() { return plans_alive.load(std::memory_order_relaxed); }

void NativePlan::mark_used() const {
  calls_.fetch_add(1, std::memory_order_relaxed);
  const int64_t now = now_ns();
  if (now - last_used_ns_.load(std::memory_order_relaxed) > kUseResolutionNs) {
    last_used_ns_.store(now, std::memory_order_relaxed);
  }
}

bool NativePlan::matches(at::TensorList inputs) const {
  if (inputs.size() != inputs_.size()) return false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs_[i].matches(inputs[i], device_, inputs)) return false;
  }
  return true;
}

bool NativePlan::matches_outputs(at::TensorList inputs, at::TensorList outputs) const {
  if (outputs.size() != outputs_.size()) return false;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs_[i].host || !outputs_[i].matches(outputs[i], device_, inputs)) return false;
  }
  return true;
}

void NativePlan::execute(PooledCudnnHandle* handle, cudaStream_t stream, at::TensorList inputs,
                         at::TensorList outputs) const {
  mark_used();
  const bool capturing = is_capturing(stream);
  if (capturing) keep_alive_while_captured(stream, shared_from_this());
  NativeScratch& scratch = NativeScratch::of(handle);
  std::lock_guard<std::mutex> scratch_lock(scratch.mutex());  // until launched: see native_scratch.h
  c10::DataPtr per_call_workspace;  // freed (stream-ordered) when the call returns
  char* workspace = nullptr;
  if (workspace_size() > 0) {
    workspace = static_cast<char*>(scratch.workspace(device_, stream, capturing, workspace_size(), per_call_workspace));
  }
  c10::SmallVector<void*, 16> pointers;
  // A host scalar's pointer is its CPU data_ptr: cuDNN reads the value through it on
  // the host during cudnnBackendExecute (see OperandLayout::host).
  for (const auto& t : inputs) pointers.push_back(t.data_ptr());
  for (const auto& t : outputs) pointers.push_back(t.data_ptr());
  for (const auto& value : by_value_storage_) pointers.push_back(const_cast<int64_t*>(&value));  // read, never written
  for (const auto& tensor : extras_.workspace_tensors) {
    pointers.push_back(workspace + tensor.offset);
    if (tensor.zero_bytes > 0) {
      C10_CUDA_CHECK(cudaMemsetAsync(workspace + tensor.offset, 0, static_cast<size_t>(tensor.zero_bytes), stream));
    }
  }
  for (const auto& [source, offset] : replacement_sources_) {
    pointers.push_back(static_cast<char*>(pointers[source]) + offset);
  }
  void* engine_workspace = workspace ? workspace + extras_.fe_workspace_size : nullptr;
  // A kept workspace and no capture: the call may be a launch of a graph made for the
  // same addresses (Note [Native CUDA graph launch], plan_graphs.h).
  if (!capturing && !per_call_workspace && native_cuda_graphs_enabled() && launches_cuda_graphs() &&
      launch_graph(handle, stream, pointers, engine_workspace)) {
    return;
  }
  cudnnBackendDescriptor_t pack = scratch.variant_pack(serial_, pack_uids_, pointers, engine_workspace);
  backend::check_cudnn(backend::cudnn_library().execute(handle->backend_handle, plan_, pack), "cudnnBackendExecute");
}

}  // namespace torch_cudnn_handle::native
