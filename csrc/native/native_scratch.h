// What the native path keeps per pooled handle between calls: a workspace per stream
// and the last variant pack. Stored in the handle's consumer_state, so it lives as long
// as the handle (forever) and passes with it to the next thread that borrows it; only
// the holding thread touches it.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/util/ArrayRef.h>
#include <cudnn.h>

#include <cstdint>
#include <vector>

#include "pool/cudnn_handle_pool.h"

namespace torch_cudnn_handle::native {

class NativeScratch {
 public:
  static NativeScratch& of(PooledCudnnHandle* handle);

  // `bytes` of workspace for work on `stream` (see native_scratch.cpp for the rules).
  // A block that must not outlive the call is put in `per_call`, which the caller holds
  // until the call returns.
  void* workspace(int device, cudaStream_t stream, bool capturing, int64_t bytes, c10::DataPtr& per_call);

  // The variant pack for these uids and pointers: the last one when the plan and
  // pointers repeat, else a new one, kept until the next miss.
  cudnnBackendDescriptor_t variant_pack(uint64_t plan_serial, const std::vector<int64_t>& uids,
                                        c10::ArrayRef<void*> pointers, void* workspace);

 private:
  struct StreamWorkspace {
    cudaStream_t stream = nullptr;
    c10::DataPtr memory;
    int64_t bytes = 0;
    bool per_call = false;
  };
  std::vector<StreamWorkspace> workspaces_;  // most recently used last
  cudnnBackendDescriptor_t variant_pack_ = nullptr;
  uint64_t variant_pack_plan_ = 0;
  std::vector<void*> variant_pack_pointers_;  // operands, then the workspace
};

}  // namespace torch_cudnn_handle::native
