#include "op/python_kernels.h"

#include <torch/csrc/utils/pybind.h>

#include <optional>

namespace torch_cudnn_handle::python_kernels {
namespace {

namespace py = pybind11;

// Set at import, held for the life of the process and never released: they may be
// called from autograd's threads until the very end.
struct Callbacks {
  py::object execute, execute_out, execute_in_place, backward, run_backward_graph;
};
Callbacks* callbacks = nullptr;

const Callbacks& get() {
  TORCH_CHECK(callbacks != nullptr, "torch_cudnn_handle: import torch_cudnn_handle before calling cudnn_fe ops");
  return *callbacks;
}

py::list to_list(at::TensorList tensors) {
  py::list out;
  for (const auto& t : tensors) out.append(t.defined() ? py::cast(t) : py::none());
  return out;
}

std::vector<at::Tensor> gradients(const py::object& grads) {
  std::vector<at::Tensor> out;
  for (const auto& grad : grads) {
    out.push_back(grad.is_none() ? at::Tensor() : grad.cast<at::Tensor>());
  }
  return out;
}

}  // namespace

void set(py::object execute, py::object execute_out, py::object execute_in_place, py::object backward,
         py::object run_backward_graph) {
  delete callbacks;
  callbacks = new Callbacks{std::move(execute), std::move(execute_out), std::move(execute_in_place), std::move(backward),
                            std::move(run_backward_graph)};
}

std::vector<at::Tensor> execute(int64_t graph, at::TensorList inputs) {
  py::gil_scoped_acquire gil;
  return get().execute(graph, to_list(inputs)).cast<std::vector<at::Tensor>>();
}

void execute_out(int64_t graph, at::TensorList inputs, at::TensorList out) {
  py::gil_scoped_acquire gil;
  get().execute_out(graph, to_list(inputs), py::arg("out") = to_list(out));
}

std::vector<at::Tensor> execute_in_place(int64_t graph, at::TensorList all_inputs) {
  py::gil_scoped_acquire gil;
  return get().execute_in_place(graph, to_list(all_inputs)).cast<std::vector<at::Tensor>>();
}

std::vector<at::Tensor> backward(int64_t graph, at::TensorList grad_outputs, at::TensorList inputs,
                                 at::TensorList outputs) {
  py::gil_scoped_acquire gil;
  return gradients(get().backward(graph, to_list(grad_outputs), to_list(inputs), to_list(outputs)));
}

std::vector<at::Tensor> run_backward_graph(int64_t graph, at::TensorList operands, size_t num_inputs) {
  py::gil_scoped_acquire gil;
  return gradients(get().run_backward_graph(graph, to_list(operands), num_inputs));
}

}  // namespace torch_cudnn_handle::python_kernels
