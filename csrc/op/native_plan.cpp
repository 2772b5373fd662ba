#include "op/native_plan.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <atomic>
#include <mutex>

#include "backend/cudnn_library.h"
#include "pool/cudnn_handle_pool.h"

namespace torch_cudnn_handle {
namespace {

// A backend descriptor destroyed on every path out of a scope.
class ScopedDescriptor {
 public:
  explicit ScopedDescriptor(cudnnBackendDescriptorType_t type) {
    backend::check_cudnn(backend::cudnn_library().create_descriptor(type, &descriptor_),
                         "cudnnBackendCreateDescriptor");
  }
  ~ScopedDescriptor() {
    if (descriptor_) backend::cudnn_library().destroy_descriptor(descriptor_);
  }
  ScopedDescriptor(const ScopedDescriptor&) = delete;
  ScopedDescriptor& operator=(const ScopedDescriptor&) = delete;
  cudnnBackendDescriptor_t get() const { return descriptor_; }
  cudnnBackendDescriptor_t release() {
    auto d = descriptor_;
    descriptor_ = nullptr;
    return d;
  }

 private:
  cudnnBackendDescriptor_t descriptor_ = nullptr;
};

void set_attribute(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t name,
                   cudnnBackendAttributeType_t type, int64_t count, const void* values, const char* what) {
  backend::check_cudnn(backend::cudnn_library().set_attribute(descriptor, name, type, count, values), what);
}

std::atomic<uint64_t> next_plan_serial{1};

constexpr size_t kMaxWorkspacesPerHandle = 4;

bool is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// From torch's caching allocator, on `device`'s current stream. The allocator serves
// the current device, and the dispatcher sets none for a custom op's kernel.
c10::DataPtr allocate_on(int device, int64_t bytes) {
  c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(device));
  return c10::cuda::CUDACachingAllocator::get()->allocate(static_cast<size_t>(bytes));
}

// Whether the caching allocator placed `pointer` in a private pool (a CUDA graph's,
// cudagraph trees', torch.cuda.use_mem_pool's) rather than the default one. Asked
// only when a cached workspace is (re)allocated, so the snapshot's cost is rare.
bool in_private_pool(const void* pointer) {
  const auto address = reinterpret_cast<size_t>(pointer);
  const auto snapshot = c10::cuda::CUDACachingAllocator::snapshot();
  for (const auto& segment : snapshot.segments) {
    if (address >= segment.address && address < segment.address + segment.total_size) {
      return segment.owner_private_pool_id != decltype(segment.owner_private_pool_id){0, 0};
    }
  }
  return true;  // not found: keep nothing we cannot place
}

// `bytes` of workspace on `stream`: the handle's cached block for the stream, grown if
// too small; or, on a stream whose allocations go to a private pool, a block in
// `per_call` that the caller frees when the call returns. A replaced or evicted block
// goes back to the caching allocator, which hands it out again only in that stream's
// order, after the work queued here.
void* workspace_for(PooledCudnnHandle* handle, cudaStream_t stream, int64_t bytes, c10::DataPtr& per_call) {
  auto& cache = handle->workspaces;
  auto it = std::find_if(cache.begin(), cache.end(), [&](const auto& w) { return w.stream == stream; });
  if (it != cache.end() && it != cache.end() - 1) {
    std::rotate(it, it + 1, cache.end());  // most recently used last
    it = cache.end() - 1;
  }
  if (it == cache.end()) {
    if (cache.size() == kMaxWorkspacesPerHandle) cache.erase(cache.begin());
    cache.push_back({stream, c10::DataPtr(), 0, false});
    it = cache.end() - 1;
  }
  if (it->per_call) {
    per_call = allocate_on(handle->device, bytes);
    return per_call.get();
  }
  if (it->bytes < bytes) {
    it->memory = c10::DataPtr();  // free first: the allocator may hand the same block back, grown
    it->bytes = 0;
    c10::DataPtr memory = allocate_on(handle->device, bytes);
    if (in_private_pool(memory.get())) {
      it->per_call = true;
      per_call = std::move(memory);
      return per_call.get();
    }
    it->memory = std::move(memory);
    it->bytes = bytes;
  }
  return it->memory.get();
}

// The variant pack for `pointers` (operands in uid order, then the workspace): the
// handle's last one when plan and pointers are the same, else a new one it keeps.
cudnnBackendDescriptor_t variant_pack(PooledCudnnHandle* handle, uint64_t plan_serial,
                                      const std::vector<int64_t>& uids, c10::ArrayRef<void*> pointers) {
  if (handle->variant_pack != nullptr && handle->variant_pack_plan == plan_serial &&
      c10::ArrayRef<void*>(handle->variant_pack_pointers) == pointers) {
    return handle->variant_pack;
  }
  if (handle->variant_pack != nullptr) {
    backend::cudnn_library().destroy_descriptor(handle->variant_pack);
    handle->variant_pack = nullptr;
  }
  void* workspace = pointers.back();
  ScopedDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  set_attribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                static_cast<int64_t>(uids.size()), pointers.data(), "setting the variant pack's pointers");
  set_attribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()),
                uids.data(), "setting the variant pack's uids");
  set_attribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace,
                "setting the variant pack's workspace");
  backend::check_cudnn(backend::cudnn_library().finalize(pack.get()), "finalizing the variant pack");
  handle->variant_pack_pointers.assign(pointers.begin(), pointers.end());
  handle->variant_pack_plan = plan_serial;
  handle->variant_pack = pack.release();
  return handle->variant_pack;
}

}  // namespace

