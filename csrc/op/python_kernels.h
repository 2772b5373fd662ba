// The parts of cudnn_fe.execute that stay in Python, called from the C++ kernels:
// the graph registry's build-and-execute path (for a call no native plan serves yet,
// or a plan the frontend must drive per call), the user's backward (graph builders
// and backward functions are Python), and a declared backward graph no native plan
// serves yet (its operands already assembled in C++). Set once by torch_cudnn_handle.op.
#pragma once

#include <ATen/core/Tensor.h>
#include <pybind11/pybind11.h>

#include <vector>

namespace torch_cudnn_handle::python_kernels {

void set(pybind11::object execute, pybind11::object execute_out, pybind11::object execute_in_place,
         pybind11::object backward, pybind11::object run_backward_graph);

std::vector<at::Tensor> execute(int64_t graph, at::TensorList inputs);
void execute_out(int64_t graph, at::TensorList inputs, at::TensorList out);
// execute_ with the graph's inputs in the builder's order (the record merged them);
// returns the outputs not written in place.
std::vector<at::Tensor> execute_in_place(int64_t graph, at::TensorList all_inputs);
// One gradient per forward input; an undefined tensor where the input gets none.
std::vector<at::Tensor> backward(int64_t graph, at::TensorList grad_outputs, at::TensorList inputs,
                                 at::TensorList outputs);
// The gradients from `graph`'s declared backward graph run on `operands`, one per
// forward input (undefined where none).
std::vector<at::Tensor> run_backward_graph(int64_t graph, at::TensorList operands, size_t num_inputs);

}  // namespace torch_cudnn_handle::python_kernels
