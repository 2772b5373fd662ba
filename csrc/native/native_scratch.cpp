#include "native/native_scratch.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

#include "backend/cudnn_library.h"
#include "backend/descriptors.h"

namespace torch_cudnn_handle::native {
namespace {

constexpr size_t kMaxWorkspacesPerHandle = 4;

// From torch's caching allocator, on `device`'s current stream. The allocator serves
// the current device, and the dispatcher sets none for a custom op's kernel.
c10::DataPtr allocate_on(int device, int64_t bytes) {
  c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(device));
  return c10::cuda::CUDACachingAllocator::get()->allocate(static_cast<size_t>(bytes));
}

// Whether the caching allocator placed `pointer` in a private pool (a CUDA graph's,
// cudagraph trees', torch.cuda.use_mem_pool's) rather than the default one. Asked
// only when a cached workspace is (re)allocated, so the snapshot's cost is rare.
bool in_private_pool(const void* pointer) {
  const auto address = reinterpret_cast<size_t>(pointer);
  const auto snapshot = c10::cuda::CUDACachingAllocator::snapshot();
  for (const auto& segment : snapshot.segments) {
    if (address >= segment.address && address < segment.address + segment.total_size) {
      return segment.owner_private_pool_id != decltype(segment.owner_private_pool_id){0, 0};
    }
  }
  return true;  // not found: keep nothing we cannot place
}

}  // namespace

NativeScratch& NativeScratch::of(PooledCudnnHandle* handle) {
  void* state = handle->consumer_state.load(std::memory_order_acquire);
  if (state == nullptr) {  // only the holding thread creates it
    state = new NativeScratch();  // lives as long as the handle: forever
    handle->consumer_state.store(state, std::memory_order_release);
  }
  return *static_cast<NativeScratch*>(state);
}

// The rules: during a capture, a block from the caching allocator (the graph's pool)
// for this call only, so replays own their workspace. Otherwise the handle's block for
// this stream, grown when too small: torch keeps cuBLAS workspaces per (handle, stream)
// the same way, and reuse is stream-ordered because a block is only used on its stream.
// A stream whose first block landed in a private pool (cudagraph trees' warm-up,
// torch.cuda.use_mem_pool) gets per-call blocks from then on: a kept block would stay
// live in someone's pool.
void* NativeScratch::workspace(int device, cudaStream_t stream, bool capturing, int64_t bytes,
                               c10::DataPtr& per_call) {
  if (capturing) {
    per_call = allocate_on(device, bytes);
    return per_call.get();
  }
  auto it = std::find_if(workspaces_.begin(), workspaces_.end(), [&](const auto& w) { return w.stream == stream; });
  if (it != workspaces_.end() && it != workspaces_.end() - 1) {
    std::rotate(it, it + 1, workspaces_.end());
    it = workspaces_.end() - 1;
  }
  if (it == workspaces_.end()) {
    if (workspaces_.size() == kMaxWorkspacesPerHandle) workspaces_.erase(workspaces_.begin());
    workspaces_.push_back({stream, c10::DataPtr(), 0, false});
    it = workspaces_.end() - 1;
  }
  if (it->per_call) {
    per_call = allocate_on(device, bytes);
    return per_call.get();
  }
  if (it->bytes < bytes) {
    it->memory = c10::DataPtr();  // free first: the allocator may hand the same block back, grown
    it->bytes = 0;
    c10::DataPtr memory = allocate_on(device, bytes);
    if (in_private_pool(memory.get())) {
      it->per_call = true;
      per_call = std::move(memory);
      return per_call.get();
    }
    it->memory = std::move(memory);
    it->bytes = bytes;
  }
  return it->memory.get();
}

cudnnBackendDescriptor_t NativeScratch::variant_pack(uint64_t plan_serial, const std::vector<int64_t>& uids,
                                                     c10::ArrayRef<void*> pointers, void* workspace) {
  if (variant_pack_ != nullptr && variant_pack_plan_ == plan_serial && same_addresses(variant_pack_pointers_, pointers, workspace)) {
    return variant_pack_;
  }
  if (variant_pack_ != nullptr) {
    backend::cudnn_library().destroy_descriptor(variant_pack_);
    variant_pack_ = nullptr;
  }
  variant_pack_ = backend::make_variant_pack(uids, pointers, workspace);
  variant_pack_plan_ = plan_serial;
  variant_pack_pointers_.assign(pointers.begin(), pointers.end());
  variant_pack_pointers_.push_back(workspace);
  return variant_pack_;
}

cudaStream_t NativeScratch::capture_stream(int device) {
  if (capture_stream_ == nullptr) {
    c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(device));
    if (cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking) != cudaSuccess) {
      (void)cudaGetLastError();
      capture_stream_ = nullptr;
    }
  }
  return capture_stream_;
}

int64_t NativeScratch::release_workspaces() {
  int64_t bytes = 0;
  for (const auto& w : workspaces_) bytes += w.bytes;
  workspaces_.clear();  // each DataPtr returns its block to the caching allocator
  return bytes;
}

void for_each_native_scratch(const std::function<void(NativeScratch&)>& fn) {
  for_each_pooled_handle([&](PooledCudnnHandle* handle) {
    auto* scratch = static_cast<NativeScratch*>(handle->consumer_state.load(std::memory_order_acquire));
    if (scratch == nullptr) return;
    std::lock_guard<std::mutex> lock(scratch->mutex());
    fn(*scratch);
  });
}

int64_t release_native_workspaces() {
  int64_t bytes = 0;
  for_each_native_scratch([&](NativeScratch& scratch) { bytes += scratch.release_workspaces(); });
  return bytes;
}

}  // namespace torch_cudnn_handle::native
