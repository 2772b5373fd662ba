// The parts of cudnn_fe.execute that stay in Python, called from the C++ kernels:
// the graph registry's build-and-execute path (for a call no native plan serves yet,
// or a plan the frontend must drive per call) and the user's backward (graph
// builders and backward functions are Python). Set once by torch_cudnn_handle.op.
#pragma once

#include <ATen/core/Tensor.h>
#include <pybind11/pybind11.h>

#include <vector>

namespace torch_cudnn_handle::python_kernels {

void set(pybind11::object execute, pybind11::object execute_out, pybind11::object backward);

std::vector<at::Tensor> execute(int64_t graph, at::TensorList inputs);
void execute_out(int64_t graph, at::TensorList inputs, at::TensorList out);
// One gradient per forward input; an undefined tensor where the input gets none.
std::vector<at::Tensor> backward(int64_t graph, at::TensorList grad_outputs, at::TensorList inputs,
                                 at::TensorList outputs);

}  // namespace torch_cudnn_handle::python_kernels
