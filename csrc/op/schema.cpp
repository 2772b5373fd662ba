// The cudnn_fe operator library: schemas only. Kernels are registered by the Python
// package (torch_cudnn_handle/op.py) against these C++-defined schemas, which costs
// a fraction of what @torch.library.custom_op does per call.
//
//   execute(graph, inputs) -> outputs      functional: allocates outputs and workspace
//                                          through torch's caching allocator on the
//                                          current stream; differentiable; capturable.
//   execute.out(graph, inputs, *, out)     writes into caller-owned outputs, none of
//                                          which may overlap an input (the schema
//                                          says inputs are only read).
//   execute_(graph, inputs, written)       a graph registered with in_place={output:
//                                          input}: those outputs are written into
//                                          `written` (the inputs they belong to, by
//                                          input index; `inputs` holds the rest), which
//                                          the schema declares mutated; returns the
//                                          other outputs. Functionalized (torch.compile)
//                                          into execute + a copy back into `written`.
//
// `graph` is an id from torch_cudnn_handle's graph registry (an int on purpose: it
// works with opcheck, torch.compile, export and CUDA graphs on every torch version).
// needs_exact_strides: a graph is built for exact strides, so Inductor must not
// restride the inputs it hands us.
#include <torch/library.h>

TORCH_LIBRARY(cudnn_fe, m) {
  const std::vector<at::Tag> tags = {at::Tag::needs_exact_strides, at::Tag::pt2_compliant_tag};
  m.def("execute(int graph, Tensor[] inputs) -> Tensor[]", tags);
  m.def("execute.out(int graph, Tensor[] inputs, *, Tensor(a!)[] out) -> ()", tags);
  m.def("execute_(int graph, Tensor[] inputs, Tensor(a!)[] written) -> Tensor[]", tags);
  m.set_python_module("torch_cudnn_handle.op");
}
