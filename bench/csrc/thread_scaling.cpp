// A bench-only extension (bench/thread_scaling.py builds it with torch.utils.cpp_extension
// .load, from this file and csrc/backend/): calls per second of T C++
// threads (no GIL anywhere), each on its own stream from torch's pool, started together,
// timed until every stream is done. What each thread calls:
//
//   op:      cudnn_fe.execute through the dispatcher (autograd, then the CUDA kernel's
//            native path: this thread's pooled handle, its context, a native plan);
//   bmm:     at::bmm of the same operands, the baseline;
//   backend: cudnnBackendExecute alone, the op's floor: the same serialized plan on the
//            thread's own cudnnHandle_t and a variant pack built once, either one plan
//            descriptor shared by every thread (what the op does) or one per thread;
//   graph:   cuDNN's native CUDA graph of a plan (cudnnBackendPopulateCudaGraph, cuDNN
//            >= 9.5, an engine with the SUPPORTS_CUDA_GRAPH_NATIVE_API note), populated
//            and instantiated once per thread, then per call either launched as it is
//            (pointers unchanged) or first re-pointed at the other of two pointer sets
//            (cudnnBackendUpdateCudaGraph on the graph, then the executable graph
//            updated whole or node by node) and launched.
//
// Handles, plans, variant packs and graphs made here are never destroyed (a bench process).
#include <torch/extension.h>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cudnn_library.h"
#include "backend/descriptors.h"
#include "op/execute_op.h"

namespace backend = torch_cudnn_handle::backend;

namespace {

// One thread's set-up (untimed), then `calls` timed calls of its body.
using ThreadSetup = std::function<std::function<void()>(int thread)>;

// Seconds from the common start until the last thread has issued its calls, and until
// the last thread's stream is done.
struct Elapsed {
  double issued, done;
};

Elapsed run_threads(int device, int threads, int64_t calls, int64_t warmup, const ThreadSetup& setup) {
  TORCH_CHECK(threads > 0 && calls > 0, "thread_scaling: threads and calls must be positive");
  std::atomic<int> ready{0}, issued{0}, done{0};
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
        }
      } catch (...) {
        errors[t] = std::current_exception();
      }
      issued.fetch_add(1);
      try {
        if (!errors[t]) on_stream->current_stream().synchronize();
      } catch (...) {
        errors[t] = std::current_exception();
      }
      done.fetch_add(1);
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  while (issued.load() < threads) std::this_thread::yield();
  const std::chrono::duration<double> to_issue = std::chrono::steady_clock::now() - start;
  while (done.load() < threads) std::this_thread::yield();
  const std::chrono::duration<double> to_done = std::chrono::steady_clock::now() - start;
  for (auto& worker : workers) worker.join();
  for (auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  return {to_issue.count(), to_done.count()};
}

double calls_per_second(int device, int threads, int64_t calls, int64_t warmup, const ThreadSetup& setup) {
  return static_cast<double>(threads) * static_cast<double>(calls) / run_threads(device, threads, calls, warmup, setup).done;
}

// Calls per second, and each thread's output of its last call (checked by the caller).
using RateAndOutputs = std::pair<double, std::vector<at::Tensor>>;

RateAndOutputs op_calls_per_second(int64_t graph, std::vector<std::vector<at::Tensor>> operands, int threads,
                                   int64_t calls, int64_t warmup) {
  TORCH_CHECK(static_cast<int>(operands.size()) >= threads, "thread_scaling: one operand list per thread");
  const int device = operands[0][0].get_device();
  std::vector<at::Tensor> last(threads);
  const double rate = calls_per_second(device, threads, calls, warmup, [&](int t) -> std::function<void()> {
    const auto& inputs = operands[t];
    at::Tensor* out = &last[t];
    return [&inputs, graph, out] { *out = torch_cudnn_handle::execute_op().call(graph, inputs)[0]; };
  });
  return {rate, std::move(last)};
}

RateAndOutputs bmm_calls_per_second(std::vector<std::vector<at::Tensor>> operands, int threads, int64_t calls,
                                    int64_t warmup) {
  TORCH_CHECK(static_cast<int>(operands.size()) >= threads, "thread_scaling: one operand list per thread");
  const int device = operands[0][0].get_device();
  std::vector<at::Tensor> last(threads);
  const double rate = calls_per_second(device, threads, calls, warmup, [&](int t) -> std::function<void()> {
    const auto& ab = operands[t];
    at::Tensor* out = &last[t];
    return [&ab, out] { *out = at::bmm(ab[0], ab[1]); };
  });
  return {rate, std::move(last)};
}

