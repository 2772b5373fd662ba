// The native half of the CUDA kernels, for the Python path to hand a call back to once
// the build it just did registered a native plan (a graph's first call then runs on the
// same plan as every later one, so cuDNN's first-execution work happens once, not
// twice), and for the autograd node to run a declared backward without Python.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "op/graph_record.h"

namespace torch_cudnn_handle {

// The call on the native plan matching (graph, inputs), or nullopt when there is none.
std::optional<std::vector<at::Tensor>> run_native(int64_t graph, at::TensorList inputs);

// Whether a native plan matching (graph, inputs, out) ran the call.
bool run_native_out(int64_t graph, at::TensorList inputs, at::TensorList out);

// execute_ on the native plan matching (graph, all_inputs) (the builder's order): the
// outputs not written in place, or nullopt when no plan serves the call.
std::optional<std::vector<at::Tensor>> run_native_in_place(int64_t graph, at::TensorList all_inputs);

// The gradients of one forward call, one per input (undefined where none), from its
// declared backward graph run on a native plan with `operands` (assembled by the
// node); nullopt when that is not possible here (no native plan for these operands
// yet, create_graph, a dispatch mode, wrapped tensors), and the Python registry runs
// the backward graph instead.
std::optional<std::vector<at::Tensor>> run_native_backward(const GraphRecord& record, at::TensorList operands,
                                                           int64_t num_inputs);

}  // namespace torch_cudnn_handle
