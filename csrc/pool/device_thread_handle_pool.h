// One handle per (device, thread), handed back to a free list when the thread exits.
//
// Modeled on ATen's DeviceThreadHandles.h (the pool behind CublasHandlePool.cpp and
// cudnn/Handle.cpp), with three changes:
//   * a handle is created OUTSIDE the pool mutex: creating a cuDNN handle takes ~2 ms
//     and takes cuDNN's and the driver's own locks, and holding ours across that
//     serialises every cold thread (and has deadlocked elsewhere, rocm-libraries #11838);
//   * the thread's window is a small vector indexed by ordinal, so the hit path is one
//     bounds check and one load, with no lock and no hashing;
//   * a process that forked after creating handles refuses to use the pool at all
//     (see fork_guard.h): the child's copy of the window names handles whose CUDA
//     context did not survive the fork.
//
// Note [Leaked on purpose]
// Every process-wide object the op reaches from C++ -- the handle pool and its handles,
// the loaded cuDNN library, the graph records, the native plan table, the handles'
// scratch and capture streams, the CUDA graphs kept alive past an eviction -- is created
// on first use and never destroyed. Threads still running while the process exits
// (daemon threads, autograd's workers) may reach any of them, and destroying cuDNN or
// CUDA objects during teardown races the CUDA context's own teardown (pytorch #907,
// #17658, #60987): torch's own handle pools leak theirs for the same reason. The OS frees
// it all with the process. Elsewhere: "leaked on purpose (Note [Leaked on purpose])".
//
// Ownership and lifetime:
//   * The pool owns every handle it created (`created_`), for the life of the process,
//     and never destroys one (Note [Leaked on purpose]).
//   * A thread borrows at most one handle per device, through its thread_local
//     PoolWindow, from its first request until the thread exits; the window's
//     destructor (run by the C++ runtime at thread exit) returns the handles to
//     `available_`, where the next thread that needs one picks it up.
//   * The pool itself is leaked on purpose (a shared_ptr whose deleter does nothing;
//     Note [Leaked on purpose]). A window holds only a
//     weak_ptr, as ATen's do, so a pool that is ever destroyed is never touched after.
//   * No cap on the number of handles: a cap can deadlock threads that wait on each
//     other while holding one. The total per device is the peak number of threads
//     that held one at the same time.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include "pool/fork_guard.h"

namespace torch_cudnn_handle {

struct DeviceHandleCounts {
  size_t created = 0;  // handles this pool made for the device, ever
  size_t free = 0;     // of those, the ones no live thread holds
};

// `Handle` is a pointer type (nullptr = none). `Create` is a callable
// `Handle(int device)`; it runs without the pool's lock held and may throw, in which
// case nothing is recorded.
template <typename Handle, typename Create>
class DeviceThreadHandlePool
    : public std::enable_shared_from_this<DeviceThreadHandlePool<Handle, Create>> {
 public:
  explicit DeviceThreadHandlePool(Create create) : create_(std::move(create)) {}

  // A thread's borrowed handles, one slot per device ordinal.
  class PoolWindow {
   public:
    explicit PoolWindow(std::weak_ptr<DeviceThreadHandlePool> parent)
        : parent_(std::move(parent)) {}
    PoolWindow(const PoolWindow&) = delete;
    PoolWindow& operator=(const PoolWindow&) = delete;
    ~PoolWindow() {
      // At thread exit. If the pool is gone the process is exiting: leak.
      if (auto parent = parent_.lock()) {
        parent->give_back(mine_);
      }
    }

    // This thread's handle for `device`, or nullptr when it holds none yet.
    // Lock-free: only this thread touches `mine_`.
    Handle find(int device) const {
      return static_cast<size_t>(device) < mine_.size() ? mine_[device] : Handle{};
    }

    // This thread's handle for `device`, borrowed from the pool on first use.
    Handle reserve(int device) {
      check_not_forked();
      if (Handle mine = find(device)) {
        return mine;
      }
      auto parent = parent_.lock();
      if (!parent) {
        throw std::runtime_error("torch_cudnn_handle: the handle pool is gone (process exit)");
      }
      Handle handle = parent->acquire(device);
      if (static_cast<size_t>(device) >= mine_.size()) {
        mine_.resize(device + 1, Handle{});
      }
      mine_[device] = handle;
      return handle;
    }

   private:
    std::vector<Handle> mine_;
    std::weak_ptr<DeviceThreadHandlePool> parent_;
  };

  std::unique_ptr<PoolWindow> new_window() {
    return std::make_unique<PoolWindow>(this->weak_from_this());
  }

  // `fn(handle)` for every handle created, held by a thread or not, under the pool's
  // lock. `fn` must not call back into the pool, and guards whatever it touches.
  template <typename Fn>
  void for_each_created(Fn fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [device, handles] : created_) {
      for (const auto& handle : handles) fn(handle);
    }
  }

  std::map<int, DeviceHandleCounts> counts() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::map<int, DeviceHandleCounts> out;
    for (const auto& [device, handles] : created_) {
      out[device].created = handles.size();
    }
    for (const auto& [device, handles] : available_) {
      out[device].free = handles.size();
    }
    return out;
  }

 private:
  Handle acquire(int device) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& free_list = available_[device];
      if (!free_list.empty()) {
        Handle handle = free_list.back();
        free_list.pop_back();
        return handle;
      }
    }
    Handle handle = create_(device);  // unlocked: see the header comment
    note_handle_created();
    std::lock_guard<std::mutex> lock(mutex_);
    created_[device].push_back(handle);
    return handle;
  }

  void give_back(const std::vector<Handle>& handles) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t device = 0; device < handles.size(); ++device) {
      if (handles[device]) {
        available_[static_cast<int>(device)].push_back(handles[device]);
      }
    }
  }

  Create create_;
  std::mutex mutex_;
  std::map<int, std::vector<Handle>> created_;    // owners, never shrinks
  std::map<int, std::vector<Handle>> available_;  // free list per device
};

}  // namespace torch_cudnn_handle
