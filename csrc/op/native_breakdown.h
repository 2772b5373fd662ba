// Where the host time of one native call goes: each step of NativePlan::execute timed
// alone, in C++, so bench/ can compare the extension's own work with what
// cudnnBackendExecute costs by itself. A measurement seam for bench/profile_native.py,
// not part of the op.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace torch_cudnn_handle {

// Host microseconds per call of each step, averaged over `calls`, for the native plan
// of `graph` matching `inputs`, writing `outputs`. Throws if there is no such plan.
std::map<std::string, double> native_breakdown(int64_t graph, at::TensorList inputs, at::TensorList outputs,
                                               int64_t calls);

}  // namespace torch_cudnn_handle
