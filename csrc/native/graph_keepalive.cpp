#include "native/graph_keepalive.h"

#include <c10/cuda/CUDAException.h>

#include <mutex>
#include <vector>

namespace torch_cudnn_handle::native {
namespace {

// Leaked on purpose (Note [Leaked on purpose], pool/device_thread_handle_pool.h): CUDA
// may release a graph's user objects during process exit.
std::mutex& dropped_mutex() {
  static auto* mutex = new std::mutex();
  return *mutex;
}
std::vector<std::shared_ptr<const void>>& dropped() {
  static auto* owners = new std::vector<std::shared_ptr<const void>>();
  return *owners;
}

void CUDART_CB on_graph_released(void* owner) {
  auto* held = static_cast<std::shared_ptr<const void>*>(owner);
  {
    std::lock_guard<std::mutex> lock(dropped_mutex());
    dropped().push_back(std::move(*held));
  }
  delete held;  // an empty shared_ptr now: frees no plan, calls no CUDA
}

}  // namespace

bool keep_alive_while_captured(cudaStream_t stream, std::shared_ptr<const void> owner) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  cudaGraph_t graph = nullptr;
  C10_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &id, &graph));
  if (status != cudaStreamCaptureStatusActive) return false;
  auto* held = new std::shared_ptr<const void>(std::move(owner));
  cudaUserObject_t object = nullptr;
  cudaError_t created = cudaUserObjectCreate(&object, held, &on_graph_released, 1, cudaUserObjectNoDestructorSync);
  if (created != cudaSuccess) {
    delete held;
    C10_CUDA_CHECK(created);
  }
  // Moves our one reference to the graph: CUDA now decides when the owner goes.
  cudaError_t retained = cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove);
  if (retained != cudaSuccess) {
    cudaUserObjectRelease(object, 1);  // ours still: released through on_graph_released
    C10_CUDA_CHECK(retained);
  }
  return true;
}

size_t release_dropped() {
  std::vector<std::shared_ptr<const void>> batch;
  {
    std::lock_guard<std::mutex> lock(dropped_mutex());
    batch.swap(dropped());
  }
  return batch.size();  // destroyed here, outside the lock
}

}  // namespace torch_cudnn_handle::native
