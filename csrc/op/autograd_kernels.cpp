// The autograd-side kernels of cudnn_fe.execute and execute.out, in C++ so that a call
// with no gradient to track costs a branch, not a trip through Python.
//
// execute (Autograd): with a gradient to track, it records a node whose backward runs
// the graph's registered backward on whichever thread autograd runs it; the pool gives
// that thread its own handle and binds the context it lacks. A declared backward whose
// graph a native plan serves runs here in C++ (op/declared_backward.h); every other
// backward runs in Python (builders and backward functions are user code).
// execute.out: torch's rules for out= ops. Autograd refuses a call that would need a
// gradient through `out`; ADInplaceOrView bumps each `out`'s version counter, so a
// tensor saved for backward and then overwritten raises torch's in-place error.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <optional>

#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
#include "op/cuda_kernels.h"
#endif
#include "op/declared_backward.h"
#include "op/execute_op.h"
#include "op/python_kernels.h"

namespace torch_cudnn_handle {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::vector<at::Tensor> execute_below_autograd(int64_t graph, at::TensorList inputs) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return execute_op().call(graph, inputs);
}

class ExecuteFunction : public torch::autograd::Function<ExecuteFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, int64_t graph, at::TensorList inputs) {
    variable_list outputs = execute_below_autograd(graph, inputs);
    ctx->set_materialize_grads(false);  // a gradient nobody gave stays undefined: the backward zero-fills only what it reads
    ctx->saved_data["graph"] = graph;
    ctx->saved_data["num_inputs"] = static_cast<int64_t>(inputs.size());
    variable_list saved(inputs.begin(), inputs.end());
    saved.insert(saved.end(), outputs.begin(), outputs.end());
    ctx->save_for_backward(saved);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto num_inputs = ctx->saved_data["num_inputs"].toInt();
    const at::TensorList all(saved);
    const auto graph = ctx->saved_data["graph"].toInt();
    const auto inputs = all.slice(0, num_inputs);
    const auto outputs = all.slice(num_inputs);
    std::optional<std::vector<at::Tensor>> native;
#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
    if (const auto* declared = declared_backward(graph)) native = run_native_backward(*declared, grad_outputs, inputs, outputs);
#endif
    auto grads = native ? std::move(*native) : python_kernels::backward(graph, grad_outputs, inputs, outputs);
    TORCH_CHECK(static_cast<int64_t>(grads.size()) == num_inputs, "torch_cudnn_handle: the backward returned ",
                grads.size(), " gradients for ", num_inputs, " inputs");
    variable_list result{at::Tensor()};  // the graph id has no gradient
    result.insert(result.end(), grads.begin(), grads.end());
    return result;
  }
};

std::vector<at::Tensor> execute_autograd(c10::DispatchKeySet keys, int64_t graph, at::TensorList inputs) {
  bool needs_graph = false;
  if (at::GradMode::is_enabled()) {
    for (const auto& t : inputs) needs_graph = needs_graph || t.requires_grad();
  }
  if (!needs_graph) {  // no node to record: straight on to the kernel below autograd
    return execute_op().redispatch(keys & c10::after_autograd_keyset, graph, inputs);
  }
  return ExecuteFunction::apply(graph, inputs);
}

void execute_out_autograd(c10::DispatchKeySet keys, int64_t graph, at::TensorList inputs, at::TensorList out) {
  if (at::GradMode::is_enabled()) {
    auto refuse = [](const char* what, size_t i) {
      TORCH_CHECK(false, "cudnn_fe.execute.out: functions with out=... arguments don't support automatic "
                  "differentiation, but ", what, "[", i, "] requires grad. Use torch.ops.cudnn_fe.execute "
                  "(functional) to differentiate, or call it under torch.no_grad().");
    };
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].requires_grad()) refuse("inputs", i);
    }
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i].requires_grad()) refuse("out", i);
    }
  }
  execute_out_op().redispatch(keys & c10::after_autograd_keyset, graph, inputs, out);
}

void execute_out_ad_inplace_or_view(c10::DispatchKeySet keys, int64_t graph, at::TensorList inputs,
                                    at::TensorList out) {
  {
    at::AutoDispatchBelowADInplaceOrView below;
    execute_out_op().redispatch(keys & c10::after_ADInplaceOrView_keyset, graph, inputs, out);
  }
  for (const auto& t : out) torch::autograd::impl::bump_version(t);
}

}  // namespace
}  // namespace torch_cudnn_handle

TORCH_LIBRARY_IMPL(cudnn_fe, Autograd, m) {
  m.impl("execute", &torch_cudnn_handle::execute_autograd);
  m.impl("execute.out", &torch_cudnn_handle::execute_out_autograd);
}

TORCH_LIBRARY_IMPL(cudnn_fe, ADInplaceOrView, m) {
  m.impl("execute.out", &torch_cudnn_handle::execute_out_ad_inplace_or_view);
}