cudnnHandle_t new_handle(cudaStream_t stream) {
  cudnnHandle_t handle = nullptr;
  backend::check_cudnn(backend::cudnn_library().create(&handle), "cudnnCreate");
  backend::check_cudnn(backend::cudnn_library().set_stream(handle, stream), "cudnnSetStream");
  return handle;
}

// The handle plans are deserialized with (never executes anything), made once.
cudnnHandle_t planning_handle(int device) {
  static cudnnHandle_t handle = new_handle(c10::cuda::getCurrentCUDAStream(device).stream());
  return handle;
}

// Thread index t's handle, made on its first run and kept for the next runs (each run's
// thread t uses it alone; runs do not overlap), set to `stream`. One device per process.
cudnnHandle_t handle_of_thread(int t, cudaStream_t stream) {
  static std::mutex mutex;
  static std::vector<cudnnHandle_t> handles;
  cudnnHandle_t handle = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (static_cast<int>(handles.size()) > t) handle = handles[t];
  }
  if (!handle) {
    handle = new_handle(stream);
    std::lock_guard<std::mutex> lock(mutex);
    if (static_cast<int>(handles.size()) <= t) handles.resize(t + 1, nullptr);
    handles[t] = handle;
  }
  backend::check_cudnn(backend::cudnn_library().set_stream(handle, stream), "cudnnSetStream");
  return handle;
}

// Thread t's variant pack: `pointers[t]` in `uids` order (the caller computed them: the
// op's operands, pass-by-value scalars in host memory, workspace tensors, replacements),
// its workspace `workspace[t]` (0: none), and `memsets[t]`, (address, bytes) zeroed
// before each call as the op zeroes the frontend's workspace tensors.
Elapsed backend_elapsed(const std::string& plan_json, std::vector<int64_t> uids,
                        std::vector<std::vector<int64_t>> pointers, std::vector<int64_t> workspace,
                        std::vector<std::vector<std::pair<int64_t, int64_t>>> memsets, bool shared_plan, int threads,
                        int64_t calls, int64_t warmup, int device) {
  TORCH_CHECK(static_cast<int>(pointers.size()) >= threads && workspace.size() == pointers.size() &&
                  memsets.size() == pointers.size(),
              "thread_scaling: one pointer list, workspace and memset list per thread");
  cudnnBackendDescriptor_t shared = nullptr;
  if (shared_plan) {
    c10::cuda::CUDAGuard on_device(static_cast<c10::DeviceIndex>(device));
    shared = backend::deserialize_plan(plan_json, planning_handle(device));
  }
  return run_threads(device, threads, calls, warmup, [&](int t) -> std::function<void()> {
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    cudnnHandle_t handle = handle_of_thread(t, stream);
    cudnnBackendDescriptor_t plan = shared ? shared : backend::deserialize_plan(plan_json, handle);
    std::vector<void*> addresses;
    for (const auto p : pointers[t]) addresses.push_back(reinterpret_cast<void*>(p));
    cudnnBackendDescriptor_t variant_pack =
        backend::make_variant_pack(uids, addresses, reinterpret_cast<void*>(workspace[t]));
    auto zero = memsets[t];
    return [handle, plan, variant_pack, zero, stream] {
      for (const auto& [address, bytes] : zero) {
        C10_CUDA_CHECK(cudaMemsetAsync(reinterpret_cast<void*>(address), 0, static_cast<size_t>(bytes), stream));
      }
      backend::check_cudnn(backend::cudnn_library().execute(handle, plan, variant_pack), "cudnnBackendExecute");
    };
  });
}

double backend_calls_per_second(const std::string& plan_json, std::vector<int64_t> uids,
                                std::vector<std::vector<int64_t>> pointers, std::vector<int64_t> workspace,
                                std::vector<std::vector<std::pair<int64_t, int64_t>>> memsets, bool shared_plan,
                                int threads, int64_t calls, int64_t warmup, int device) {
  const auto elapsed = backend_elapsed(plan_json, std::move(uids), std::move(pointers), std::move(workspace),
                                       std::move(memsets), shared_plan, threads, calls, warmup, device);
  return static_cast<double>(threads) * static_cast<double>(calls) / elapsed.done;
}

