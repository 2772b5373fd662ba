// NativePlan's CUDA-graph launch: a call whose addresses repeat runs as one
// cudaGraphLaunch of a graph cuDNN populated, or one captured from its execute
// (Note [Native CUDA graph launch] in plan_graphs.h).
#include <c10/cuda/CUDAException.h>

#include "backend/cudnn_library.h"
#include "native/native_plan.h"
#include "native/native_scratch.h"
#include "native/plan_graphs.h"

namespace torch_cudnn_handle::native {
namespace {

// Graphs that may fail to be made before a plan stops trying (each costs a failed call
// into cuDNN and the driver; one may fail for a passing reason, e.g. a global-mode capture).
constexpr int kMaxGraphFailures = 3;

}  // namespace

bool NativePlan::populates_cuda_graphs() const {
#if CUDNN_VERSION >= 90500
  return populated_by_cudnn_ && backend::cudnn_library().populate_cuda_graph != nullptr;
#else
  return false;
#endif
}

bool NativePlan::launches_cuda_graphs() const {
  return !host_inputs_ && graph_failures_.load(std::memory_order_relaxed) < kMaxGraphFailures;
}

const char* NativePlan::cuda_graph_route() const {
  if (host_inputs_) return nullptr;
  return populates_cuda_graphs() ? "populated by cuDNN" : "captured from its execute";
}

bool NativePlan::capture_execute(PooledCudnnHandle* handle, cudaStream_t stream, NativeScratch& scratch,
                                 cudnnBackendDescriptor_t pack, cudaGraph_t* graph) const {
  // On the handle's own capture stream, never the caller's: a capture takes whatever
  // any thread enqueues on its stream, and the legacy default stream cannot capture.
  // Thread-local mode: other threads' allocations stay legal meanwhile.
  cudaStream_t side = scratch.capture_stream(device_);
  const auto& cudnn = backend::cudnn_library();
  if (side == nullptr || cudnn.set_stream(handle->backend_handle, side) != CUDNN_STATUS_SUCCESS) return false;
  bool captured = false;
  if (cudaStreamBeginCapture(side, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
    const bool executed = cudnn.execute(handle->backend_handle, plan_, pack) == CUDNN_STATUS_SUCCESS;
    const bool ended = cudaStreamEndCapture(side, graph) == cudaSuccess;  // ends it whatever the execute did
    captured = executed && ended;
  }
  // Back to the stream the pooled handle records (handle->stream): the caller's.
  backend::check_cudnn(cudnn.set_stream(handle->backend_handle, stream), "cudnnSetStream after a capture");
  return captured;
}

bool NativePlan::launch_graph(PooledCudnnHandle* handle, cudaStream_t stream, c10::ArrayRef<void*> pointers,
                              void* engine_workspace) const {
  NativeScratch& scratch = NativeScratch::of(handle);  // its mutex is held by execute()
  PlanGraphs& graphs = scratch.graphs();
  const PlanGraphs::Lookup found = graphs.find(serial_, pointers, engine_workspace);
  if (found.exec == nullptr && !found.populate) return false;
  cudaGraphExec_t exec = found.exec;
  if (exec == nullptr) {
    // Made on this thread's handle; a failure (an engine that declines after all, an
    // execute that is not capturable, a capture in global mode on another thread
    // refusing the instantiation) leaves this call to cudnnBackendExecute and clears
    // the error CUDA recorded for it.
    cudnnBackendDescriptor_t pack = scratch.variant_pack(serial_, pack_uids_, pointers, engine_workspace);
    cudaGraph_t graph = nullptr;
    const bool populate = populates_cuda_graphs();
    bool made = false;
#if CUDNN_VERSION >= 90500
    if (populate) {
      made = cudaGraphCreate(&graph, 0) == cudaSuccess &&
          backend::cudnn_library().populate_cuda_graph(handle->backend_handle, plan_, pack, graph) == CUDNN_STATUS_SUCCESS;
    }
#endif
    if (!populate) made = capture_execute(handle, stream, scratch, pack, &graph);
    made = made && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    if (!made) {
      (void)cudaGetLastError();
      graph_failures_.fetch_add(1, std::memory_order_relaxed);
      ++graphs.failed;
      return false;
    }
    graphs.add(found, shared_from_this(), pointers, engine_workspace, exec);
    ++(populate ? graphs.populated : graphs.captured);
  }
  C10_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  ++graphs.launched;
  return true;
}

}  // namespace torch_cudnn_handle::native
