#include "backend/descriptors.h"

#include <c10/util/Exception.h>

#include "backend/cudnn_library.h"

namespace torch_cudnn_handle::backend {

cudnnBackendDescriptor_t deserialize_plan(const std::string& plan_json, cudnnHandle_t handle) {
  ScopedDescriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  set_attribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                static_cast<int64_t>(plan_json.size()), plan_json.data(),
                "setting the execution plan's JSON representation");
  set_attribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle,
                "setting the execution plan's handle");
  check_cudnn(cudnn_library().finalize(plan.get()), "deserializing the execution plan");
  return plan.release();
}

cudnnBackendDescriptor_t make_variant_pack(const std::vector<int64_t>& uids, c10::ArrayRef<void*> pointers,
                                           void* workspace) {
  TORCH_CHECK(uids.size() == pointers.size(), "torch_cudnn_handle: a variant pack needs one pointer per uid");
  ScopedDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  const auto count = static_cast<int64_t>(uids.size());
  set_attribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, count, pointers.data(),
                "setting the variant pack's pointers");
  set_attribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, count, uids.data(),
                "setting the variant pack's uids");
  set_attribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace,
                "setting the variant pack's workspace");
  check_cudnn(cudnn_library().finalize(pack.get()), "finalizing the variant pack");
  return pack.release();
}

}  // namespace torch_cudnn_handle::backend
