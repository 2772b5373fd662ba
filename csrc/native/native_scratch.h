// What the native path keeps per pooled handle between calls: a workspace per stream,
// the last variant pack, and CUDA graphs of recent calls (plan_graphs.h). Stored in the handle's consumer_state, so it lives as long
// as the handle (forever) and passes with it to the next thread that borrows it. The
// holding thread uses it under its mutex for a whole call (workspace to launch), so
// release_native_workspaces() can free the workspaces from any thread, never while a
// call is between taking its workspace and launching on it. Uncontended but for a
// release, the lock costs tens of nanoseconds a call.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/util/ArrayRef.h>
#include <cudnn.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "native/plan_graphs.h"
#include "pool/cudnn_handle_pool.h"

namespace torch_cudnn_handle::native {

class NativeScratch {
 public:
  static NativeScratch& of(PooledCudnnHandle* handle);

  // Held by a call across workspace(), variant_pack() and the launch.
  std::mutex& mutex() { return mutex_; }

  // `bytes` of workspace for work on `stream` (see native_scratch.cpp for the rules).
  // A block that must not outlive the call is put in `per_call`, which the caller holds
  // until the call returns.
  void* workspace(int device, cudaStream_t stream, bool capturing, int64_t bytes, c10::DataPtr& per_call);

  // The variant pack for these uids and pointers: the last one when the plan and
  // pointers repeat, else a new one, kept until the next miss.
  cudnnBackendDescriptor_t variant_pack(uint64_t plan_serial, const std::vector<int64_t>& uids,
                                        c10::ArrayRef<void*> pointers, void* workspace);

  // Frees the kept workspaces (to torch's caching allocator); returns their bytes.
  // With mutex() held.
  int64_t release_workspaces();

  // The CUDA graphs of recent calls (Note [Native CUDA graph launch]); with mutex() held.
  PlanGraphs& graphs() { return graphs_; }

  // This handle's own stream on `device` for capturing a call into a graph, made on
  // first use and leaked on purpose, like the handle (Note [Leaked on purpose]); null if CUDA refused one.
  cudaStream_t capture_stream(int device);

 private:

  struct StreamWorkspace {
    cudaStream_t stream = nullptr;
    c10::DataPtr memory;
    int64_t bytes = 0;
    bool per_call = false;
  };
  std::mutex mutex_;
  std::vector<StreamWorkspace> workspaces_;  // most recently used last
  cudnnBackendDescriptor_t variant_pack_ = nullptr;
  uint64_t variant_pack_plan_ = 0;
  std::vector<void*> variant_pack_pointers_;  // operands, then the workspace
  PlanGraphs graphs_;
  cudaStream_t capture_stream_ = nullptr;
};

// Runs `fn` on the scratch of every pooled handle that has one, each under its mutex
// (so between that handle's calls), from any thread.
void for_each_native_scratch(const std::function<void(NativeScratch&)>& fn);

// Frees the native path's kept workspaces of every pooled handle, safe while other
// threads run (each scratch is freed under its mutex, so between calls). The memory
// returns to torch's caching allocator, stream-ordered as any free; a later call
// allocates again. torch.cuda.empty_cache() then gives it back to the driver.
// Returns the bytes freed.
int64_t release_native_workspaces();

}  // namespace torch_cudnn_handle::native