// How a graph call re-points and launches (see the file's header).
enum class GraphCall : int64_t {
  launch = 0,        // cudaGraphLaunch of the instantiated graph, pointers unchanged
  update_exec = 1,   // cudnnBackendUpdateCudaGraph + cudaGraphExecUpdate + cudaGraphLaunch
  update_nodes = 2,  // cudnnBackendUpdateCudaGraph + cudaGraphExecKernelNodeSetParams per kernel node + launch
};

void check_graph_api() {
  TORCH_CHECK(backend::cudnn_library().populate_cuda_graph && backend::cudnn_library().update_cuda_graph,
              "thread_scaling: this libcudnn (", backend::cudnn_library().version(),
              ") has no native CUDA graph API; it needs cuDNN 9.5 or newer");
}

// The kernel nodes of `graph`; throws when it holds anything but kernels, memsets and
// empty nodes (a child graph would need its own update, which update_nodes does not do).
std::vector<cudaGraphNode_t> kernel_nodes(cudaGraph_t graph) {
  size_t count = 0;
  C10_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  C10_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  std::vector<cudaGraphNode_t> kernels;
  for (auto node : nodes) {
    cudaGraphNodeType type;
    C10_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type == cudaGraphNodeTypeKernel) {
      kernels.push_back(node);
    } else {
      TORCH_CHECK(type == cudaGraphNodeTypeMemset || type == cudaGraphNodeTypeEmpty,
                  "thread_scaling: cuDNN's graph has a node of type ", static_cast<int>(type),
                  "; node-by-node update handles kernel, memset and empty nodes only");
    }
  }
  return kernels;
}

