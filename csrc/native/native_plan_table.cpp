// NativePlanTable: the native plans of every graph id, found per call by the inputs'
// layouts (native_plan.h says who owns them and when they die).
#include <ATen/Context.h>

#include <algorithm>
#include <mutex>

#include "native/native_plan.h"
#include "native/plan_graphs.h"

namespace torch_cudnn_handle::native {

NativePlanTable& NativePlanTable::instance() {
  static auto* table = new NativePlanTable();  // leaked on purpose (Note [Leaked on purpose])
  return *table;
}

void NativePlanTable::add(int64_t graph, std::shared_ptr<const NativePlan> plan) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  plans_[graph].push_back(std::move(plan));
}

bool NativePlanTable::remove(int64_t graph, uint64_t serial) {
  std::shared_ptr<const NativePlan> dropped;  // destroyed after the lock is released
  std::unique_lock<std::shared_mutex> lock(mutex_);
  auto it = plans_.find(graph);
  if (it == plans_.end()) return false;
  auto& plans = it->second;
  auto match = std::find_if(plans.begin(), plans.end(), [&](const auto& p) { return p->serial() == serial; });
  if (match == plans.end()) return false;
  dropped = std::move(*match);
  plans.erase(match);
  if (plans.empty()) plans_.erase(it);
  lock.unlock();
  forget_native_graphs(serial);  // the handles' graphs of it hold it too (plan_graphs.h)
  return true;
}

std::shared_ptr<const NativePlan> NativePlanTable::find(int64_t graph, at::TensorList inputs) const {
  const bool deterministic_only = at::globalContext().deterministicAlgorithms();
  std::shared_lock<std::shared_mutex> lock(mutex_);
  auto it = plans_.find(graph);
  if (it == plans_.end()) return nullptr;
  for (const auto& plan : it->second) {
    if ((plan->deterministic() || !deterministic_only) && plan->matches(inputs)) return plan;
  }
  return nullptr;
}

size_t NativePlanTable::size() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  size_t n = 0;
  for (const auto& [graph, plans] : plans_) n += plans.size();
  return n;
}

std::map<uint64_t, int64_t> NativePlanTable::last_used() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  std::map<uint64_t, int64_t> out;
  for (const auto& [graph, plans] : plans_) {
    for (const auto& plan : plans) out[plan->serial()] = plan->last_used_ns();
  }
  return out;
}

std::map<uint64_t, uint64_t> NativePlanTable::calls() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  std::map<uint64_t, uint64_t> out;
  for (const auto& [graph, plans] : plans_) {
    for (const auto& plan : plans) out[plan->serial()] = plan->calls();
  }
  return out;
}

}  // namespace torch_cudnn_handle::native
