// The CUDA kernels of cudnn_fe.execute, execute.out and execute_.
//
// A call whose (graph id, device, input layouts) has a native plan runs entirely here:
// outputs from torch's caching allocator on the current stream, then the plan
// (native/native_plan.h). Any other call (first use of a layout, which builds the
// graph; its second, which hands the plan to the native path; plans the frontend must
// drive per call; misaligned views) goes to the Python registry path. Either way the
// call runs on this thread's pooled handle in the right context, and leaves the
// caller's context (so its current device) as it found it (Note [The context rule],
// context/context_guard.h).
#include <ATen/ATen.h>
#include <ATen/cuda/EmptyTensor.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
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

// The Python path runs under a DeviceCall for its inputs' device too (the first CUDA
// input's: others may be host scalars); what is wrong with the inputs (no CUDA tensor,
// a CPU tensor that is not a scalar) gets the Python path's error, which names it.
void enter_python_path(std::optional<DeviceCall>& call, at::TensorList inputs) {
  for (const auto& tensor : inputs) {
    if (tensor.is_cuda()) {
      call.emplace(tensor.get_device());
      return;
    }
  }
}

std::vector<at::Tensor> execute_cuda(int64_t graph, at::TensorList inputs) {
  check_not_forked();
  if (auto outputs = run_native(graph, inputs)) return std::move(*outputs);
  std::optional<DeviceCall> call;
  enter_python_path(call, inputs);
  return python_kernels::execute(graph, inputs);
}

// Whether any of `targets` shares storage with another tensor of `targets` or of
// `others` (the same tensor at the same index excepted). Only a cheap filter: the
// Python path decides whether the memory really overlaps, and names the fix.
bool may_alias(at::TensorList targets, at::TensorList others, bool skip_same_index = false) {
  for (size_t i = 0; i < targets.size(); ++i) {
    for (size_t j = 0; j < others.size(); ++j) {
      if (skip_same_index && i == j) continue;
      if (targets[i].is_alias_of(others[j])) return true;
    }
  }
  return false;
}

void execute_out_cuda(int64_t graph, at::TensorList inputs, at::TensorList out) {
  check_not_forked();
  // Else the Python path names what is wrong with `out` (an overlap with an input
  // included), or stages a misaligned one.
  if (!may_alias(out, inputs) && !may_alias(out, out, true) && run_native_out(graph, inputs, out)) return;
  std::optional<DeviceCall> call;
  enter_python_path(call, inputs);
  python_kernels::execute_out(graph, inputs, out);
}

// execute_ on a native plan: each written input is bound as its output too (the
// variant pack holds its pointer under both uids, as the frontend's own in-place
// bindings do), the other outputs are allocated. nullopt when no plan serves the
// inputs or a written tensor does not have its output's memory layout (the Python
// path then names the mismatch).
std::optional<std::vector<at::Tensor>> run_plan_in_place(const GraphRecord& record, int64_t graph,
                                                         at::TensorList all, at::TensorList written) {
  auto plan = native::NativePlanTable::instance().find(graph, all);
  if (!plan) return std::nullopt;
  const auto& layouts = plan->outputs();
  std::vector<at::Tensor> outputs(layouts.size());
  for (size_t w = 0; w < written.size(); ++w) {
    const auto output = static_cast<size_t>(record.in_place[w].output);
    if (output >= layouts.size() || !layouts[output].matches_memory(written[w], plan->device(), all)) {
      return std::nullopt;
    }
    outputs[output] = written[w];
  }
  DeviceCall call(plan->device());
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(plan->device()));
  std::vector<at::Tensor> others;
  others.reserve(layouts.size() - written.size());
  for (size_t o = 0; o < layouts.size(); ++o) {
    if (outputs[o].defined()) continue;
    outputs[o] = at::detail::empty_strided_cuda(layouts[o].sizes_for(all), layouts[o].strides, layouts[o].dtype, device);
    others.push_back(outputs[o]);
  }
  plan->execute(call.handle, call.stream, all, outputs);
  return others;
}

std::vector<at::Tensor> execute_in_place_cuda(int64_t graph, at::TensorList inputs, at::TensorList written) {
  check_not_forked();
  const GraphRecord& record = in_place_record(graph);
  const auto all = record.merge_inputs(inputs, written);
  // A written tensor sharing memory with another operand goes to the Python path, which names it.
  if (!may_alias(written, inputs) && !may_alias(written, written, true)) {
    if (auto others = run_plan_in_place(record, graph, all, written)) return std::move(*others);
  }
  std::optional<DeviceCall> call;
  enter_python_path(call, all);
  return python_kernels::execute_in_place(graph, all);
}

