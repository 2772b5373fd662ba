// The op's Python face: the Python kernels' registration and the eager entry points.
#include <torch/extension.h>

#include "bindings.h"
#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
#include "op/cuda_kernels.h"
#endif
#include "op/execute_op.h"
#include "op/python_kernels.h"

namespace py = pybind11;

namespace torch_cudnn_handle {

void bind_op(py::module& m) {
  m.def("_set_python_kernels", &python_kernels::set, py::arg("execute"), py::arg("execute_out"), py::arg("backward"));
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
