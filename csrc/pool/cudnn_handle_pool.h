// The process's pool of cuDNN handles: one per (device, thread), from the libcudnn
// the frontend loaded, each remembering the stream it is set to.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "backend/cudnn_library.h"
#include "pool/device_thread_handle_pool.h"

namespace torch_cudnn_handle {

// One backend handle and what the pool knows about it. Created by the pool and owned
// by it for the life of the process (never freed, see device_thread_handle_pool.h).
// At any moment at most one thread holds it; only that thread reads or writes the
// plain fields, so they need no lock. The counter is read by pool_stats() from any
// thread, hence atomic.
struct PooledCudnnHandle {
  cudnnHandle_t backend_handle = nullptr;
  int device = -1;
  // The stream cuDNN has for this handle (cudnnCreate leaves it on the null stream),
  // and that stream's context, looked up once per stream change. The single source
  // of truth for the stream: the Python cudnn.Handle reads and records it here.
  cudaStream_t stream = nullptr;
  CUcontext stream_context = nullptr;
  std::atomic<uint64_t> set_stream_calls{0};
  // The Python cudnn.Handle wrapping this handle (a PyObject*), made on first request
  // and kept, with one strong reference that is never dropped, as long as the handle
  // (forever). Only touched with the GIL held.
  void* python_handle = nullptr;
  // State a consumer keeps per handle (the native path's workspaces and variant pack),
  // made by the holding thread on first use and owned by that consumer; it lives as
  // long as the handle and travels with it to the next thread that borrows it. Atomic:
  // another thread may look for it (the consumer guards the state itself).
  std::atomic<void*> consumer_state{nullptr};
};

// This thread's handle for `device`, borrowed on first use, with cuDNN's stream set
// to `stream` (cudnnSetStream only when it differs from the handle's last one). The
// caller makes the right context current for the work (context::ContextGuard with
// the handle's stream_context). Throws when this thread has no handle for `device`
// yet and `stream` is capturing a CUDA graph, in a process forked after handles
// existed, and for a stream on another device.
// `stream_is_on_device`: the caller knows the stream lives on `device` (torch's current
// stream there, or a torch.cuda.Stream whose device was checked); otherwise the driver
// is asked once per stream change.
PooledCudnnHandle* handle_for_call(int device, cudaStream_t stream, bool stream_is_on_device = true);

// This thread's handle for `device` if it already has one, else nullptr. Never creates.
PooledCudnnHandle* find_thread_handle(int device);

// Records that someone else (the frontend's cudnn.set_stream) has already set the
// backend handle's stream to `stream`.
void record_stream(PooledCudnnHandle* handle, cudaStream_t stream);

// `fn(handle)` for every handle the pool ever created, held by a thread or not (under
// the pool's lock). `fn` must not call back into the pool.
void for_each_pooled_handle(const std::function<void(PooledCudnnHandle*)>& fn);

std::map<int, DeviceHandleCounts> pool_counts();
uint64_t total_set_stream_calls();

}  // namespace torch_cudnn_handle
