// The pieces of torch_cudnn_handle._C, each bound beside what it binds.
#pragma once

#include <torch/extension.h>

namespace torch_cudnn_handle {

void bind_device_arguments(pybind11::module& m);  // pool/device_arguments.cpp
void bind_op(pybind11::module& m);                // op/bindings.cpp
#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
void bind_pool(pybind11::module& m);    // pool/bindings.cpp
void bind_native(pybind11::module& m);  // native/bindings.cpp
#endif

}  // namespace torch_cudnn_handle
