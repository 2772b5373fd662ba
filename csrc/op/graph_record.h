// What the op's autograd node needs to know about one graph id, in one record
// (register_graph declares it once, before the id is returned):
//   * whether the graph has a backward, and if it is a declared one (a single backward
//     graph whose operands are named as data: BackwardOperand), that graph and its
//     operands, which the node assembles in C++ and, when a native plan serves them,
//     runs with no Python (cuda_kernels.h: run_native_backward); or declared steps (several
//     backward graphs, each through the op, so natively where native plans serve them);
//   * which forward inputs and outputs the backward reads: the node saves those, and
//     only when an input whose gradient needs them requires grad (Note [What a node
//     saves] in autograd_kernels.cpp);
//   * which outputs are differentiable: the node marks the others non-differentiable,
//     so no gradient can arrive for an output the backward does not take;
//   * whether a backward function gets zeros (or None) for an output without gradient;
//   * which outputs the graph writes into which of its inputs (register_graph's
//     in_place): cudnn_fe.execute_ takes those inputs as mutable arguments, apart from
//     the others, and this record is the one place that says how the two lists merge
//     back into the graph's inputs and how its outputs split.
// The native plans that serve a graph are in native::NativePlanTable, by the same id.
//
// Lifetime: a record lives for the process, like the graph definition it belongs to
// (ids are never reused), so the pointers handed out stay valid on any thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace torch_cudnn_handle {

struct GraphRecord {
  enum class Source : int8_t { kGrad = 0, kInput = 1, kOutput = 2, kStep = 3 };
  // One operand of a declared backward graph.
  struct Operand {
    Source source;
    int64_t index;  // kStep: the earlier step
    int64_t strides_of_output;  // a gradient given that forward output's strides; -1: dense
    int64_t step_output = 0;  // kStep: which output of that step
    bool summed = false;  // as a gradient of input i (Record::grads): summed to input i's shape (a bias)
  };
  // One graph of a declared backward of several (cuDNN fuses one matmul per graph): its
  // operands may be outputs of earlier steps; it runs only when one of the inputs in
  // `for_grads` needs a gradient (empty: always).
  struct Step {
    int64_t graph;
    std::vector<Operand> operands;
    std::vector<int64_t> for_grads;
  };
  // A forward input or output the backward reads. Saved only when one of the inputs
  // in `for_grads` requires grad (empty: whenever the node is recorded).
  struct Read {
    Source source;  // kInput or kOutput
    int64_t index;
    std::vector<int64_t> for_grads;
  };

  bool has_backward = false;
  int64_t backward_graph = -1;  // the declared backward graph, or -1 (a Python backward)
  std::vector<Operand> operands;  // the declared backward graph's operands
  bool reads_everything = true;  // else exactly `reads`
  std::vector<Read> reads;
  bool all_outputs_differentiable = true;  // else exactly `differentiable_outputs`
  std::vector<int64_t> differentiable_outputs;
  bool materialize_grads = true;  // a Python backward gets zeros (not None) for an output without gradient
  // A declared backward of several graphs, run in order by the node (through the op, so
  // natively where native plans serve them), and where each input's gradient comes
  // from (kGrad or kStep; source -1 cast: none). Empty: not a stepped backward.
  std::vector<Step> steps;
  std::vector<std::optional<Operand>> grads;
  // Output `output` is written into input `input`; sorted by input (execute_'s
  // `written` list holds those inputs in that order), each output and input at most once.
  struct InPlace {
    int64_t output;
    int64_t input;
  };
  std::vector<InPlace> in_place;

  bool declared() const { return backward_graph >= 0; }
  bool stepped() const { return !steps.empty(); }
  bool reads_input(int64_t index, const std::vector<bool>& needs_grad) const;
  bool reads_output(int64_t index, const std::vector<bool>& needs_grad) const;
  bool is_differentiable(int64_t output) const;

  // The graph's inputs, in the builder's order, from execute_'s two lists: `inputs`
  // (those it does not write) and `written` (those it does, by input index).
  std::vector<at::Tensor> merge_inputs(at::TensorList inputs, at::TensorList written) const;
  // The reverse: (inputs it does not write, inputs it writes), for the eager entry.
  std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> split_inputs(at::TensorList all) const;
  // The in-place entry naming `output`, or nullptr.
  const InPlace* writes_output(int64_t output) const;
};

// Sizes, strides and options of a forward output: what a gradient that never arrived
// is zero-filled like, and what a gradient is restrided to, when the output itself is
// not saved. Symbolic under torch.compile(dynamic=True) (a trace must not specialize).
struct OutputMeta {
  std::vector<c10::SymInt> sizes;
  std::vector<c10::SymInt> strides;
  at::TensorOptions options;
  at::Tensor zeros() const;
};

void declare_graph(int64_t graph, GraphRecord record);

// The record of `graph`, or nullptr (an id without a backward may have none).
const GraphRecord* graph_record(int64_t graph);

// The record of `graph`, which must write some of its inputs in place (execute_'s
// kernels); a clear error naming the fix otherwise.
const GraphRecord& in_place_record(int64_t graph);

// The declared backward graph's operands for one call: a missing gradient is zeros
// like its output; a gradient is then made contiguous, or given the strides of the
// output `strides_of_output` names. `inputs`/`outputs` hold what the node saved
// (undefined elsewhere); `metas` describes every output.
std::vector<at::Tensor> assemble_backward_operands(const GraphRecord& record, at::TensorList grads,
                                                   at::TensorList inputs, at::TensorList outputs,
                                                   const std::vector<OutputMeta>& metas);

// One step's operands: as above, plus kStep operands from `step_results` (what earlier
// steps returned; a step that did not run has none, which is an error to read).
std::vector<at::Tensor> assemble_step_operands(const std::vector<GraphRecord::Operand>& declared, at::TensorList grads,
                                               at::TensorList inputs, at::TensorList outputs,
                                               const std::vector<OutputMeta>& metas,
                                               const std::vector<std::vector<at::Tensor>>& step_results);

// Runs a stepped backward (GraphRecord::steps) through the op: one gradient per forward
// input, undefined where `needs_grad` is false. `input_sizes`: every forward input's
// sizes (what a summed gradient is reduced to).
std::vector<at::Tensor> run_backward_steps(const GraphRecord& record, at::TensorList grads, at::TensorList inputs,
                                           at::TensorList outputs, const std::vector<OutputMeta>& metas,
                                           const std::vector<std::vector<c10::SymInt>>& input_sizes,
                                           const std::vector<bool>& needs_grad);

}  // namespace torch_cudnn_handle
