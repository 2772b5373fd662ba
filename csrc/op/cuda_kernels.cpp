// The CUDA kernels of cudnn_fe.execute and execute.out.
//
// A call whose (graph id, device, input layouts) has a native plan runs entirely here:
// outputs from torch's caching allocator on the current stream, then the plan
// (native/native_plan.h). Any other call (first use of a layout, which builds the
// graph; plans the frontend must drive per call; misaligned views) goes to the Python
// registry path. Either way the call runs on this thread's pooled handle in the right
// context, and leaves the caller's context (so its current device) as it found it.
#include <ATen/ATen.h>
#include <ATen/cuda/EmptyTensor.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>

#include "context/context_guard.h"
#include "native/native_plan.h"
#include "op/cuda_kernels.h"
#include "op/python_kernels.h"
#include "pool/cudnn_handle_pool.h"

namespace torch_cudnn_handle {
namespace {

// This thread's handle for `device`, set to torch's current stream there, with the
// right context current until the call ends.
struct DeviceCall {
  explicit DeviceCall(int device)
      : stream(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream()),
        handle(handle_for_call(device, stream)),
        context(device, stream, handle->stream_context) {}
  cudaStream_t stream;
  PooledCudnnHandle* handle;
  context::ContextGuard context;
};

// The Python path runs under a DeviceCall for its inputs' device too; inputs that are
// not all CUDA get the Python path's error, which names the offending one.
void enter_python_path(std::optional<DeviceCall>& call, at::TensorList inputs) {
  if (!inputs.empty() && inputs[0].is_cuda()) call.emplace(inputs[0].get_device());
}

std::vector<at::Tensor> execute_cuda(int64_t graph, at::TensorList inputs) {
  check_not_forked();
  if (auto outputs = run_native(graph, inputs)) return std::move(*outputs);
  std::optional<DeviceCall> call;
  enter_python_path(call, inputs);
  return python_kernels::execute(graph, inputs);
}

void execute_out_cuda(int64_t graph, at::TensorList inputs, at::TensorList out) {
  check_not_forked();
  // Else the Python path names what is wrong with `out`, or stages a misaligned one.
  if (run_native_out(graph, inputs, out)) return;
  std::optional<DeviceCall> call;
  enter_python_path(call, inputs);
  python_kernels::execute_out(graph, inputs, out);
}

}  // namespace

std::optional<std::vector<at::Tensor>> run_native(int64_t graph, at::TensorList inputs) {
  auto plan = native::NativePlanTable::instance().find(graph, inputs);
  if (!plan) return std::nullopt;
  DeviceCall call(plan->device());
  std::vector<at::Tensor> outputs;
  outputs.reserve(plan->outputs().size());
  const auto device = inputs[0].device();
  for (const auto& layout : plan->outputs()) {
    // Straight from the CUDA allocator (device-guarded inside), not through the
    // dispatcher: this is the hot path, and the tensors are real CUDA tensors.
    outputs.emplace_back(at::detail::empty_strided_cuda(layout.sizes, layout.strides, layout.dtype, device));
  }
  plan->execute(call.handle, call.stream, inputs, outputs);
  return outputs;
}

bool run_native_out(int64_t graph, at::TensorList inputs, at::TensorList out) {
  auto plan = native::NativePlanTable::instance().find(graph, inputs);
  if (!plan || !plan->matches_outputs(out)) return false;
  DeviceCall call(plan->device());
  plan->execute(call.handle, call.stream, inputs, out);
  return true;
}

}  // namespace torch_cudnn_handle

TORCH_LIBRARY_IMPL(cudnn_fe, CUDA, m) {
  m.impl("execute", &torch_cudnn_handle::execute_cuda);
  m.impl("execute.out", &torch_cudnn_handle::execute_out_cuda);
}
