#include "op/native_breakdown.h"

#include <ATen/ATen.h>
#include <ATen/cuda/EmptyTensor.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <vector>

#include "backend/cudnn_library.h"
#include "op/execute_op.h"
#include "op/native_plan.h"
#include "pool/cudnn_handle_pool.h"

namespace torch_cudnn_handle {
namespace {

template <typename Step>
double us_per_call(int64_t calls, Step&& step) {
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < calls; ++i) step();
  const std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / static_cast<double>(calls);
}

cudnnBackendDescriptor_t make_variant_pack(const std::vector<int64_t>& uids, std::vector<void*>& pointers,
                                           void* workspace) {
  const auto& lib = backend::cudnn_library();
  cudnnBackendDescriptor_t pack = nullptr;
  backend::check_cudnn(lib.create_descriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack), "create variant pack");
  backend::check_cudnn(lib.set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                         static_cast<int64_t>(pointers.size()), pointers.data()),
                       "variant pack pointers");
  backend::check_cudnn(lib.set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                         static_cast<int64_t>(uids.size()), uids.data()),
                       "variant pack uids");
  backend::check_cudnn(lib.set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace),
                       "variant pack workspace");
  backend::check_cudnn(lib.finalize(pack), "finalize variant pack");
  return pack;
}

}  // namespace

std::map<std::string, double> native_breakdown(int64_t graph, at::TensorList inputs, at::TensorList outputs,
                                               int64_t calls) {
  auto plan = NativePlanTable::instance().find(graph, inputs);
  TORCH_CHECK(plan, "native_breakdown: graph ", std::to_string(graph), " has no native plan for these inputs");
  TORCH_CHECK(outputs.size() == plan->outputs().size(), "native_breakdown: wrong number of outputs");
  const auto& lib = backend::cudnn_library();
  const auto device = static_cast<c10::DeviceIndex>(plan->device());
  const auto stream = c10::cuda::getCurrentCUDAStream(device);
  PooledCudnnHandle* handle = handle_for_call(plan->device(), stream.stream());
  const auto options = inputs[0].options();

  at::Tensor workspace = at::empty({std::max<int64_t>(plan->workspace_size(), 1)}, options.dtype(at::kByte));
  std::vector<void*> pointers;
  for (const auto& t : inputs) pointers.push_back(t.data_ptr());
  for (const auto& t : outputs) pointers.push_back(t.data_ptr());
  cudnnBackendDescriptor_t pack = make_variant_pack(plan->uids(), pointers, workspace.data_ptr());

  std::map<std::string, double> us;
  us["handle_for_call"] = us_per_call(calls, [&] { handle_for_call(plan->device(), stream.stream()); });
  us["workspace_alloc_per_call (capture path)"] = us_per_call(calls, [&] {
    if (plan->workspace_size() > 0) at::empty({plan->workspace_size()}, options.dtype(at::kByte));
  });
  us["outputs_alloc"] = us_per_call(calls, [&] {
    for (const auto& layout : plan->outputs()) at::detail::empty_strided_cuda(layout.sizes, layout.strides, layout.dtype, inputs[0].device());
  });
  us["variant_pack_build (new pointers)"] = us_per_call(calls, [&] {
    lib.destroy_descriptor(make_variant_pack(plan->uids(), pointers, workspace.data_ptr()));
  });
  us["backend_execute_prebuilt_pack"] = us_per_call(calls, [&] {
    backend::check_cudnn(lib.execute(handle->backend_handle, plan->descriptor(), pack), "cudnnBackendExecute");
  });
  // The same plan deserialized again for this thread's handle alone: whether sharing
  // one plan descriptor between threads is what contends.
  cudnnBackendDescriptor_t private_plan = deserialize_plan(plan->plan_json(), handle->backend_handle);
  us["backend_execute_private_plan"] = us_per_call(calls, [&] {
    backend::check_cudnn(lib.execute(handle->backend_handle, private_plan, pack), "cudnnBackendExecute");
  });
  stream.synchronize();
  lib.destroy_descriptor(private_plan);
  us["native_plan_execute (cached workspace, pack reused)"] = us_per_call(calls, [&] { plan->execute(inputs, outputs); });
  us["plan_table_find"] = us_per_call(calls, [&] { NativePlanTable::instance().find(graph, inputs); });
  // The whole op through the dispatcher, outputs included (Autograd kernel, then the CUDA kernel), from C++.
  us["dispatcher_call"] = us_per_call(calls, [&] { execute_op().call(graph, inputs); });
  stream.synchronize();
  lib.destroy_descriptor(pack);
  us["workspace_bytes"] = static_cast<double>(plan->workspace_size());
  return us;
}

}  // namespace torch_cudnn_handle
