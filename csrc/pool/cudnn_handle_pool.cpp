#include "pool/cudnn_handle_pool.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include "context/context_guard.h"

namespace torch_cudnn_handle {
namespace {

std::atomic<uint64_t> all_set_stream_calls{0};

PooledCudnnHandle* create_pooled_handle(int device) {
  // cudnnCreate binds the handle to the current device: the device's context for the
  // call, then the caller's again (a cold thread keeps the device's, the guard's rule).
  context::ContextGuard context(device, nullptr, nullptr);
  cudnnHandle_t raw = nullptr;
  backend::check_cudnn(backend::cudnn_library().create(&raw), "cudnnCreate");
  auto* handle = new PooledCudnnHandle();  // owned by the pool, never freed
  handle->backend_handle = raw;
  handle->device = device;
  return handle;
}

using CreateFn = PooledCudnnHandle* (*)(int);
using CudnnPool = DeviceThreadHandlePool<PooledCudnnHandle*, CreateFn>;

// Leaked on purpose, as ATen's pools are (Note [Leaked on purpose], device_thread_handle_pool.h).
const std::shared_ptr<CudnnPool>& pool() {
  static const auto* instance = new std::shared_ptr<CudnnPool>(new CudnnPool(&create_pooled_handle));
  return *instance;
}

CudnnPool::PoolWindow& window() {
  thread_local const std::unique_ptr<CudnnPool::PoolWindow> mine = pool()->new_window();
  return *mine;
}

void refuse_creation_during_capture(int device, cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  TORCH_CHECK(status == cudaStreamCaptureStatusNone,
              "torch_cudnn_handle: this thread has no cuDNN handle for cuda:", device,
              " yet, and its stream is capturing a CUDA graph. Creating a handle allocates and "
              "synchronizes, which a capture cannot record. Warm up before capture: run the op "
              "(or call torch_cudnn_handle.current_handle(", device,
              ")) once on this thread, outside the capture.");
}

void set_backend_stream(PooledCudnnHandle* handle, cudaStream_t stream, bool stream_is_on_device) {
  const int stream_device = stream_is_on_device ? handle->device : context::device_of_stream(stream);
  TORCH_CHECK_VALUE(stream_device < 0 || stream_device == handle->device,
                    "torch_cudnn_handle: the stream is on cuda:", stream_device,
                    " but the work is for cuda:", handle->device,
                    "; pass a stream of the same device (torch.cuda.current_stream(", handle->device,
                    ")) or move the tensors.");
  CUcontext stream_context = context::context_of_stream(stream);
  backend::check_cudnn(backend::cudnn_library().set_stream(handle->backend_handle, stream),
                       "cudnnSetStream");
  handle->stream = stream;
  handle->stream_context = stream_context;
  handle->set_stream_calls.fetch_add(1, std::memory_order_relaxed);
  all_set_stream_calls.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

PooledCudnnHandle* handle_for_call(int device, cudaStream_t stream, bool stream_is_on_device) {
  check_not_forked();
  CudnnPool::PoolWindow& mine = window();
  PooledCudnnHandle* handle = mine.find(device);
  if (handle == nullptr) {
    refuse_creation_during_capture(device, stream);
    handle = mine.reserve(device);
  }
  if (handle->stream != stream) {
    set_backend_stream(handle, stream, stream_is_on_device);
  }
  return handle;
}

PooledCudnnHandle* find_thread_handle(int device) { return window().find(device); }

void record_stream(PooledCudnnHandle* handle, cudaStream_t stream) {
  handle->stream_context = context::context_of_stream(stream);
  handle->stream = stream;
}

void for_each_pooled_handle(const std::function<void(PooledCudnnHandle*)>& fn) {
  check_not_forked();
  pool()->for_each_created(fn);
}

std::map<int, DeviceHandleCounts> pool_counts() { return pool()->counts(); }

uint64_t total_set_stream_calls() { return all_set_stream_calls.load(std::memory_order_relaxed); }

}  // namespace torch_cudnn_handle