// Thread t: its own handle, two variant packs (`pointers[t]`, `other_pointers[t]`: same
// uids, e.g. another output buffer), one graph populated from the first pack by the
// plan shared by all threads, instantiated once. Memsets as in backend_elapsed.
double graph_calls_per_second(const std::string& plan_json, std::vector<int64_t> uids,
                              std::vector<std::vector<int64_t>> pointers,
                              std::vector<std::vector<int64_t>> other_pointers, std::vector<int64_t> workspace,
                              std::vector<std::vector<std::pair<int64_t, int64_t>>> memsets, int64_t mode,
                              int threads, int64_t calls, int64_t warmup, int device) {
  TORCH_CHECK(mode >= 0 && mode <= 2, "thread_scaling: graph call mode is 0 (launch), 1 (update_exec) or 2 (update_nodes)");
  TORCH_CHECK(static_cast<int>(pointers.size()) >= threads && other_pointers.size() == pointers.size() &&
                  workspace.size() == pointers.size() && memsets.size() == pointers.size(),
              "thread_scaling: two pointer lists, a workspace and a memset list per thread");
  check_graph_api();
  const auto call = static_cast<GraphCall>(mode);
  cudnnBackendDescriptor_t plan = nullptr;
  {
    c10::cuda::CUDAGuard on_device(static_cast<c10::DeviceIndex>(device));
    plan = backend::deserialize_plan(plan_json, planning_handle(device));
  }
  const auto to_addresses = [](const std::vector<int64_t>& values) {
    std::vector<void*> addresses;
    for (const auto p : values) addresses.push_back(reinterpret_cast<void*>(p));
    return addresses;
  };
  // Each thread's graph and executable graph, destroyed once every stream is done.
  std::vector<std::pair<cudaGraph_t, cudaGraphExec_t>> made(threads, {nullptr, nullptr});
  const double rate = calls_per_second(device, threads, calls, warmup, [&](int t) -> std::function<void()> {
    const auto& lib = backend::cudnn_library();
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    cudnnHandle_t handle = handle_of_thread(t, stream);
    void* ws = reinterpret_cast<void*>(workspace[t]);
    std::array<cudnnBackendDescriptor_t, 2> packs = {backend::make_variant_pack(uids, to_addresses(pointers[t]), ws),
                                                     backend::make_variant_pack(uids, to_addresses(other_pointers[t]), ws)};
    cudaGraph_t graph = nullptr;
    C10_CUDA_CHECK(cudaGraphCreate(&graph, 0));
    made[t].first = graph;
    backend::check_cudnn(lib.populate_cuda_graph(handle, plan, packs[0], graph),
                         "cudnnBackendPopulateCudaGraph (an engine without SUPPORTS_CUDA_GRAPH_NATIVE_API?)");
    cudaGraphExec_t exec = nullptr;
    C10_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    made[t].second = exec;
    const std::vector<cudaGraphNode_t> kernels = call == GraphCall::update_nodes ? kernel_nodes(graph) : std::vector<cudaGraphNode_t>{};
    auto zero = memsets[t];
    auto next = std::make_shared<int>(0);  // which pack the next update uses: alternates, so every update moves pointers
    return [=, &lib] {
      for (const auto& [address, bytes] : zero) {
        C10_CUDA_CHECK(cudaMemsetAsync(reinterpret_cast<void*>(address), 0, static_cast<size_t>(bytes), stream));
      }
      if (call != GraphCall::launch) {
        *next ^= 1;
        backend::check_cudnn(lib.update_cuda_graph(handle, plan, packs[*next], graph), "cudnnBackendUpdateCudaGraph");
        if (call == GraphCall::update_exec) {
          cudaGraphExecUpdateResultInfo info{};
          C10_CUDA_CHECK(cudaGraphExecUpdate(exec, graph, &info));
        } else {
          for (auto node : kernels) {
            cudaKernelNodeParams params{};  // owned by the node until it changes again
            C10_CUDA_CHECK(cudaGraphKernelNodeGetParams(node, &params));
            C10_CUDA_CHECK(cudaGraphExecKernelNodeSetParams(exec, node, &params));
          }
        }
      }
      C10_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    };
  });
  for (auto [graph, exec] : made) {
    if (exec) C10_CUDA_CHECK(cudaGraphExecDestroy(exec));
    if (graph) C10_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  return rate;
}

// Host microseconds to issue one call, one thread: cudnnBackendExecute's own host cost
// (keep `calls` below the launch queue's depth, or a GPU-bound plan blocks the host).
double backend_issue_us(const std::string& plan_json, std::vector<int64_t> uids, std::vector<int64_t> pointers,
                        int64_t workspace, std::vector<std::pair<int64_t, int64_t>> memsets, int64_t calls,
                        int64_t warmup, int device) {
  const auto elapsed = backend_elapsed(plan_json, std::move(uids), {std::move(pointers)}, {workspace}, {std::move(memsets)},
                                       true, 1, calls, warmup, device);
  return elapsed.issued * 1e6 / static_cast<double>(calls);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "bench-only: calls per second of T C++ threads calling the op, at::bmm, cudnnBackendExecute alone or cuDNN's native CUDA graph";
  auto released = py::call_guard<py::gil_scoped_release>();
  m.def("op_calls_per_second", &op_calls_per_second, py::arg("graph"), py::arg("operands"), py::arg("threads"),
        py::arg("calls"), py::arg("warmup") = 20, released);
  m.def("bmm_calls_per_second", &bmm_calls_per_second, py::arg("operands"), py::arg("threads"), py::arg("calls"),
        py::arg("warmup") = 20, released);
  m.def("backend_calls_per_second", &backend_calls_per_second, py::arg("plan_json"), py::arg("uids"),
        py::arg("pointers"), py::arg("workspace"), py::arg("memsets"), py::arg("shared_plan"), py::arg("threads"),
        py::arg("calls"), py::arg("warmup") = 20, py::arg("device") = 0, released);
  m.def("graph_calls_per_second", &graph_calls_per_second, py::arg("plan_json"), py::arg("uids"), py::arg("pointers"),
        py::arg("other_pointers"), py::arg("workspace"), py::arg("memsets"), py::arg("mode"), py::arg("threads"),
        py::arg("calls"), py::arg("warmup") = 20, py::arg("device") = 0, released);
  m.def("backend_issue_us", &backend_issue_us, py::arg("plan_json"), py::arg("uids"), py::arg("pointers"),
        py::arg("workspace"), py::arg("memsets"), py::arg("calls"), py::arg("warmup") = 20, py::arg("device") = 0,
        released);
}
