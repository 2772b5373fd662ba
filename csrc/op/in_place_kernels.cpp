// The dispatcher-side kernels of cudnn_fe.execute_ (a graph writing outputs into its
// inputs) that are not the CUDA kernel: torch's rules for an in-place op.
//
// Autograd: execute_ has no gradient. Under grad mode it refuses any tensor that
// requires grad, a written leaf with torch's own reason (a leaf that requires grad
// cannot be written in place), naming the functional execute as the differentiable
// route.
// ADInplaceOrView: bumps each written tensor's version counter (a view's is its
// base's), so autograd refuses a backward that saved one of them before the write.
// Functionalize (torch.compile, torch.func.functionalize): the functional execute on
// the unwrapped inputs, then each written output replaces its input's value, which
// functionalization turns into a copy back into the input at the graph's end. (The
// op returns a Tensor[], which auto_functionalized does not take: torch 2.13's
// can_auto_functionalize refuses a list return, so the rewrite is declared here, as
// torch's own in-place ops declare theirs.)
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include "op/execute_op.h"
#include "op/graph_record.h"

namespace torch_cudnn_handle {
namespace {

namespace functional = at::functionalization::impl;

// The builder-order index of inputs[i], the i-th of the inputs execute_ does not write
// (the schema passes the written ones apart: GraphRecord::merge_inputs).
int64_t builder_index(const GraphRecord& record, size_t i) {
  size_t seen = 0;
  for (int64_t position = 0;; ++position) {
    bool writes = false;
    for (const auto& entry : record.in_place) writes = writes || entry.input == position;
    if (!writes && seen++ == i) return position;
  }
}

void refuse_gradients(const GraphRecord& record, at::TensorList inputs, at::TensorList written) {
  for (size_t w = 0; w < written.size(); ++w) {
    if (!written[w].requires_grad()) continue;
    const auto input = record.in_place[w].input;
    TORCH_CHECK(!written[w].is_leaf(), "cudnn_fe.execute_: input ", input, " (written in place) is a leaf tensor that "
                "requires grad, and a leaf that requires grad cannot be written in place (torch refuses the same: \"a "
                "leaf Variable that requires grad is being used in an in-place operation\"). Write into a tensor that "
                "needs no grad (a buffer, such as running statistics), or call it under torch.no_grad().");
    TORCH_CHECK(false, "cudnn_fe.execute_: input ", input, " (written in place) requires grad, and execute_ has no "
                "gradient. Differentiate torch.ops.cudnn_fe.execute instead (functional: it returns the outputs execute_ "
                "writes in place as new tensors), or call execute_ under torch.no_grad().");
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(!inputs[i].requires_grad(), "cudnn_fe.execute_: input ", builder_index(record, i), " requires grad, and "
                "execute_ has no gradient. Differentiate torch.ops.cudnn_fe.execute instead (functional: it returns the "
                "outputs execute_ writes in place as new tensors; copy those into the inputs under torch.no_grad()), or "
                "call execute_ under torch.no_grad().");
  }
}

std::vector<at::Tensor> execute_in_place_autograd(c10::DispatchKeySet keys, int64_t graph, at::TensorList inputs,
                                                  at::TensorList written) {
  if (at::GradMode::is_enabled()) refuse_gradients(in_place_record(graph), inputs, written);
  return execute_in_place_op().redispatch(keys & c10::after_autograd_keyset, graph, inputs, written);
}

std::vector<at::Tensor> execute_in_place_ad_inplace_or_view(c10::DispatchKeySet keys, int64_t graph,
                                                            at::TensorList inputs, at::TensorList written) {
  std::vector<at::Tensor> others;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    others = execute_in_place_op().redispatch(keys & c10::after_ADInplaceOrView_keyset, graph, inputs, written);
  }
  for (const auto& t : written) torch::autograd::impl::bump_version(t);
  return others;
}

at::Tensor unwrapped(const at::Tensor& tensor) {
  if (!functional::isFunctionalTensor(tensor)) return tensor;
  functional::sync(tensor);  // pending mutations of its views, applied first
  return functional::from_functional_tensor(tensor);
}

std::vector<at::Tensor> unwrapped(at::TensorList tensors) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(unwrapped(t));
  return out;
}

std::vector<at::Tensor> execute_in_place_functionalize(int64_t graph, at::TensorList inputs, at::TensorList written) {
  const GraphRecord& record = in_place_record(graph);
  bool written_functional = false;
  for (const auto& t : written) written_functional = written_functional || functional::isFunctionalTensor(t);
  if (!written_functional) {  // nothing to functionalize: the buffers are real
    for (const auto& t : inputs) {
      TORCH_CHECK(!functional::isFunctionalTensor(t), "cudnn_fe.execute_: mutating a non-functional tensor with a "
                  "functional tensor is not allowed");
    }
    at::AutoDispatchSkipFunctionalize skip;
    return execute_in_place_op().call(graph, inputs, written);
  }
  const auto all = record.merge_inputs(unwrapped(inputs), unwrapped(written));
  std::vector<at::Tensor> outputs;
  {
    at::AutoDispatchSkipFunctionalize skip;
    outputs = execute_op().call(graph, all);
  }
  for (size_t w = 0; w < written.size(); ++w) {
    const auto& entry = record.in_place[w];
    TORCH_CHECK(entry.output < static_cast<int64_t>(outputs.size()), "cudnn_fe.execute_: graph ", graph, " writes its "
                "output ", entry.output, " into input ", entry.input, ", but it has ", outputs.size(), " outputs");
    const at::Tensor& value = outputs[entry.output];
    TORCH_CHECK(functional::isFunctionalTensor(written[w]), "cudnn_fe.execute_: some written tensors are functional "
                "and some are not");
    TORCH_CHECK(value.sym_sizes().equals(written[w].sym_sizes()) && value.scalar_type() == written[w].scalar_type(),
                "cudnn_fe.execute_: graph ", graph, " writes output ", entry.output, " (", value.scalar_type(), " ",
                value.sym_sizes(), ") into input ", entry.input, " (", written[w].scalar_type(), " ", written[w].sym_sizes(),
                "); an in-place output must have its input's shape, strides and dtype");
    functional::replace_(written[w], value);
    functional::commit_update(written[w]);
    functional::sync(written[w]);
  }
  std::vector<at::Tensor> others;
  for (size_t o = 0; o < outputs.size(); ++o) {
    if (record.writes_output(static_cast<int64_t>(o)) == nullptr) others.push_back(outputs[o]);
  }
  return functional::to_functional_tensor(others);
}

}  // namespace
}  // namespace torch_cudnn_handle

TORCH_LIBRARY_IMPL(cudnn_fe, Autograd, m) {
  m.impl("execute_", &torch_cudnn_handle::execute_in_place_autograd);
}

TORCH_LIBRARY_IMPL(cudnn_fe, ADInplaceOrView, m) {
  m.impl("execute_", &torch_cudnn_handle::execute_in_place_ad_inplace_or_view);
}

TORCH_LIBRARY_IMPL(cudnn_fe, Functionalize, m) {
  m.impl("execute_", &torch_cudnn_handle::execute_in_place_functionalize);
}
