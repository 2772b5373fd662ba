// Handles and CUDA contexts do not survive fork(): the child inherits the parent's
// memory, including every thread's pool window, cached plans and workspaces, but not
// its CUDA state. Once this process has created a handle, a forked child refuses every
// entry point of the library, the fast paths included (one relaxed load each).
#pragma once

#include <atomic>

namespace torch_cudnn_handle {

namespace fork_guard_detail {
extern std::atomic<bool> forked_after_handles;  // set in the child only
[[noreturn]] void throw_forked();
}  // namespace fork_guard_detail

// Called by a pool after it creates a handle. Installs the fork handler once.
void note_handle_created();

// Throws a clear error in a child forked after handles were created.
inline void check_not_forked() {
  if (fork_guard_detail::forked_after_handles.load(std::memory_order_relaxed)) {
    fork_guard_detail::throw_forked();
  }
}

// Whether this process is such a child (for Python: skip exit-time cleanup there).
inline bool forked_after_handles() {
  return fork_guard_detail::forked_after_handles.load(std::memory_order_relaxed);
}

}  // namespace torch_cudnn_handle
