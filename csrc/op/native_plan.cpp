#include "op/native_plan.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

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

}  // namespace

bool OperandLayout::matches(const at::Tensor& tensor) const {
  return tensor.scalar_type() == dtype && tensor.sizes().equals(sizes) && tensor.strides().equals(strides);
}

NativePlan::NativePlan(int device, const std::string& plan_json, std::vector<int64_t> uids,
                       std::vector<OperandLayout> inputs, std::vector<OperandLayout> outputs)
    : device_(device), uids_(std::move(uids)), inputs_(std::move(inputs)), outputs_(std::move(outputs)) {
  TORCH_CHECK(uids_.size() == inputs_.size() + outputs_.size(),
              "torch_cudnn_handle: a native plan needs one uid per input and output");
  // Deserialized on this device, with this thread's pooled handle there: a backend
  // plan is finalized for the device of the handle it is given.
  c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(device));
  PooledCudnnHandle* handle = handle_for_call(device, c10::cuda::getCurrentCUDAStream(device).stream());
  ScopedDescriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  set_attribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                static_cast<int64_t>(plan_json.size()), plan_json.data(),
                "setting the execution plan's JSON representation");
  set_attribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle->backend_handle,
                "setting the execution plan's handle");
  backend::check_cudnn(backend::cudnn_library().finalize(plan.get()), "deserializing the execution plan");
  int64_t count = 0;
  backend::check_cudnn(backend::cudnn_library().get_attribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                              CUDNN_TYPE_INT64, 1, &count, &workspace_size_),
                       "reading the execution plan's workspace size");
  plan_ = plan.release();
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
  // Per call, from torch's caching allocator on this stream: capturable, and freed
  // back to the stream's pool once the work queued here is done with it.
  at::Tensor workspace;
  if (workspace_size_ > 0) {
    workspace = at::empty({workspace_size_}, inputs[0].options().dtype(at::kByte));
  }
  std::vector<void*> pointers;
  pointers.reserve(uids_.size());
  for (const auto& t : inputs) pointers.push_back(t.data_ptr());
  for (const auto& t : outputs) pointers.push_back(t.data_ptr());
  void* workspace_pointer = workspace_size_ > 0 ? workspace.data_ptr() : nullptr;

  ScopedDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  set_attribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                static_cast<int64_t>(pointers.size()), pointers.data(), "setting the variant pack's pointers");
  set_attribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids_.size()),
                uids_.data(), "setting the variant pack's uids");
  set_attribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace_pointer,
                "setting the variant pack's workspace");
  backend::check_cudnn(backend::cudnn_library().finalize(pack.get()), "finalizing the variant pack");
  backend::check_cudnn(backend::cudnn_library().execute(handle->backend_handle, plan_, pack.get()),
                       "cudnnBackendExecute");
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
