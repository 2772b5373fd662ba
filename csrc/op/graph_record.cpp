#include "op/graph_record.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <memory>
#include <shared_mutex>
#include <unordered_map>

namespace torch_cudnn_handle {
namespace {

struct Table {
  std::shared_mutex mutex;
  std::unordered_map<int64_t, std::unique_ptr<const GraphRecord>> by_graph;
};

Table& table() {
  static auto* instance = new Table();  // never destroyed: autograd threads may read it until exit
  return *instance;
}

bool record_reads(const GraphRecord& record, GraphRecord::Source source, int64_t index, const std::vector<bool>& needs_grad) {
  if (!record.has_backward) return false;
  if (record.reads_everything) return true;
  for (const auto& read : record.reads) {
    if (read.source != source || read.index != index) continue;
    if (read.for_grads.empty()) return true;
    for (const auto input : read.for_grads) {
      if (input < static_cast<int64_t>(needs_grad.size()) && needs_grad[input]) return true;
    }
  }
  return false;
}

const at::Tensor& pick(at::TensorList tensors, int64_t index, const char* what) {
  TORCH_CHECK(index >= 0 && index < static_cast<int64_t>(tensors.size()), "torch_cudnn_handle: a declared backward "
              "operand names ", what, "[", index, "], but the forward call has ", tensors.size(), " ", what);
  return tensors[index];
}

const at::Tensor& saved(at::TensorList tensors, int64_t index, const char* what) {
  const at::Tensor& tensor = pick(tensors, index, what);
  TORCH_CHECK(tensor.defined(), "torch_cudnn_handle: the backward reads ", what, "[", index, "], which the node did "
              "not save: declare it among the graph's backward reads");
  return tensor;
}

const OutputMeta& meta_of(const std::vector<OutputMeta>& metas, int64_t index) {
  TORCH_CHECK(index >= 0 && index < static_cast<int64_t>(metas.size()), "torch_cudnn_handle: a declared backward "
              "operand names outputs[", index, "], but the forward call has ", metas.size(), " outputs");
  return metas[index];
}

}  // namespace

bool GraphRecord::reads_input(int64_t index, const std::vector<bool>& needs_grad) const {
  return record_reads(*this, Source::kInput, index, needs_grad);
}

bool GraphRecord::reads_output(int64_t index, const std::vector<bool>& needs_grad) const {
  return record_reads(*this, Source::kOutput, index, needs_grad);
}

bool GraphRecord::is_differentiable(int64_t output) const {
  return all_outputs_differentiable ||
      std::find(differentiable_outputs.begin(), differentiable_outputs.end(), output) != differentiable_outputs.end();
}

// Outputs are allocated dense (empty_strided from the graph's layout), so this is their layout too.
at::Tensor OutputMeta::zeros() const { return at::empty_strided_symint(sizes, strides, options).zero_(); }

void declare_graph(int64_t graph, GraphRecord record) {
  auto& t = table();
  std::unique_lock<std::shared_mutex> lock(t.mutex);
  // Once per graph id: a node may be acting on the record it was given.
  const bool added = t.by_graph.try_emplace(graph, std::make_unique<const GraphRecord>(std::move(record))).second;
  TORCH_CHECK(added, "torch_cudnn_handle: graph ", graph, " already has a record");
}

const GraphRecord* graph_record(int64_t graph) {
  auto& t = table();
  std::shared_lock<std::shared_mutex> lock(t.mutex);
  auto it = t.by_graph.find(graph);
  return it == t.by_graph.end() ? nullptr : it->second.get();
}

std::vector<at::Tensor> assemble_backward_operands(const GraphRecord& record, at::TensorList grads,
                                                   at::TensorList inputs, at::TensorList outputs,
                                                   const std::vector<OutputMeta>& metas) {
  using Source = GraphRecord::Source;
  std::vector<at::Tensor> operands;
  operands.reserve(record.operands.size());
  for (const auto& operand : record.operands) {
    if (operand.source == Source::kInput) {
      operands.push_back(saved(inputs, operand.index, "inputs"));
      continue;
    }
    if (operand.source == Source::kOutput) {
      operands.push_back(saved(outputs, operand.index, "outputs"));
      continue;
    }
    const at::Tensor& grad = pick(grads, operand.index, "grad_outputs");
    const OutputMeta& meta = meta_of(metas, operand.index);
    at::Tensor given = grad.defined() ? grad : meta.zeros();
    if (operand.strides_of_output < 0) {
      operands.push_back(given.contiguous());
      continue;
    }
    const OutputMeta& like = meta_of(metas, operand.strides_of_output);
    operands.push_back(given.sym_strides().equals(like.strides)
                           ? given
                           : at::empty_strided_symint(like.sizes, like.strides, given.options()).copy_(given));
  }
  return operands;
}

}  // namespace torch_cudnn_handle
