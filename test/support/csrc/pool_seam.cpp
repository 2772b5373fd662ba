// The pool's CPU test seam, a test-only extension (built by test/conftest.py with
// torch.utils.cpp_extension.load; never part of torch_cudnn_handle._C): the real
// DeviceThreadHandlePool template, instantiated with a handle that needs no GPU, so CI
// (no GPU) can exercise the pool's reservation rules: N concurrent threads -> N handles,
// a finished thread's handle is reused, thread churn never creates more than peak
// concurrency, creation runs outside the mutex, and a forked child is refused.
//
// Built from this file and csrc/pool/fork_guard.cpp, so the fork guard here is this
// extension's own copy (its own state and its own atfork handler), separate from _C's:
// the fork test exercises the template together with the guard, which is what it means
// to test. Plain pybind11, no torch headers: nothing here needs torch.
#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>

#include "pool/device_thread_handle_pool.h"

namespace py = pybind11;

namespace torch_cudnn_handle::seam {
namespace {

struct SeamHandle {
  int64_t id;
  int device;
};

std::atomic<int64_t> next_id{1};
std::atomic<int> creating_now{0};
std::atomic<int> max_creating_at_once{0};
std::atomic<int> create_delay_us{0};

// Owned by the pool (never freed, like real handles).
SeamHandle* create_seam_handle(int device) {
  int now = ++creating_now;
  int seen = max_creating_at_once.load();
  while (now > seen && !max_creating_at_once.compare_exchange_weak(seen, now)) {
  }
  if (int delay = create_delay_us.load()) {
    std::this_thread::sleep_for(std::chrono::microseconds(delay));
  }
  --creating_now;
  return new SeamHandle{next_id++, device};
}

using CreateFn = SeamHandle* (*)(int);
using SeamPool = DeviceThreadHandlePool<SeamHandle*, CreateFn>;

const std::shared_ptr<SeamPool>& seam_pool() {
  static const auto pool = std::make_shared<SeamPool>(&create_seam_handle);
  return pool;
}

SeamPool::PoolWindow& window() {
  thread_local const std::unique_ptr<SeamPool::PoolWindow> mine = seam_pool()->new_window();
  return *mine;
}

// This thread's seam handle id for `device`.
int64_t reserve(int device) { return window().reserve(device)->id; }

}  // namespace
}  // namespace torch_cudnn_handle::seam

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace torch_cudnn_handle::seam;
  m.doc() = "torch_cudnn_handle's pool test seam: DeviceThreadHandlePool with a handle that needs no GPU";
  m.def("reserve", &reserve, py::arg("device"), py::call_guard<py::gil_scoped_release>(),
        "This thread's handle id for `device`, borrowed from the seam's pool on first use.");
  m.def("counts", [] {
    py::dict out;
    for (const auto& [device, counts] : seam_pool()->counts()) {
      out[py::int_(device)] = py::make_tuple(counts.created, counts.free);
    }
    return out;
  }, "{device: (created, free)} of the seam's pool.");
  m.def("set_create_delay_us", [](int us) { create_delay_us = us; }, py::arg("us"),
        "Make creation slow, to observe it overlap.");
  m.def("max_concurrent_creates", [] { return max_creating_at_once.load(); },
        "The most handle creations seen running at once.");
}
