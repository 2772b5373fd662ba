#include "pool/fork_guard.h"

#include <pthread.h>

#include <mutex>
#include <stdexcept>

namespace torch_cudnn_handle {
namespace {

std::atomic<bool> handles_exist{false};

void on_fork_child() {
  // Runs in the child right after fork(). Only async-signal-safe work here: atomics.
  if (handles_exist.load(std::memory_order_relaxed)) {
    fork_guard_detail::forked_after_handles.store(true, std::memory_order_relaxed);
  }
}

}  // namespace

namespace fork_guard_detail {

std::atomic<bool> forked_after_handles{false};

void throw_forked() {
  throw std::runtime_error(
      "torch_cudnn_handle: this process was forked after its parent created cuDNN handles; "
      "handles and CUDA contexts do not survive fork(), so the library refuses to run in the "
      "child. Start worker processes with the 'spawn' (or 'forkserver') start method, "
      "e.g. torch.multiprocessing.set_start_method('spawn').");
}

}  // namespace fork_guard_detail

void note_handle_created() {
  static std::once_flag installed;
  std::call_once(installed, [] { pthread_atfork(nullptr, nullptr, on_fork_child); });
  handles_exist.store(true, std::memory_order_relaxed);
}

}  // namespace torch_cudnn_handle
