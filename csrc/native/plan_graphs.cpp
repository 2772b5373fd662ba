#include "native/plan_graphs.h"

#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <atomic>

#include "native/native_plan.h"
#include "native/native_scratch.h"

namespace torch_cudnn_handle::native {
namespace {

size_t hash_of(uint64_t plan_serial, c10::ArrayRef<void*> pointers, void* workspace) {
  size_t hash = std::hash<uint64_t>{}(plan_serial);
  auto mix = [&](const void* p) {  // boost::hash_combine's mixing
    hash ^= std::hash<const void*>{}(p) + 0x9e3779b97f4a7c15ULL + (hash << 6) + (hash >> 2);
  };
  for (void* p : pointers) mix(p);
  mix(workspace);
  return hash;
}

void destroy(cudaGraphExec_t exec) {
  // Freed by CUDA once an in-flight launch completes; an error here (a context torn
  // down by a failed device) is not worth a throw from a destructor path.
  if (cudaGraphExecDestroy(exec) != cudaSuccess) (void)cudaGetLastError();
}

// On until torch_cudnn_handle/settings.py says otherwise: the package sets it at import
// from the native_cuda_graphs setting (TORCH_CUDNN_HANDLE_NATIVE_CUDA_GRAPHS), and on
// every change of it.
std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> flag{true};
  return flag;
}

}  // namespace

bool same_addresses(const std::vector<void*>& kept, c10::ArrayRef<void*> pointers, void* workspace) {
  return kept.size() == pointers.size() + 1 && std::equal(pointers.begin(), pointers.end(), kept.begin()) &&
      kept.back() == workspace;
}

PlanGraphs::~PlanGraphs() { forget(0); }

PlanGraphs::Lookup PlanGraphs::find(uint64_t plan_serial, c10::ArrayRef<void*> pointers, void* workspace) {
  Lookup found;
  found.hash = hash_of(plan_serial, pointers, workspace);
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (it->hash == found.hash && same_addresses(it->addresses, pointers, workspace)) {
      if (it != entries_.rbegin()) std::rotate(it.base() - 1, it.base(), entries_.end());  // most recent last
      found.exec = entries_.back().exec;
      return found;
    }
  }
  auto seen = std::find(seen_.begin(), seen_.end(), found.hash);
  if (seen != seen_.end()) {
    *seen = 0;
    found.populate = true;
  } else {
    seen_[seen_next_] = found.hash;
    seen_next_ = (seen_next_ + 1) % seen_.size();
  }
  return found;
}

void PlanGraphs::add(const Lookup& found, std::shared_ptr<const NativePlan> plan, c10::ArrayRef<void*> pointers,
                     void* workspace, cudaGraphExec_t exec) {
  if (entries_.size() == kMaxGraphs) {
    destroy(entries_.front().exec);
    entries_.erase(entries_.begin());
  }
  std::vector<void*> addresses(pointers.begin(), pointers.end());
  addresses.push_back(workspace);
  entries_.push_back({found.hash, std::move(addresses), exec, std::move(plan)});
}

size_t PlanGraphs::forget(uint64_t plan_serial) {
  size_t n = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (plan_serial == 0 || it->plan->serial() == plan_serial) {
      destroy(it->exec);
      it = entries_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

bool native_cuda_graphs_enabled() { return enabled_flag().load(std::memory_order_relaxed); }

bool set_native_cuda_graphs(bool enabled) { return enabled_flag().exchange(enabled); }

PlanGraphCounts plan_graph_counts() {
  PlanGraphCounts counts;
  for_each_native_scratch([&](NativeScratch& scratch) {
    const PlanGraphs& graphs = scratch.graphs();
    counts.populated += graphs.populated;
    counts.captured += graphs.captured;
    counts.launched += graphs.launched;
    counts.failed += graphs.failed;
    counts.kept += static_cast<int64_t>(graphs.size());
  });
  return counts;
}

size_t forget_native_graphs(uint64_t plan_serial) {
  size_t n = 0;
  for_each_native_scratch([&](NativeScratch& scratch) { n += scratch.graphs().forget(plan_serial); });
  return n;
}

}  // namespace torch_cudnn_handle::native
