// The autograd-side kernels of cudnn_fe.execute and execute.out, in C++ so that a call
// with no gradient to track costs a branch, not a trip through Python.
//
// execute (Autograd): with a gradient to track, it records a node that acts on the
// graph's record (op/graph_record.h): it saves what the backward reads and nothing more,
// marks the outputs the backward takes no gradient of non-differentiable, and its
// backward runs on whichever thread autograd picks (the pool gives that thread its own
// handle and binds the context it lacks). A declared backward's operands are assembled
// here; when a native plan serves them it runs here too, else the Python registry runs
// that backward graph. A declared backward of several graphs (GraphRecord::steps) runs
// here too, each step through the op. Every other backward runs in Python (backward
// functions are user code).
// execute.out: torch's rules for out= ops. Autograd refuses a call that would need a
// gradient through `out`; ADInplaceOrView bumps each `out`'s version counter, so a
// tensor saved for backward and then overwritten raises torch's in-place error.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <optional>

#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
#include "op/cuda_kernels.h"
#endif
#include "op/execute_op.h"
#include "op/graph_record.h"
#include "op/python_kernels.h"

namespace torch_cudnn_handle {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::vector<at::Tensor> execute_below_autograd(int64_t graph, at::TensorList inputs) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return execute_op().call(graph, inputs);
}

// Note [What a node saves]
// A node keeps what its graph's backward reads (GraphRecord::reads) and nothing more,
// as torch's own derivative formulas do: an input only when an input whose gradient
// needs it requires grad; an output the backward does not read is not saved, so
// autograd holds no extra memory for it and an in-place op on it is allowed. What a
// missing gradient is zero-filled like is kept as sizes, strides and options
// (OutputMeta), never as the output itself.
struct NodeCall : torch::CustomClassHolder {
  int64_t graph = 0;
  const GraphRecord* record = nullptr;  // nullptr: no record (a registered built graph: no backward, which says so)
  std::vector<int64_t> input_slots;  // index into the saved variables, -1: not saved
  std::vector<int64_t> output_slots;
  std::vector<OutputMeta> output_metas;
  std::vector<std::vector<c10::SymInt>> input_sizes;  // a stepped backward's: what a summed gradient is reduced to

  variable_list unpack(const variable_list& saved, const std::vector<int64_t>& slots) const {
    variable_list out(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i] >= 0) out[i] = saved[slots[i]];
    }
    return out;
  }
};

class ExecuteFunction : public torch::autograd::Function<ExecuteFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, int64_t graph, at::TensorList inputs) {
    variable_list outputs = execute_below_autograd(graph, inputs);
    ctx->set_materialize_grads(false);  // a gradient nobody gave stays undefined: the backward fills only what it reads
    auto call = c10::make_intrusive<NodeCall>();
    call->graph = graph;
    call->record = graph_record(graph);
    std::vector<bool> needs_grad(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) needs_grad[i] = ctx->needs_input_grad(i);
    variable_list saved, non_differentiable;
    call->input_slots.assign(inputs.size(), -1);
    call->output_slots.assign(outputs.size(), -1);
    call->output_metas.reserve(outputs.size());
    const GraphRecord* record = call->record;
    if (record && record->stepped()) {
      for (const auto& input : inputs) call->input_sizes.push_back(input.sym_sizes().vec());
    }
    for (size_t i = 0; record && i < inputs.size(); ++i) {
      if (!record->reads_input(static_cast<int64_t>(i), needs_grad)) continue;
      call->input_slots[i] = static_cast<int64_t>(saved.size());
      saved.push_back(inputs[i]);
    }
    for (size_t j = 0; j < outputs.size(); ++j) {
      const auto& output = outputs[j];
      call->output_metas.push_back({output.sym_sizes().vec(), output.sym_strides().vec(), output.options()});
      if (record && !record->is_differentiable(static_cast<int64_t>(j))) non_differentiable.push_back(output);
      if (!record || !record->reads_output(static_cast<int64_t>(j), needs_grad)) continue;
      call->output_slots[j] = static_cast<int64_t>(saved.size());
      saved.push_back(output);
    }
    ctx->save_for_backward(saved);
    if (!non_differentiable.empty()) ctx->mark_non_differentiable(non_differentiable);
    ctx->saved_data["call"] = c10::IValue::make_capsule(std::move(call));
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto call = c10::static_intrusive_pointer_cast<NodeCall>(ctx->saved_data["call"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    const auto inputs = call->unpack(saved, call->input_slots);
    const auto outputs = call->unpack(saved, call->output_slots);
    const GraphRecord* record = call->record;
    std::vector<at::Tensor> grads;
    if (record && record->stepped()) {
      std::vector<bool> needs_grad(inputs.size());
      for (size_t i = 0; i < inputs.size(); ++i) needs_grad[i] = ctx->needs_input_grad(i);
      grads = run_backward_steps(*record, grad_outputs, inputs, outputs, call->output_metas, call->input_sizes, needs_grad);
    } else if (record && record->declared()) {
      const auto operands = assemble_backward_operands(*record, grad_outputs, inputs, outputs, call->output_metas);
      std::optional<std::vector<at::Tensor>> native;
#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
      native = run_native_backward(*record, operands, static_cast<int64_t>(inputs.size()));
#endif
      grads = native ? std::move(*native) : python_kernels::run_backward_graph(call->graph, operands, inputs.size());
    } else {
      if (record && record->materialize_grads) {
        for (size_t j = 0; j < grad_outputs.size(); ++j) {
          if (!grad_outputs[j].defined()) grad_outputs[j] = call->output_metas[j].zeros();
        }
      }
      grads = python_kernels::backward(call->graph, grad_outputs, inputs, outputs);
    }
    TORCH_CHECK(grads.size() == inputs.size(), "torch_cudnn_handle: the backward returned ", grads.size(),
                " gradients for ", inputs.size(), " inputs");
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
