// Puts the right CUDA context on the calling thread before cuDNN launches.
//
// A driver-level launch reads the calling thread's context stack, and threads torch
// runs work on may have none (an autograd backward worker starts with
// cuCtxGetCurrent() == nullptr) or another GPU's (a thread that last touched cuda:0
// now runs cuda:1 work). Which context is right:
//   * a real stream carries its own context, and that one wins;
//   * the default-stream handles 0 (null), 1 (legacy) and 2 (per-thread) name no
//     context; they resolve against whatever is current, so the work's device decides:
//     a context already current on that device is kept, otherwise the device's primary
//     context (retained once per device, for the life of the process) is bound.
// The rule is the frontend's `cudnn._device.ensure_current_context`; this is the
// same rule in C++, because it runs on every op call and on threads with no Python.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

namespace torch_cudnn_handle::context {

bool is_default_stream(cudaStream_t stream);

// The context a real (non-default) stream belongs to; nullptr for default handles.
CUcontext context_of_stream(cudaStream_t stream);

// The device ordinal a real stream lives on, or -1 for default handles.
int device_of_stream(cudaStream_t stream);

// Makes the right context current for work of `device` on `stream`.
// `stream_context` is context_of_stream(stream) when the caller cached it (the pool
// does, per handle), or nullptr to look it up. Costs one cuCtxGetCurrent when the
// right context is already current.
void ensure_current(int device, cudaStream_t stream, CUcontext stream_context);

// The context current on this thread (nullptr on a cold thread).
CUcontext current_context();

// The device of the context current on this thread, or -1 when there is none.
int current_context_device();

}  // namespace torch_cudnn_handle::context
