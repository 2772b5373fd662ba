// The op's Python face: the Python kernels' registration and the eager entry points.
#include <torch/extension.h>

#include <optional>
#include <tuple>

#include "bindings.h"
#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
#include "op/cuda_kernels.h"
#endif
#include "op/declared_backward.h"
#include "op/execute_op.h"
#include "op/python_kernels.h"

namespace py = pybind11;

namespace torch_cudnn_handle {

void bind_op(py::module& m) {
  m.def("_set_python_kernels", &python_kernels::set, py::arg("execute"), py::arg("execute_out"), py::arg("backward"));
  m.def(
      "declare_backward",
      [](int64_t forward_graph, int64_t backward_graph, const std::vector<std::tuple<int, int64_t, int64_t>>& operands) {
        DeclaredBackward declared{backward_graph, {}};
        for (const auto& [source, index, strides_of_output] : operands) {
          TORCH_CHECK(source >= 0 && source <= 2, "torch_cudnn_handle: unknown backward operand source ", source);
          declared.operands.push_back({static_cast<DeclaredBackward::Source>(source), index, strides_of_output});
        }
        declare_backward(forward_graph, std::move(declared));
      },
      py::arg("forward_graph"), py::arg("backward_graph"), py::arg("operands"),
      "Declare forward_graph's backward: backward_graph's operands as (source: 0 grad, 1 input, 2 output; index; "
      "strides_of_output or -1).");
  m.def(
      "assemble_backward_operands",
      [](int64_t forward_graph, const std::vector<std::optional<at::Tensor>>& grads, std::vector<at::Tensor> inputs,
         std::vector<at::Tensor> outputs) {
        const auto* declared = declared_backward(forward_graph);
        TORCH_CHECK(declared != nullptr, "torch_cudnn_handle: graph ", forward_graph, " has no declared backward");
        std::vector<at::Tensor> given;
        for (const auto& grad : grads) given.push_back(grad.value_or(at::Tensor()));
        return assemble_backward_operands(*declared, given, inputs, outputs);
      },
      py::arg("forward_graph"), py::arg("grad_outputs"), py::arg("inputs"), py::arg("outputs"),
      "The declared backward graph's operands for one call (what the autograd node assembles in C++).");
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
#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
  m.def(
      "run_native", [](int64_t graph, std::vector<at::Tensor> inputs) { return run_native(graph, inputs); },
      py::arg("graph"), py::arg("inputs"), py::call_guard<py::gil_scoped_release>(),
      "The call on the native plan of (graph, inputs), or None when there is none: the Python path hands a "
      "first call back to the plan it just registered.");
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
