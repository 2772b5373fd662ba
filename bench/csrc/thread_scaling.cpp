// A bench-only extension (bench/thread_scaling.py builds it with torch.utils.cpp_extension
// .load, from this file and csrc/backend/cudnn_library.cpp): calls per second of T C++
// threads (no GIL anywhere), each on its own stream from torch's pool, started together,
// timed until every stream is done. What each thread calls:
//
//   op:      cudnn_fe.execute through the dispatcher (autograd, then the CUDA kernel's
//            native path: this thread's pooled handle, its context, a native plan);
//   bmm:     at::bmm of the same operands, the baseline;
//   backend: cudnnBackendExecute alone, the op's floor: the same serialized plan on the
//            thread's own cudnnHandle_t and a variant pack built once, either one plan
//            descriptor shared by every thread (what the op does) or one per thread.
//
// Handles and plans made here are never destroyed (a bench process).
#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "backend/cudnn_library.h"
#include "op/execute_op.h"

namespace backend = torch_cudnn_handle::backend;

namespace {

// One thread's set-up (untimed), then `calls` timed calls of its body.
using ThreadSetup = std::function<std::function<void()>(int thread)>;

double calls_per_second(int device, int threads, int64_t calls, int64_t warmup, const ThreadSetup& setup) {
  TORCH_CHECK(threads > 0 && calls > 0, "thread_scaling: threads and calls must be positive");
  std::atomic<int> ready{0}, done{0};
  std::atomic<bool> go{false};
  std::vector<std::exception_ptr> errors(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::function<void()> body;
      std::optional<c10::cuda::CUDAStreamGuard> on_stream;
      try {
        c10::cuda::CUDAGuard on_device(static_cast<c10::DeviceIndex>(device));  // a cold thread: make the context current
        on_stream.emplace(c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(device)));
        body = setup(t);
        for (int64_t i = 0; i < warmup; ++i) body();
        on_stream->current_stream().synchronize();
      } catch (...) {
        errors[t] = std::current_exception();
      }
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      try {
        if (!errors[t]) {
          for (int64_t i = 0; i < calls; ++i) body();
          on_stream->current_stream().synchronize();
        }
      } catch (...) {
        errors[t] = std::current_exception();
      }
      done.fetch_add(1);
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  while (done.load() < threads) std::this_thread::yield();
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  for (auto& worker : workers) worker.join();
  for (auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  return static_cast<double>(threads) * static_cast<double>(calls) / elapsed.count();
}

double op_calls_per_second(int64_t graph, std::vector<std::vector<at::Tensor>> operands, int threads, int64_t calls,
                           int64_t warmup) {
  TORCH_CHECK(static_cast<int>(operands.size()) >= threads, "thread_scaling: one operand list per thread");
  const int device = operands[0][0].get_device();
  return calls_per_second(device, threads, calls, warmup, [&](int t) -> std::function<void()> {
    const auto& inputs = operands[t];
    return [&inputs, graph] { torch_cudnn_handle::execute_op().call(graph, inputs); };
  });
}

double bmm_calls_per_second(std::vector<std::vector<at::Tensor>> operands, int threads, int64_t calls, int64_t warmup) {
  TORCH_CHECK(static_cast<int>(operands.size()) >= threads, "thread_scaling: one operand list per thread");
  const int device = operands[0][0].get_device();
  return calls_per_second(device, threads, calls, warmup, [&](int t) -> std::function<void()> {
    const auto& ab = operands[t];
    return [&ab] { at::bmm(ab[0], ab[1]); };
  });
}

cudnnBackendDescriptor_t deserialize(const std::string& plan_json, cudnnHandle_t handle) {
  backend::ScopedDescriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  backend::set_attribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                         static_cast<int64_t>(plan_json.size()), plan_json.data(), "plan JSON");
  backend::set_attribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "plan handle");
  backend::check_cudnn(backend::cudnn_library().finalize(plan.get()), "deserializing the plan");
  return plan.release();
}

cudnnHandle_t new_handle(cudaStream_t stream) {
  cudnnHandle_t handle = nullptr;
  backend::check_cudnn(backend::cudnn_library().create(&handle), "cudnnCreate");
  backend::check_cudnn(backend::cudnn_library().set_stream(handle, stream), "cudnnSetStream");
  return handle;
}

// `operands[t]`: thread t's tensors in the plan's uid order (inputs, then outputs it
// writes into); `workspace[t]`: its workspace (undefined when the plan needs none).
double backend_calls_per_second(const std::string& plan_json, std::vector<int64_t> uids,
                                std::vector<std::vector<at::Tensor>> operands, std::vector<at::Tensor> workspace,
                                bool shared_plan, int threads, int64_t calls, int64_t warmup) {
  TORCH_CHECK(static_cast<int>(operands.size()) >= threads && workspace.size() == operands.size(),
              "thread_scaling: one operand list and one workspace per thread");
  const int device = operands[0][0].get_device();
  cudnnBackendDescriptor_t shared = nullptr;
  if (shared_plan) {
    c10::cuda::CUDAGuard on_device(static_cast<c10::DeviceIndex>(device));
    shared = deserialize(plan_json, new_handle(c10::cuda::getCurrentCUDAStream(device).stream()));
  }
  return calls_per_second(device, threads, calls, warmup, [&](int t) -> std::function<void()> {
    cudnnHandle_t handle = new_handle(c10::cuda::getCurrentCUDAStream(device).stream());
    cudnnBackendDescriptor_t plan = shared ? shared : deserialize(plan_json, handle);
    std::vector<void*> pointers;
    for (const auto& tensor : operands[t]) pointers.push_back(tensor.data_ptr());
    void* ws = workspace[t].defined() ? workspace[t].data_ptr() : nullptr;
    backend::ScopedDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    const auto count = static_cast<int64_t>(uids.size());
    backend::set_attribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, count,
                           pointers.data(), "pointers");
    backend::set_attribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, count, uids.data(), "uids");
    backend::set_attribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws, "workspace");
    backend::check_cudnn(backend::cudnn_library().finalize(pack.get()), "finalizing the variant pack");
    cudnnBackendDescriptor_t variant_pack = pack.release();
    return [handle, plan, variant_pack] {
      backend::check_cudnn(backend::cudnn_library().execute(handle, plan, variant_pack), "cudnnBackendExecute");
    };
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "bench-only: calls per second of T C++ threads calling the op, at::bmm, or cudnnBackendExecute alone";
  auto released = py::call_guard<py::gil_scoped_release>();
  m.def("op_calls_per_second", &op_calls_per_second, py::arg("graph"), py::arg("operands"), py::arg("threads"),
        py::arg("calls"), py::arg("warmup") = 20, released);
  m.def("bmm_calls_per_second", &bmm_calls_per_second, py::arg("operands"), py::arg("threads"), py::arg("calls"),
        py::arg("warmup") = 20, released);
  m.def("backend_calls_per_second", &backend_calls_per_second, py::arg("plan_json"), py::arg("uids"),
        py::arg("operands"), py::arg("workspace"), py::arg("shared_plan"), py::arg("threads"), py::arg("calls"),
        py::arg("warmup") = 20, released);
}
