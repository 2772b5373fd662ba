#include "op/declared_backward.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <memory>
#include <shared_mutex>
#include <unordered_map>

namespace torch_cudnn_handle {
namespace {

struct Table {
  std::shared_mutex mutex;
  std::unordered_map<int64_t, std::unique_ptr<const DeclaredBackward>> by_forward;
};

Table& table() {
  static auto* instance = new Table();  // never destroyed: autograd threads may read it until exit
  return *instance;
}

const at::Tensor& pick(at::TensorList tensors, int64_t index, const char* what) {
  TORCH_CHECK(index >= 0 && index < static_cast<int64_t>(tensors.size()), "torch_cudnn_handle: a declared backward "
              "operand names ", what, "[", index, "], but the forward call has ", tensors.size(), " ", what);
  return tensors[index];
}

}  // namespace

void declare_backward(int64_t forward_graph, DeclaredBackward declared) {
  auto& t = table();
  std::unique_lock<std::shared_mutex> lock(t.mutex);
  // Once per graph id: a node may be running the declaration it was given.
  const bool added = t.by_forward.try_emplace(forward_graph, std::make_unique<const DeclaredBackward>(std::move(declared))).second;
  TORCH_CHECK(added, "torch_cudnn_handle: graph ", forward_graph, " already has a declared backward");
}

const DeclaredBackward* declared_backward(int64_t forward_graph) {
  auto& t = table();
  std::shared_lock<std::shared_mutex> lock(t.mutex);
  auto it = t.by_forward.find(forward_graph);
  return it == t.by_forward.end() ? nullptr : it->second.get();
}

std::vector<at::Tensor> assemble_backward_operands(const DeclaredBackward& declared, at::TensorList grads,
                                                   at::TensorList inputs, at::TensorList outputs) {
  using Source = DeclaredBackward::Source;
  std::vector<at::Tensor> operands;
  operands.reserve(declared.operands.size());
  for (const auto& operand : declared.operands) {
    if (operand.source == Source::kInput) {
      operands.push_back(pick(inputs, operand.index, "inputs"));
      continue;
    }
    if (operand.source == Source::kOutput) {
      operands.push_back(pick(outputs, operand.index, "outputs"));
      continue;
    }
    const at::Tensor& grad = pick(grads, operand.index, "grad_outputs");
    at::Tensor given = grad.defined() ? grad : at::zeros_like(pick(outputs, operand.index, "outputs"));
    if (operand.strides_of_output < 0) {
      operands.push_back(given.contiguous());
      continue;
    }
    const at::Tensor& like = pick(outputs, operand.strides_of_output, "outputs");
    operands.push_back(given.strides().equals(like.strides())
                           ? given
                           : at::empty_strided(like.sizes(), like.strides(), given.options()).copy_(given));
  }
  return operands;
}

}  // namespace torch_cudnn_handle
