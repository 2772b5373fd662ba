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

// Graphs that may fail to be made before a plan stops trying (each costs a failed call
// into cuDNN and the driver; one may fail for a passing reason, e.g. a global-mode capture).
constexpr int kMaxGraphFailures = 3;

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

bool NativePlan::populates_cuda_graphs() const {
#if CUDNN_VERSION >= 90500
  return populated_by_cudnn_ && backend::cudnn_library().populate_cuda_graph != nullptr;
#else
  return false;
#endif
}

bool NativePlan::launches_cuda_graphs() const {
  return !host_inputs_ && graph_failures_.load(std::memory_order_relaxed) < kMaxGraphFailures;
}

const char* NativePlan::cuda_graph_route() const {
  if (host_inputs_) return nullptr;
  return populates_cuda_graphs() ? "populated by cuDNN" : "captured from its execute";
}

bool NativePlan::capture_execute(PooledCudnnHandle* handle, cudaStream_t stream, NativeScratch& scratch,
                                 cudnnBackendDescriptor_t pack, cudaGraph_t* graph) const {
  // On the handle's own capture stream, never the caller's: a capture takes whatever
  // any thread enqueues on its stream, and the legacy default stream cannot capture.
  // Thread-local mode: other threads' allocations stay legal meanwhile.
  cudaStream_t side = scratch.capture_stream(device_);
  const auto& cudnn = backend::cudnn_library();
  if (side == nullptr || cudnn.set_stream(handle->backend_handle, side) != CUDNN_STATUS_SUCCESS) return false;
  bool captured = false;
  if (cudaStreamBeginCapture(side, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
    const bool executed = cudnn.execute(handle->backend_handle, plan_, pack) == CUDNN_STATUS_SUCCESS;
    const bool ended = cudaStreamEndCapture(side, graph) == cudaSuccess;  // ends it whatever the execute did
    captured = executed && ended;
  }
  // Back to the stream the pooled handle records (handle->stream): the caller's.
  backend::check_cudnn(cudnn.set_stream(handle->backend_handle, stream), "cudnnSetStream after a capture");
  return captured;
}

bool NativePlan::launch_graph(PooledCudnnHandle* handle, cudaStream_t stream, c10::ArrayRef<void*> pointers,
                              void* engine_workspace) const {
  NativeScratch& scratch = NativeScratch::of(handle);  // its mutex is held by execute()
  PlanGraphs& graphs = scratch.graphs();
  const PlanGraphs::Lookup found = graphs.find(serial_, pointers, engine_workspace);
  if (found.exec == nullptr && !found.populate) return false;
  cudaGraphExec_t exec = found.exec;
  if (exec == nullptr) {
    // Made on this thread's handle; a failure (an engine that declines after all, an
    // execute that is not capturable, a capture in global mode on another thread
    // refusing the instantiation) leaves this call to cudnnBackendExecute and clears
    // the error CUDA recorded for it.
    cudnnBackendDescriptor_t pack = scratch.variant_pack(serial_, pack_uids_, pointers, engine_workspace);
    cudaGraph_t graph = nullptr;
    const bool populate = populates_cuda_graphs();
    bool made = false;
#if CUDNN_VERSION >= 90500
    if (populate) {
      made = cudaGraphCreate(&graph, 0) == cudaSuccess &&
          backend::cudnn_library().populate_cuda_graph(handle->backend_handle, plan_, pack, graph) == CUDNN_STATUS_SUCCESS;
    }
#endif
    if (!populate) made = capture_execute(handle, stream, scratch, pack, &graph);
    made = made && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    if (!made) {
      (void)cudaGetLastError();
      graph_failures_.fetch_add(1, std::memory_order_relaxed);
      ++graphs.failed;
      return false;
    }
    graphs.add(found, shared_from_this(), pointers, engine_workspace, exec);
    ++(populate ? graphs.populated : graphs.captured);
  }
  C10_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  ++graphs.launched;
  return true;
}

void NativePlan::mark_used() const {
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

NativePlanTable& NativePlanTable::instance() {
  static auto* table = new NativePlanTable();  // never destroyed: see the header
  return *table;
}

void NativePlanTable::add(int64_t graph, std::shared_ptr<const NativePlan> plan) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  plans_[graph].push_back(std::move(plan));
}

bool NativePlanTable::remove(int64_t graph, uint64_t serial) {
  std::shared_ptr<const NativePlan> dropped;  // destroyed after the lock is released
  std::unique_lock<std::shared_mutex> lock(mutex_);
  auto it = plans_.find(graph);
  if (it == plans_.end()) return false;
  auto& plans = it->second;
  auto match = std::find_if(plans.begin(), plans.end(), [&](const auto& p) { return p->serial() == serial; });
  if (match == plans.end()) return false;
  dropped = std::move(*match);
  plans.erase(match);
  if (plans.empty()) plans_.erase(it);
  lock.unlock();
  forget_native_graphs(serial);  // the handles' graphs of it hold it too (plan_graphs.h)
  return true;
}

std::shared_ptr<const NativePlan> NativePlanTable::find(int64_t graph, at::TensorList inputs) const {
  const bool deterministic_only = at::globalContext().deterministicAlgorithms();
  std::shared_lock<std::shared_mutex> lock(mutex_);
  auto it = plans_.find(graph);
  if (it == plans_.end()) return nullptr;
  for (const auto& plan : it->second) {
    if ((plan->deterministic() || !deterministic_only) && plan->matches(inputs)) return plan;
  }
  return nullptr;
}

size_t NativePlanTable::size() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  size_t n = 0;
  for (const auto& [graph, plans] : plans_) n += plans.size();
  return n;
}

std::map<uint64_t, int64_t> NativePlanTable::last_used() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  std::map<uint64_t, int64_t> out;
  for (const auto& [graph, plans] : plans_) {
    for (const auto& plan : plans) out[plan->serial()] = plan->last_used_ns();
  }
  return out;
}

}  // namespace torch_cudnn_handle::native
