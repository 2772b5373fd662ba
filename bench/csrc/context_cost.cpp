// A bench-only extension (bench/context_cost.py builds it with
// torch.utils.cpp_extension.load, from this file and csrc/context/context_guard.cpp):
// the host cost of the op's context rule, ContextGuard (bind, then the caller's context
// put back), against the previous rule, context::bind (which left the context
// switched), in the same-device case every ordinary call is in: the caller already has
// the right context current, and the op passes torch's current stream on the device
// and that stream's context (context_of_stream: nullptr for a default stream), as
// DeviceCall does with the pooled handle's cached stream_context.
#include <torch/extension.h>

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "context/context_guard.h"

namespace context = torch_cudnn_handle::context;

namespace {

// What the op passes for work on `device`.
struct OpArguments {
  int device;
  cudaStream_t stream;
  CUcontext stream_context;
};

OpArguments op_arguments(int device) {
  TORCH_CHECK(device >= 0 && device < static_cast<int>(c10::cuda::device_count()), "context_cost: no cuda:",
              device, " (", static_cast<int>(c10::cuda::device_count()), " GPUs visible)");
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  return {device, stream, context::context_of_stream(stream)};
}

// Host microseconds per iteration of `body(arguments)`, `calls` iterations in one loop,
// with the call's own target context current throughout (the same-device case).
template <typename Body>
double us_per_iteration(int device, int64_t calls, Body&& body) {
  TORCH_CHECK(calls > 0, "context_cost: calls must be positive, got ", calls);
  const OpArguments arguments = op_arguments(device);
  // Set-up, not timed: the context the op's rule picks for these arguments is made
  // current here (and the caller's put back on return), so every timed iteration finds
  // it current already and neither rule switches anything.
  context::ContextGuard same_device(arguments.device, arguments.stream, arguments.stream_context);
  TORCH_CHECK(context::current_context_device() == device, "context_cost: the current context is not cuda:", device);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < calls; ++i) body(arguments);
  const std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;
  TORCH_CHECK(context::current_context_device() == device, "context_cost: the loop left another context current");
  return elapsed.count() / static_cast<double>(calls);
}

// ContextGuard constructed and destroyed: what each op call does now.
double guard_us(int device, int64_t calls) {
  return us_per_iteration(device, calls, [](const OpArguments& a) {
    context::ContextGuard guard(a.device, a.stream, a.stream_context);
  });
}

// context::bind: the previous rule, which left the context switched.
double bind_us(int device, int64_t calls) {
  return us_per_iteration(device, calls, [](const OpArguments& a) { context::bind(a.device, a.stream, a.stream_context); });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "bench-only: host us per call of context::ContextGuard against context::bind, same device";
  m.def("guard_us", &guard_us, pybind11::arg("device"), pybind11::arg("calls"),
        "Host us per iteration of constructing + destroying ContextGuard(device, stream, stream_context).");
  m.def("bind_us", &bind_us, pybind11::arg("device"), pybind11::arg("calls"),
        "Host us per iteration of context::bind(device, stream, stream_context).");
}