bool OperandLayout::matches(const at::Tensor& tensor) const {
  return tensor.scalar_type() == dtype && tensor.sizes().equals(sizes) && tensor.strides().equals(strides);
}

NativePlan::NativePlan(int device, const std::string& plan_json, std::vector<int64_t> uids,
                       std::vector<OperandLayout> inputs, std::vector<OperandLayout> outputs)
    : device_(device),
      uids_(std::move(uids)),
      inputs_(std::move(inputs)),
      outputs_(std::move(outputs)),
      serial_(next_plan_serial.fetch_add(1, std::memory_order_relaxed)) {
  TORCH_CHECK(uids_.size() == inputs_.size() + outputs_.size(),
              "torch_cudnn_handle: a native plan needs one uid per input and output");
  // Deserialized on this device, with this thread's pooled handle there: a backend
  // plan is finalized for the device of the handle it is given.
  c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(device));
  PooledCudnnHandle* handle = handle_for_call(device, c10::cuda::getCurrentCUDAStream(device).stream());
  plan_ = deserialize_plan(plan_json, handle->backend_handle);
  int64_t count = 0;
  auto status = backend::cudnn_library().get_attribute(plan_, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                                       1, &count, &workspace_size_);
  if (status != CUDNN_STATUS_SUCCESS) {
    backend::cudnn_library().destroy_descriptor(plan_);
    plan_ = nullptr;
    backend::check_cudnn(status, "reading the execution plan's workspace size");
  }
  plan_json_ = plan_json;
}

cudnnBackendDescriptor_t deserialize_plan(const std::string& plan_json, cudnnHandle_t handle) {
  ScopedDescriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  set_attribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                static_cast<int64_t>(plan_json.size()), plan_json.data(),
                "setting the execution plan's JSON representation");
  set_attribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle,
                "setting the execution plan's handle");
  backend::check_cudnn(backend::cudnn_library().finalize(plan.get()), "deserializing the execution plan");
  return plan.release();
}

NativePlan::~NativePlan() {
  if (plan_) backend::cudnn_library().destroy_descriptor(plan_);
}

bool NativePlan::matches(at::TensorList inputs) const {
  if (inputs.size() != inputs_.size()) return false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].is_cuda() || inputs[i].get_device() != device_ || !inputs_[i].matches(inputs[i])) return false;
  }
  return true;
}

void NativePlan::execute(at::TensorList inputs, at::TensorList outputs) const {
  const auto stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_));
  PooledCudnnHandle* handle = handle_for_call(device_, stream.stream());
  // Outside a capture, the handle's workspace for this stream. During one, a block
  // from the caching allocator (the graph's pool), held until this call returns and
  // then freed back stream-ordered, so replays own their workspace.
  c10::DataPtr per_call_workspace;
  void* workspace = nullptr;
  if (workspace_size_ > 0) {
    if (is_capturing(stream.stream())) {
      per_call_workspace = allocate_on(device_, workspace_size_);
      workspace = per_call_workspace.get();
    } else {
      workspace = workspace_for(handle, stream.stream(), workspace_size_, per_call_workspace);
    }
  }
  c10::SmallVector<void*, 8> pointers;
  for (const auto& t : inputs) pointers.push_back(t.data_ptr());
  for (const auto& t : outputs) pointers.push_back(t.data_ptr());
  pointers.push_back(workspace);
  cudnnBackendDescriptor_t pack = variant_pack(handle, serial_, uids_, pointers);
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

bool NativePlanTable::remove(int64_t graph, int device, const std::vector<OperandLayout>& inputs) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  auto it = plans_.find(graph);
  if (it == plans_.end()) return false;
  auto& plans = it->second;
  for (auto p = plans.begin(); p != plans.end(); ++p) {
    const auto& mine = (*p)->inputs();
    bool same = (*p)->device() == device && mine.size() == inputs.size();
    for (size_t i = 0; same && i < mine.size(); ++i) {
      same = mine[i].sizes == inputs[i].sizes && mine[i].strides == inputs[i].strides && mine[i].dtype == inputs[i].dtype;
    }
    if (same) {
      plans.erase(p);
      return true;
    }
  }
  return false;
}

std::shared_ptr<const NativePlan> NativePlanTable::find(int64_t graph, at::TensorList inputs) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  auto it = plans_.find(graph);
  if (it == plans_.end()) return nullptr;
  for (const auto& plan : it->second) {
    if (plan->matches(inputs)) return plan;
  }
  return nullptr;
}

size_t NativePlanTable::size() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  size_t n = 0;
  for (const auto& [graph, plans] : plans_) n += plans.size();
  return n;
}

}  // namespace torch_cudnn_handle