std::vector<at::Tensor> run_plan(const native::NativePlan& plan, at::TensorList inputs) {
  DeviceCall call(plan.device());
  std::vector<at::Tensor> outputs;
  outputs.reserve(plan.outputs().size());
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(plan.device()));  // inputs[0] may be a host scalar
  for (const auto& layout : plan.outputs()) {
    // Straight from the CUDA allocator (device-guarded inside), not through the
    // dispatcher: this is the hot path, and the tensors are real CUDA tensors.
    // A packed (ragged) output is as long as the input it is like (OperandLayout::tokens_of).
    if (layout.tokens_of < 0) {
      outputs.emplace_back(at::detail::empty_strided_cuda(layout.sizes, layout.strides, layout.dtype, device));
    } else {
      outputs.emplace_back(at::detail::empty_strided_cuda(layout.sizes_for(inputs), layout.strides, layout.dtype, device));
    }
  }
  plan.execute(call.handle, call.stream, inputs, outputs);
  return outputs;
}

// A tensor the native path may read directly: a dense CUDA tensor no Python subclass,
// functionalization or functorch wrapper stands in for (those go through the dispatcher).
bool is_plain_cuda(const at::Tensor& tensor) {
  static const c10::DispatchKeySet wrapped({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                                            c10::DispatchKey::Functionalize, c10::DispatchKey::FuncTorchGradWrapper,
                                            c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::ZeroTensor,
                                            c10::DispatchKey::Conjugate, c10::DispatchKey::Negative});
  return tensor.is_cuda() && !tensor.key_set().has_any(wrapped);
}

bool all_plain_cuda(at::TensorList tensors) {
  for (const auto& t : tensors) {
    if (!t.defined() || !is_plain_cuda(t)) return false;
  }
  return true;
}

}  // namespace

std::optional<std::vector<at::Tensor>> run_native(int64_t graph, at::TensorList inputs) {
  auto plan = native::NativePlanTable::instance().find(graph, inputs);
  if (!plan) return std::nullopt;
  return run_plan(*plan, inputs);
}

std::optional<std::vector<at::Tensor>> run_native_in_place(int64_t graph, at::TensorList all_inputs) {
  const GraphRecord& record = in_place_record(graph);
  std::vector<at::Tensor> written;
  for (const auto& entry : record.in_place) {
    TORCH_CHECK(entry.input < static_cast<int64_t>(all_inputs.size()), "cudnn_fe.execute_: the graph writes its input ",
                entry.input, ", but got ", all_inputs.size(), " inputs");
    written.push_back(all_inputs[entry.input]);
  }
  return run_plan_in_place(record, graph, all_inputs, written);
}

std::optional<std::vector<at::Tensor>> run_native_backward(const GraphRecord& record, at::TensorList operands,
                                                           int64_t num_inputs) {
  // Through the dispatcher instead: with create_graph (the backward records its own
  // graph), under a TorchDispatchMode, or for wrapped tensors (torch.compile's fakes).
  if (at::GradMode::is_enabled() || c10::impl::dispatch_mode_enabled()) return std::nullopt;
  if (!all_plain_cuda(operands)) return std::nullopt;
  check_not_forked();
  auto plan = native::NativePlanTable::instance().find(record.backward_graph, operands);
  if (!plan) return std::nullopt;  // its first two calls (build, hand-over), or a plan only the Python path runs
  auto results = run_plan(*plan, operands);
  std::vector<at::Tensor> grad_inputs(num_inputs);
  const auto& positions = plan->output_positions();
  for (size_t i = 0; i < results.size(); ++i) {
    TORCH_CHECK(positions[i] < num_inputs, "torch_cudnn_handle: the backward graph returned a gradient for input ",
                positions[i], " of a forward with ", num_inputs, " inputs");
    grad_inputs[positions[i]] = std::move(results[i]);
  }
  return grad_inputs;
}

bool run_native_out(int64_t graph, at::TensorList inputs, at::TensorList out) {
  auto plan = native::NativePlanTable::instance().find(graph, inputs);
  if (!plan || !plan->matches_outputs(inputs, out)) return false;
  DeviceCall call(plan->device());
  plan->execute(call.handle, call.stream, inputs, out);
  return true;
}

}  // namespace torch_cudnn_handle

TORCH_LIBRARY_IMPL(cudnn_fe, CUDA, m) {
  m.impl("execute", &torch_cudnn_handle::execute_cuda);
  m.impl("execute.out", &torch_cudnn_handle::execute_out_cuda);
  m.impl("execute_", &torch_cudnn_handle::execute_in_place_cuda);
}
