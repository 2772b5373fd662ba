// The CUDA kernels of cudnn_fe.execute and execute.out.
//
// A call whose (graph id, device, input layouts) has a native plan runs entirely here:
// outputs from torch's caching allocator on the current stream, then the plan
// (op/native_plan.h). Any other call (first use of a layout, which builds the graph;
// plans the frontend must drive per call) goes to the Python registry path.
#include <ATen/ATen.h>
#include <ATen/cuda/EmptyTensor.h>
#include <torch/library.h>

#include "op/native_plan.h"
#include "op/python_kernels.h"

namespace torch_cudnn_handle {
namespace {

std::vector<at::Tensor> execute_cuda(int64_t graph, at::TensorList inputs) {
  if (auto plan = NativePlanTable::instance().find(graph, inputs)) {
    std::vector<at::Tensor> outputs;
    outputs.reserve(plan->outputs().size());
    const auto device = inputs[0].device();
    for (const auto& layout : plan->outputs()) {
      // Straight from the CUDA allocator (device-guarded inside), not through the
      // dispatcher: this is the hot path, and the tensors are real CUDA tensors.
      outputs.emplace_back(at::detail::empty_strided_cuda(layout.sizes, layout.strides, layout.dtype, device));
    }
    plan->execute(inputs, outputs);
    return outputs;
  }
  return python_kernels::execute(graph, inputs);
}

void execute_out_cuda(int64_t graph, at::TensorList inputs, at::TensorList out) {
  if (auto plan = NativePlanTable::instance().find(graph, inputs)) {
    bool fits = out.size() == plan->outputs().size();
    for (size_t i = 0; fits && i < out.size(); ++i) {
      fits = out[i].is_cuda() && out[i].get_device() == plan->device() && plan->outputs()[i].matches(out[i]);
    }
    if (fits) {
      plan->execute(inputs, out);
      return;
    }  // else: the Python path names what is wrong with `out`
  }
  python_kernels::execute_out(graph, inputs, out);
}

}  // namespace
}  // namespace torch_cudnn_handle

TORCH_LIBRARY_IMPL(cudnn_fe, CUDA, m) {
  m.impl("execute", &torch_cudnn_handle::execute_cuda);
  m.impl("execute.out", &torch_cudnn_handle::execute_out_cuda);
}
