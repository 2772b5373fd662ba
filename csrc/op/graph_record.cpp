#include "op/graph_record.h"

#include "op/execute_op.h"

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
  static auto* instance = new Table();  // leaked on purpose (Note [Leaked on purpose])
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

const at::Tensor& step_result(const std::vector<std::vector<at::Tensor>>& results, const GraphRecord::Operand& operand) {
  TORCH_CHECK(operand.index >= 0 && operand.index < static_cast<int64_t>(results.size()) &&
                  operand.step_output >= 0 && operand.step_output < static_cast<int64_t>(results[operand.index].size()),
              "torch_cudnn_handle: a backward step reads output ", operand.step_output, " of step ", operand.index,
              ", which did not run or has no such output: declare steps in order, and give a step the for_grads of "
              "every step that reads it");
  return results[operand.index][operand.step_output];
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

std::vector<at::Tensor> GraphRecord::merge_inputs(at::TensorList inputs, at::TensorList written) const {
  TORCH_CHECK_VALUE(written.size() == in_place.size(), "cudnn_fe.execute_: the graph writes ", in_place.size(),
              " of its inputs in place, got ", written.size(), " written tensors; pass the inputs it writes (by input "
              "index) as `written` and the others as `inputs`, or call torch_cudnn_handle.execute_(graph, all_inputs)");
  std::vector<at::Tensor> all;
  all.reserve(inputs.size() + written.size());
  size_t next_input = 0;
  for (size_t w = 0; w < in_place.size(); ++w) {
    const auto position = static_cast<size_t>(in_place[w].input);
    while (all.size() < position && next_input < inputs.size()) all.push_back(inputs[next_input++]);
    TORCH_CHECK_VALUE(all.size() == position, "cudnn_fe.execute_: the graph writes its input ", position, ", but only ",
                inputs.size() + written.size(), " tensors were given");
    all.push_back(written[w]);
  }
  while (next_input < inputs.size()) all.push_back(inputs[next_input++]);
  return all;
}

std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> GraphRecord::split_inputs(at::TensorList all) const {
  std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> split;
  size_t w = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const bool writes = w < in_place.size() && in_place[w].input == static_cast<int64_t>(i);
    (writes ? split.second : split.first).push_back(all[i]);
    w += writes;
  }
  TORCH_CHECK_VALUE(w == in_place.size(), "cudnn_fe.execute_: the graph writes its input ", w < in_place.size() ? in_place[w].input : 0,
              " in place, but only ", all.size(), " inputs were given");
  return split;
}

const GraphRecord::InPlace* GraphRecord::writes_output(int64_t output) const {
  for (const auto& entry : in_place) {
    if (entry.output == output) return &entry;
  }
  return nullptr;
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

const GraphRecord& in_place_record(int64_t graph) {
  const GraphRecord* record = graph_record(graph);
  TORCH_CHECK_VALUE(record != nullptr && !record->in_place.empty(), "cudnn_fe.execute_: graph ", graph, " writes none of its "
              "inputs in place; register it with register_graph(builder, in_place={output_index: input_index}), or call "
              "torch.ops.cudnn_fe.execute (new outputs) or execute.out (into separate tensors)");
  return *record;
}

std::vector<at::Tensor> assemble_backward_operands(const GraphRecord& record, at::TensorList grads,
                                                   at::TensorList inputs, at::TensorList outputs,
                                                   const std::vector<OutputMeta>& metas) {
  return assemble_step_operands(record.operands, grads, inputs, outputs, metas, {});
}

std::vector<at::Tensor> assemble_step_operands(const std::vector<GraphRecord::Operand>& declared, at::TensorList grads,
                                               at::TensorList inputs, at::TensorList outputs,
                                               const std::vector<OutputMeta>& metas,
                                               const std::vector<std::vector<at::Tensor>>& step_results) {
  using Source = GraphRecord::Source;
  std::vector<at::Tensor> operands;
  operands.reserve(declared.size());
  for (const auto& operand : declared) {
    if (operand.source == Source::kInput) {
      operands.push_back(saved(inputs, operand.index, "inputs"));
      continue;
    }
    if (operand.source == Source::kOutput) {
      operands.push_back(saved(outputs, operand.index, "outputs"));
      continue;
    }
    if (operand.source == Source::kStep) {
      operands.push_back(step_result(step_results, operand));
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

std::vector<at::Tensor> run_backward_steps(const GraphRecord& record, at::TensorList grads, at::TensorList inputs,
                                           at::TensorList outputs, const std::vector<OutputMeta>& metas,
                                           const std::vector<std::vector<c10::SymInt>>& input_sizes,
                                           const std::vector<bool>& needs_grad) {
  auto wanted = [&](const std::vector<int64_t>& for_grads) {
    if (for_grads.empty()) return true;
    for (const auto input : for_grads) {
      if (input < static_cast<int64_t>(needs_grad.size()) && needs_grad[input]) return true;
    }
    return false;
  };
  std::vector<std::vector<at::Tensor>> results(record.steps.size());
  for (size_t s = 0; s < record.steps.size(); ++s) {
    const auto& step = record.steps[s];
    if (!wanted(step.for_grads)) continue;
    // Through the dispatcher: the CUDA kernel runs a native plan with no Python, any
    // other call takes the Python path, and create_graph records the op again.
    results[s] = execute_op().call(step.graph, assemble_step_operands(step.operands, grads, inputs, outputs, metas, results));
  }
  std::vector<at::Tensor> grad_inputs(inputs.size());
  for (size_t i = 0; i < grad_inputs.size() && i < record.grads.size(); ++i) {
    if (!record.grads[i] || i >= needs_grad.size() || !needs_grad[i]) continue;
    const auto& from = *record.grads[i];
    at::Tensor grad;
    if (from.source == GraphRecord::Source::kStep) {
      grad = step_result(results, from);
    } else {
      const at::Tensor& given = pick(grads, from.index, "grad_outputs");
      grad = given.defined() ? given : meta_of(metas, from.index).zeros();
    }
    grad_inputs[i] = from.summed ? grad.sum_to_size_symint(input_sizes[i]) : grad;
  }
  return grad_inputs;
}

}  // namespace torch_cudnn_handle
