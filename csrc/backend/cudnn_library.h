// The few cuDNN C entry points this extension calls, taken from the libcudnn that the
// cuDNN frontend (`import cudnn`) already loaded into the process.
//
// Why it is safe: a pooled handle must be valid for the frontend's own execute, so it
// must come from the same libcudnn instance. The frontend dlopen()s libcudnn.so.9 by
// path before anything here runs. We find the loaded copy by walking the process's
// link map (dl_iterate_phdr), insist that exactly one copy is loaded, and re-open that
// very file with RTLD_NOLOAD, which returns the already-loaded instance and never
// loads another. No symbol is resolved by global lookup, so neither torch's own cuDNN
// linkage nor load order can hand us a different instance; two copies is an error.
#pragma once

#include <cstddef>
#include <string>

namespace torch_cudnn_handle::backend {

using CudnnHandle = void*;  // cudnnHandle_t
using CudnnStatus = int;    // cudnnStatus_t; 0 = CUDNN_STATUS_SUCCESS

struct CudnnLibrary {
  std::string path;  // the loaded file
  CudnnStatus (*create)(CudnnHandle* handle) = nullptr;                // cudnnCreate
  CudnnStatus (*set_stream)(CudnnHandle handle, void* stream) = nullptr;  // cudnnSetStream
  const char* (*error_string)(CudnnStatus status) = nullptr;           // cudnnGetErrorString
  size_t (*version)() = nullptr;                                       // cudnnGetVersion
};

// Resolved once, on first use; throws a clear error when libcudnn is not loaded or
// more than one copy is.
const CudnnLibrary& cudnn_library();

// Throws "torch_cudnn_handle: <what> failed: <cuDNN's message>" unless status is 0.
void check_cudnn(CudnnStatus status, const char* what);

}  // namespace torch_cudnn_handle::backend
