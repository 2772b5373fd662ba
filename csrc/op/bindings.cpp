// The op's Python face: the Python kernels' registration and the eager entry points.
#include <torch/extension.h>

#include <optional>
#include <tuple>

#include "bindings.h"
#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
#include "op/cuda_kernels.h"
#endif
#include "op/graph_record.h"
#include "op/execute_op.h"
#include "op/python_kernels.h"

namespace py = pybind11;

namespace torch_cudnn_handle {

void bind_op(py::module& m) {
  using ReadTuple = std::tuple<int, int64_t, std::vector<int64_t>>;  // source, index, for_grads
  using StepOperand = std::tuple<int, int64_t, int64_t, int64_t, bool>;  // source, index, strides_of_output, step_output, summed
  m.def("_set_python_kernels", &python_kernels::set, py::arg("execute"), py::arg("execute_out"),
        py::arg("execute_in_place"), py::arg("backward"), py::arg("run_backward_graph"));
  m.def(
      "declare_graph",
      [](int64_t graph, bool has_backward, int64_t backward_graph,
         const std::vector<std::tuple<int, int64_t, int64_t>>& operands,
         const std::optional<std::vector<ReadTuple>>& reads,
         const std::optional<std::vector<int64_t>>& differentiable_outputs, bool materialize_grads,
         const std::vector<std::tuple<int64_t, std::vector<StepOperand>, std::vector<int64_t>>>& steps,
         const std::vector<std::optional<StepOperand>>& grads,
         const std::vector<std::pair<int64_t, int64_t>>& in_place) {
        using Source = GraphRecord::Source;
        auto source_of = [](int source) {
          TORCH_CHECK(source >= 0 && source <= 3, "torch_cudnn_handle: unknown backward operand source ", source);
          return static_cast<Source>(source);
        };
        auto operand_of = [&](const StepOperand& operand) {
          const auto& [source, index, strides_of_output, step_output, summed] = operand;
          return GraphRecord::Operand{source_of(source), index, strides_of_output, step_output, summed};
        };
        GraphRecord record;
        record.has_backward = has_backward;
        record.backward_graph = backward_graph;
        for (const auto& [source, index, strides_of_output] : operands) {
          record.operands.push_back({source_of(source), index, strides_of_output});
        }
        record.reads_everything = !reads.has_value();
        for (const auto& [source, index, for_grads] : reads.value_or(std::vector<ReadTuple>{})) {
          TORCH_CHECK(source_of(source) != Source::kGrad, "torch_cudnn_handle: a backward reads inputs and outputs");
          record.reads.push_back(GraphRecord::Read{source_of(source), index, for_grads});
        }
        record.all_outputs_differentiable = !differentiable_outputs.has_value();
        record.differentiable_outputs = differentiable_outputs.value_or(std::vector<int64_t>{});
        record.materialize_grads = materialize_grads;
        for (const auto& [step_graph, step_operands, for_grads] : steps) {
          GraphRecord::Step step{step_graph, {}, for_grads};
          for (const auto& operand : step_operands) step.operands.push_back(operand_of(operand));
          record.steps.push_back(std::move(step));
        }
        for (const auto& grad : grads) {
          record.grads.push_back(grad ? std::optional<GraphRecord::Operand>(operand_of(*grad)) : std::nullopt);
        }
        for (const auto& [output, input] : in_place) {
          TORCH_CHECK(record.in_place.empty() || record.in_place.back().input < input,
                      "torch_cudnn_handle: in-place writes must be sorted by input, each input once");
          record.in_place.push_back({output, input});
        }
        declare_graph(graph, std::move(record));
      },
      py::arg("graph"), py::arg("has_backward"), py::arg("backward_graph"), py::arg("operands"), py::arg("reads"),
      py::arg("differentiable_outputs"), py::arg("materialize_grads"), py::arg("steps") = py::list(),
      py::arg("grads") = py::list(), py::arg("in_place") = py::list(),
      "Declare graph's record (op/graph_record.h): its backward (a declared backward graph and its operands as "
      "(source: 0 grad, 1 input, 2 output; index; strides_of_output or -1), or -1 and none for a Python backward), "
      "what the backward reads ((source, index, for_grads), or None for everything), which outputs are "
      "differentiable (None: all), whether a Python backward gets zeros for a missing gradient, and a backward of "
      "several graphs: steps as (graph, operands, for_grads), operands as (source: 0-2 as above, 3 an earlier step's "
      "output; index; strides_of_output; step_output; summed), each input's gradient as such an operand or None, "
      "and which outputs the graph writes into which inputs ((output, input), sorted by input).");
  m.def(
      "in_place_writes",
      [](int64_t graph) {
        std::vector<std::pair<int64_t, int64_t>> out;
        if (const GraphRecord* record = graph_record(graph)) {
          for (const auto& entry : record->in_place) out.emplace_back(entry.output, entry.input);
        }
        return out;
      },
      py::arg("graph"), "The graph's in-place writes as (output, input) pairs, sorted by input (empty: none).");
  m.def(
      "split_in_place",
      [](int64_t graph, const std::vector<at::Tensor>& inputs) { return in_place_record(graph).split_inputs(inputs); },
      py::arg("graph"), py::arg("inputs"),
      "(inputs the graph does not write, inputs it writes): execute_'s two lists from the builder's inputs.");
  m.def(
      "merge_in_place",
      [](int64_t graph, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& written) {
        return in_place_record(graph).merge_inputs(inputs, written);
      },
      py::arg("graph"), py::arg("inputs"), py::arg("written"), "The builder's inputs from execute_'s two lists.");
  m.def(
      "alert_not_deterministic", [](const std::string& caller) { at::globalContext().alertNotDeterministic(caller); },
      py::arg("caller"),
      "torch's rule for an op without a deterministic implementation under torch.use_deterministic_algorithms(True): "
      "raises, or warns with warn_only=True.");
  // The eager entry points: straight into the dispatcher (autograd, the CUDA kernel)
  // without torch.ops' generic argument parsing. Same op, same semantics.
  m.def(
      "execute", [](int64_t graph, std::vector<at::Tensor> inputs) { return execute_op().call(graph, inputs); },
      py::arg("graph"), py::arg("inputs"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "execute_out",
      [](int64_t graph, std::vector<at::Tensor> inputs, std::vector<at::Tensor> out) {
        execute_out_op().call(graph, inputs, out);
      },
      py::arg("graph"), py::arg("inputs"), py::kw_only(), py::arg("out"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "execute_in_place",
      [](int64_t graph, std::vector<at::Tensor> inputs) {
        auto [others, written] = in_place_record(graph).split_inputs(inputs);
        return execute_in_place_op().call(graph, others, written);
      },
      py::arg("graph"), py::arg("inputs"), py::call_guard<py::gil_scoped_release>(),
      "torch.ops.cudnn_fe.execute_ from the builder's inputs (split by the graph's record), through the dispatcher.");
#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
  m.def(
      "run_native", [](int64_t graph, std::vector<at::Tensor> inputs) { return run_native(graph, inputs); },
      py::arg("graph"), py::arg("inputs"), py::call_guard<py::gil_scoped_release>(),
      "The call on the native plan of (graph, inputs), or None when there is none: the Python path hands a "
      "first call back to the plan it just registered.");
  m.def(
      "run_native_in_place",
      [](int64_t graph, std::vector<at::Tensor> inputs) { return run_native_in_place(graph, inputs); },
      py::arg("graph"), py::arg("inputs"), py::call_guard<py::gil_scoped_release>(),
      "execute_ on the native plan of (graph, inputs in the builder's order): the outputs not written in place, or "
      "None when no plan serves the call.");
  m.def(
      "run_native_out",
      [](int64_t graph, std::vector<at::Tensor> inputs, std::vector<at::Tensor> out) {
        return run_native_out(graph, inputs, out);
      },
      py::arg("graph"), py::arg("inputs"), py::arg("out"), py::call_guard<py::gil_scoped_release>(),
      "Whether a native plan of (graph, inputs, out) ran the call.");
#endif
}

}  // namespace torch_cudnn_handle
