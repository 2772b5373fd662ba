// The process's pool of cuDNN handles: one per (device, thread), from the libcudnn
// the frontend loaded, each remembering the stream it is set to.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <vector>

#include <c10/core/Allocator.h>

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

  // Scratch of the native execute path (op/native_plan.cpp), kept with the handle so
  // that it lives exactly as long (forever) and passes, with the handle, to the next
  // thread that borrows it; only the holding thread touches it.
  // Workspaces, one per stream this handle executed on (most recently used last, a
  // few at most), from torch's caching allocator on that stream and only ever used on
  // it, so reuse is stream-ordered; grown on demand. torch's cuBLAS workspaces per
  // (handle, stream) are the model. Never used while a stream captures a CUDA graph
  // (a capture takes its workspace from the graph's pool, per call); and a stream
  // whose first workspace the allocator placed in a private pool (cudagraph trees'
  // warm-up, torch.cuda.use_mem_pool) gets per-call workspaces on this handle from
  // then on, since a block kept past the call would stay live in someone's pool.
  struct StreamWorkspace {
    cudaStream_t stream = nullptr;
    c10::DataPtr memory;
    int64_t bytes = 0;
    bool per_call = false;
  };
  std::vector<StreamWorkspace> workspaces;
  // The last variant pack executed on this handle, for the plan with serial
  // `variant_pack_plan` and these data pointers (operands, then workspace): a call
  // with the same plan and pointers reuses it. Destroyed when replaced.
  cudnnBackendDescriptor_t variant_pack = nullptr;
  uint64_t variant_pack_plan = 0;
  std::vector<void*> variant_pack_pointers;
};

// This thread's handle for `device`, borrowed on first use, with cuDNN's stream set
// to `stream` (cudnnSetStream only when it differs from the handle's last one) and the
// right CUDA context current (context/context_guard.h). Throws when this thread has
// no handle for `device` yet and `stream` is capturing a CUDA graph, in a process
// forked after handles existed, and for a stream on another device.
// `stream_is_on_device`: the caller knows the stream lives on `device` (torch's current
// stream there, or a torch.cuda.Stream whose device was checked); otherwise the driver
// is asked once per stream change.
PooledCudnnHandle* handle_for_call(int device, cudaStream_t stream, bool stream_is_on_device = true);

// This thread's handle for `device` if it already has one, else nullptr. Never creates.
PooledCudnnHandle* find_thread_handle(int device);

// Records that someone else (the frontend's cudnn.set_stream) has already set the
// backend handle's stream to `stream`.
void record_stream(PooledCudnnHandle* handle, cudaStream_t stream);

std::map<int, DeviceHandleCounts> pool_counts();
uint64_t total_set_stream_calls();

}  // namespace torch_cudnn_handle
