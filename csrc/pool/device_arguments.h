// Device and stream arguments from Python, with errors that name the fix.
#pragma once

#include <torch/extension.h>

#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace torch_cudnn_handle {

// None | int | "cuda[:N]" | torch.device  ->  a valid ordinal (None: torch's current device).
int parse_device(pybind11::handle device);

#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
struct ParsedStream {
  cudaStream_t stream;
  bool is_on_device;  // known to live on the requested device without asking the driver
};

// None | int | torch.cuda.Stream-like  ->  a raw stream for `device` (None: torch's current).
ParsedStream parse_stream(pybind11::handle stream, int device);
#endif

}  // namespace torch_cudnn_handle
