// The testing seam: the real DeviceThreadHandlePool template, instantiated with a
// handle that needs no GPU, so CI (no GPU) can exercise the pool's reservation rules:
// N concurrent threads -> N handles, a finished thread's handle is reused, thread
// churn never creates more than peak concurrency, creation runs outside the mutex,
// and a forked child is refused.
#include "pool/pool_seam.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "pool/device_thread_handle_pool.h"

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

}  // namespace

int64_t reserve(int device) {
  return window().reserve(device)->id;
}

std::map<int, DeviceHandleCounts> counts() {
  return seam_pool()->counts();
}

void set_create_delay_us(int us) { create_delay_us = us; }
int max_concurrent_creates() { return max_creating_at_once.load(); }

}  // namespace torch_cudnn_handle::seam
