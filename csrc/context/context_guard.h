// The right CUDA context for cuDNN's launches, and the caller's context put back after.
//
// Note [The context rule]
// A driver-level launch reads the calling thread's context stack, and threads torch
// runs work on may have none (an autograd backward worker starts with
// cuCtxGetCurrent() == nullptr) or another GPU's. Which context is right:
//   * a real stream carries its own context, and that one wins;
//   * the default-stream handles 0 (null), 1 (legacy) and 2 (per-thread) name no
//     context; the work's device decides: a context already current on that device is
//     kept, otherwise the device's primary context (retained once per device, for the
//     life of the process) is bound.
// This is the rule of the frontend's `cudnn._device.ensure_current_context`, in C++
// because it runs on every op call and on threads with no Python.
//
// Entry points use ContextGuard, which restores the caller's context on the way out,
// as a c10 device guard restores the device: the runtime's current device follows the
// driver's current context, so a context left switched would move
// torch.cuda.current_device() under the caller. bind() is the one binder that leaves
// the context switched (bind_context(), for callers that launch through the driver).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

namespace torch_cudnn_handle::context {

bool is_default_stream(cudaStream_t stream);

// The context a real (non-default) stream belongs to; nullptr for default handles.
CUcontext context_of_stream(cudaStream_t stream);

// The device ordinal a real stream lives on, or -1 for default handles.
int device_of_stream(cudaStream_t stream);

// Makes the right context current for work of `device` on `stream` and leaves it so.
// `stream_context` is context_of_stream(stream) when the caller cached it (the pool
// does, per handle), or nullptr to look it up.
void bind(int device, cudaStream_t stream, CUcontext stream_context);

// bind() for the guard's lifetime, then the caller's context again. A thread that had
// no context at all keeps the new one: there is nothing to restore, and a cold thread
// (autograd's worker) would otherwise pay a bind on every call. Costs one
// cuCtxGetCurrent when the right context is already current.
class ContextGuard {
 public:
  ContextGuard(int device, cudaStream_t stream, CUcontext stream_context);
  ~ContextGuard();
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;

 private:
  CUcontext previous_ = nullptr;
  bool restore_ = false;
};

// The context current on this thread (nullptr on a cold thread).
CUcontext current_context();

// The device of the context current on this thread, or -1 when there is none.
int current_context_device();

}  // namespace torch_cudnn_handle::context
