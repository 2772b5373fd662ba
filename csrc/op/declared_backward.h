// Backwards declared as data: which gradients, inputs and outputs of a forward call a
// backward graph takes, in order (register_graph(..., backward_operands=[BackwardOperand
// ...])). The op's autograd node assembles them in C++, so a backward graph that a
// native plan serves runs with no Python at all (cuda_kernels.h: run_native_backward);
// any other backward goes to the Python registry, which reads the same declaration.
//
// Lifetime: a declaration lives for the process, like the graph definition it belongs
// to (ids are never reused), so the pointers handed out stay valid.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace torch_cudnn_handle {

struct DeclaredBackward {
  enum class Source : int8_t { kGrad = 0, kInput = 1, kOutput = 2 };
  struct Operand {
    Source source;
    int64_t index;
    int64_t strides_of_output;  // a gradient given that forward output's strides; -1: dense
  };
  int64_t backward_graph;
  std::vector<Operand> operands;
};

void declare_backward(int64_t forward_graph, DeclaredBackward declared);

// The declaration of `forward_graph`'s backward, or nullptr.
const DeclaredBackward* declared_backward(int64_t forward_graph);

// The backward graph's operands for one call, exactly as the Python registry assembles
// them: a missing gradient is zeros like its output; a gradient is then made
// contiguous, or given the strides of the output `strides_of_output` names.
std::vector<at::Tensor> assemble_backward_operands(const DeclaredBackward& declared, at::TensorList grads,
                                                   at::TensorList inputs, at::TensorList outputs);

}  // namespace torch_cudnn_handle
