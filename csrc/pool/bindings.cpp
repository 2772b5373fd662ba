// The pool's Python face: current_handle(), pool_stats(), bind_context().
//
// current_handle() is C++ because it is on every call's path: parsing the device and
// stream, reserving the thread's handle and setting its stream together cost well
// under a microsecond, where the same steps in Python cost several.
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>
#include <torch/extension.h>

#include "bindings.h"
#include "context/context_guard.h"
#include "pool/cudnn_handle_pool.h"
#include "pool/device_arguments.h"
#include "pool/pool_docs.h"

namespace py = pybind11;

namespace torch_cudnn_handle {
namespace {

// Builds the Python cudnn.Handle for a pooled handle (set by the Python package).
// Held for the life of the process and never released (it may be called at exit).
py::object* handle_factory = nullptr;

py::object python_handle_of(PooledCudnnHandle* handle) {
  if (handle->python_handle == nullptr) {
    TORCH_CHECK(handle_factory != nullptr, "torch_cudnn_handle: import torch_cudnn_handle first");
    py::object made = (*handle_factory)(py::cast(handle, py::return_value_policy::reference));
    handle->python_handle = made.release().ptr();  // the one strong reference, kept forever
  }
  return py::reinterpret_borrow<py::object>(static_cast<PyObject*>(handle->python_handle));
}

py::object current_handle(py::handle device_arg, py::handle stream_arg) {
  check_not_forked();
  const int device = parse_device(device_arg);
  const ParsedStream stream = parse_stream(stream_arg, device);
  auto reserve = [&] {
    PooledCudnnHandle* handle = handle_for_call(device, stream.stream, stream.is_on_device);
    // The caller's context stays; only a cold thread keeps the device's (the guard's rule).
    context::ContextGuard context(device, stream.stream, handle->stream_context);
    return handle;
  };
  if (find_thread_handle(device) != nullptr) return python_handle_of(reserve());
  PooledCudnnHandle* created = nullptr;
  {
    py::gil_scoped_release no_gil;  // creating a handle takes milliseconds
    created = reserve();
  }
  return python_handle_of(created);
}

py::dict pool_stats() {
  py::dict devices;
  for (const auto& [device, counts] : pool_counts()) {
    py::dict entry;
    entry["created"] = counts.created;
    entry["in_use"] = counts.created - counts.free;
    entry["free"] = counts.free;
    devices[py::int_(device)] = entry;
  }
  py::dict stats;
  stats["devices"] = devices;
  stats["set_stream_calls"] = total_set_stream_calls();
  return stats;
}

}  // namespace

void bind_pool(py::module& m) {
  py::class_<PooledCudnnHandle, std::unique_ptr<PooledCudnnHandle, py::nodelete>>(
      m, "PooledHandleState", "The pool's record of one backend handle (owned by the pool, never freed).")
      .def_property_readonly("backend_handle",
                             [](const PooledCudnnHandle& h) { return reinterpret_cast<intptr_t>(h.backend_handle); })
      .def_property_readonly("device", [](const PooledCudnnHandle& h) { return h.device; })
      .def_property(
          "stream", [](const PooledCudnnHandle& h) { return reinterpret_cast<intptr_t>(h.stream); },
          [](PooledCudnnHandle& h, intptr_t stream) { record_stream(&h, reinterpret_cast<cudaStream_t>(stream)); })
      .def_property_readonly("set_stream_calls", [](const PooledCudnnHandle& h) { return h.set_stream_calls.load(); });

  m.def("_set_handle_factory", [](py::object factory) {
    delete handle_factory;
    handle_factory = new py::object(std::move(factory));
  });
  m.def("current_handle", &current_handle, py::arg("device") = py::none(), py::arg("stream") = py::none(),
        pool_docs::kCurrentHandle);
  m.def("pool_stats", &pool_stats,
        pool_docs::kPoolStats);
  m.def(
      "bind_context",
      [](py::handle device_arg, py::handle stream_arg) {
        check_not_forked();
        const int device = parse_device(device_arg);
        context::bind(device, parse_stream(stream_arg, device).stream, nullptr);
      },
      py::arg("device") = py::none(), py::arg("stream") = py::none(),
      pool_docs::kBindContext);
  m.def("current_context_device", &context::current_context_device,
        "The device of the CUDA context current on this thread, or -1 when none is.");
  m.def(
      "relax_capture_mode_for_this_thread",
      [] {
        cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        C10_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
      },
      "Let this thread's CUDA calls (cuDNN's allocations in a build) run while another thread captures a CUDA graph "
      "in global mode: this thread is part of no capture. The registry's build threads call it once, at their start.");
  m.def("forked_after_handles", &forked_after_handles,
        "Whether this process is a child forked after its parent created cuDNN handles.");
}

}  // namespace torch_cudnn_handle
