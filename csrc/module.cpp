// Python bindings of the extension (torch_cudnn_handle._C).
//
// current_handle() lives here, in C++, because it is on every call's path: parsing
// the device and stream, reserving the thread's handle, setting its stream and binding
// the context together cost well under a microsecond, where the same steps in Python
// cost several.
#include <torch/extension.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>

#include <optional>
#include <string>

#include "op/execute_op.h"
#include "op/python_kernels.h"
#include "pool/pool_seam.h"

#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include "backend/cudnn_library.h"
#include "context/context_guard.h"
#include "op/native_breakdown.h"
#include "op/native_plan.h"
#include "pool/cudnn_handle_pool.h"
#endif

namespace py = pybind11;

namespace torch_cudnn_handle {
namespace {

int visible_device_count() {
#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
  return static_cast<int>(c10::cuda::device_count());
#else
  return 0;
#endif
}

constexpr const char* kDeviceHint =
    "Pass a CUDA device: an int ordinal, 'cuda:N', torch.device('cuda', N), or a CUDA "
    "tensor's .device.";

// Integers enter error messages through std::to_string, never through c10::str's
// ostream: a toolchain that links libstdc++ statically into the extension (the GPU
// host's CXX does) gives it a second copy of the locale machinery, and there an
// ostream<<long crashed.
int check_ordinal(int64_t ordinal) {
  const int count = visible_device_count();
  TORCH_CHECK_VALUE(ordinal >= 0 && ordinal < count, "torch_cudnn_handle: cuda:", std::to_string(ordinal),
                    " does not exist: this process sees ", std::to_string(count), " CUDA device(s)",
                    count ? " (ordinals 0.." + std::to_string(count - 1) + ")" : std::string(),
                    ". ", kDeviceHint);
  return static_cast<int>(ordinal);
}

int current_ordinal() {
#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
  TORCH_CHECK(visible_device_count() > 0,
              "torch_cudnn_handle: no CUDA device is visible to this process, so there is no "
              "current device to take a cuDNN handle for.");
  return c10::cuda::current_device();
#else
  TORCH_CHECK(false,
              "torch_cudnn_handle: this build of the extension has no CUDA support (torch was a "
              "CPU build when it was compiled), so there is no current CUDA device.");
#endif
}

int ordinal_of(const c10::Device& device) {
  TORCH_CHECK_VALUE(device.is_cuda(), "torch_cudnn_handle: cuDNN handles live on CUDA devices; got '",
                    device.str(), "'. ", kDeviceHint);
  return device.has_index() ? check_ordinal(device.index()) : current_ordinal();
}

// None | int | "cuda[:N]" | torch.device  ->  a valid ordinal.
int parse_device(py::handle device) {
  if (device.is_none()) return current_ordinal();
  if (THPDevice_Check(device.ptr())) {
    return ordinal_of(reinterpret_cast<THPDevice*>(device.ptr())->device);
  }
  if (py::isinstance<py::bool_>(device)) {
    TORCH_CHECK_TYPE(false, "torch_cudnn_handle: a bool is not a device. ", kDeviceHint);
  }
  if (py::isinstance<py::int_>(device)) return check_ordinal(device.cast<int64_t>());
  if (py::isinstance<py::str>(device)) {
    const auto text = device.cast<std::string>();
    // "cuda:N" by hand: c10::Device keeps the index in 8 bits, so "cuda:999" would wrap.
    static const std::string kCudaPrefix = "cuda:";
    if (text.rfind(kCudaPrefix, 0) == 0 && text.size() > kCudaPrefix.size() &&
        text.find_first_not_of("0123456789", kCudaPrefix.size()) == std::string::npos &&
        text.size() - kCudaPrefix.size() < 10) {
      return check_ordinal(std::stoll(text.substr(kCudaPrefix.size())));
    }
    std::optional<c10::Device> parsed;
    try {
      parsed.emplace(text);
    } catch (const c10::Error&) {
      TORCH_CHECK_VALUE(false, "torch_cudnn_handle: '", text, "' is not a device string. ", kDeviceHint);
    }
    return ordinal_of(*parsed);
  }
  TORCH_CHECK_TYPE(false, "torch_cudnn_handle: expected a device, got ",
                   py::str(py::type::of(device).attr("__name__")).cast<std::string>(), ". ", kDeviceHint);
}

#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
constexpr const char* kStreamHint =
    "Pass None (torch's current stream), a torch.cuda.Stream, or its .cuda_stream int.";

struct ParsedStream {
  cudaStream_t stream;
  bool is_on_device;  // known to live on the requested device without asking the driver
};

// None | int | torch.cuda.Stream-like  ->  a raw stream for `device`.
ParsedStream parse_stream(py::handle stream, int device) {
  if (stream.is_none()) {
    return {c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream(), true};
  }
  if (py::isinstance<py::int_>(stream) && !py::isinstance<py::bool_>(stream)) {
    const auto raw = stream.cast<int64_t>();
    TORCH_CHECK_VALUE(raw >= 0, "torch_cudnn_handle: ", std::to_string(raw), " is not a CUDA stream handle. ", kStreamHint);
    return {reinterpret_cast<cudaStream_t>(static_cast<intptr_t>(raw)), false};
  }
  if (py::hasattr(stream, "cuda_stream") && py::hasattr(stream, "device_index")) {
    const auto stream_device = stream.attr("device_index").cast<int64_t>();
    TORCH_CHECK_VALUE(stream_device == device, "torch_cudnn_handle: the stream is on cuda:", std::to_string(stream_device),
                      " but the handle is for cuda:", std::to_string(device), ". Use a stream of cuda:",
                      std::to_string(device), ".");
    return {reinterpret_cast<cudaStream_t>(static_cast<intptr_t>(stream.attr("cuda_stream").cast<int64_t>())), true};
  }
  TORCH_CHECK_TYPE(false, "torch_cudnn_handle: expected a stream, got ",
                   py::str(py::type::of(stream).attr("__name__")).cast<std::string>(), ". ", kStreamHint);
}

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
  const int device = parse_device(device_arg);
  const ParsedStream stream = parse_stream(stream_arg, device);
  PooledCudnnHandle* handle = nullptr;
  if (find_thread_handle(device) == nullptr) {
    py::gil_scoped_release no_gil;  // creating a handle takes milliseconds
    handle = handle_for_call(device, stream.stream, stream.is_on_device);
  } else {
    handle = handle_for_call(device, stream.stream, stream.is_on_device);
  }
  return python_handle_of(handle);
}

// [(shape, stride, dtype), ...] from the Python registry.
std::vector<OperandLayout> layouts_of(const py::sequence& specs) {
  std::vector<OperandLayout> layouts;
  for (const auto& spec : specs) {
    auto fields = spec.cast<py::sequence>();
    py::handle dtype = fields[2];
    TORCH_CHECK_TYPE(THPDtype_Check(dtype.ptr()), "torch_cudnn_handle: a layout's dtype must be a torch.dtype");
    layouts.push_back({fields[0].cast<std::vector<int64_t>>(), fields[1].cast<std::vector<int64_t>>(),
                       reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type});
  }
  return layouts;
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
#endif

}  // namespace
}  // namespace torch_cudnn_handle

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace torch_cudnn_handle;
  m.doc() = "torch_cudnn_handle native core: the handle pool, the context guard, the op schemas";

#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif

  m.def("parse_device", [](py::handle device) { return parse_device(device); }, py::arg("device") = py::none(),
        "The ordinal `device` names (None = torch's current device); raises on a non-CUDA or "
        "out-of-range device.");

  // The testing seam: the real pool template with a handle that needs no GPU.
  m.def("_seam_reserve", &seam::reserve, py::arg("device"), py::call_guard<py::gil_scoped_release>());
  m.def("_seam_counts", [] {
    py::dict out;
    for (const auto& [device, counts] : seam::counts()) {
      out[py::int_(device)] = py::make_tuple(counts.created, counts.free);
    }
    return out;
  });
  m.def("_seam_set_create_delay_us", &seam::set_create_delay_us);
  m.def("_seam_max_concurrent_creates", &seam::max_concurrent_creates);

  m.def("_set_python_kernels", &python_kernels::set, py::arg("execute"), py::arg("execute_out"), py::arg("backward"));
  // The eager entry points: straight into the dispatcher (autograd, the CUDA kernel)
  // without torch.ops' generic argument parsing. Same op, same semantics.
  m.def(
      "execute", [](int64_t graph, std::vector<at::Tensor> inputs) { return execute_op().call(graph, inputs); },
      py::arg("graph"), py::arg("inputs"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "execute_out",
      [](int64_t graph, std::vector<at::Tensor> inputs, std::vector<at::Tensor> out) {
        execute_out_op().call(graph, inputs, out);
      },
      py::arg("graph"), py::arg("inputs"), py::kw_only(), py::arg("out"), py::call_guard<py::gil_scoped_release>());

#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
  py::class_<PooledCudnnHandle, std::unique_ptr<PooledCudnnHandle, py::nodelete>>(
      m, "PooledHandleState",
      "The pool's record of one backend handle (owned by the pool, never freed).")
      .def_property_readonly("backend_handle",
                             [](const PooledCudnnHandle& h) { return reinterpret_cast<intptr_t>(h.backend_handle); })
      .def_property_readonly("device", [](const PooledCudnnHandle& h) { return h.device; })
      .def_property(
          "stream", [](const PooledCudnnHandle& h) { return reinterpret_cast<intptr_t>(h.stream); },
          [](PooledCudnnHandle& h, intptr_t stream) { record_stream(&h, reinterpret_cast<cudaStream_t>(stream)); })
      .def_property_readonly("set_stream_calls",
                             [](const PooledCudnnHandle& h) { return h.set_stream_calls.load(); });

  m.def("_set_handle_factory", [](py::object factory) {
    delete handle_factory;
    handle_factory = new py::object(std::move(factory));
  });
  m.def("current_handle", &current_handle, py::arg("device") = py::none(), py::arg("stream") = py::none(),
        R"doc(This thread's pooled cuDNN handle for ``device``, ready to execute on ``stream``.

``device``: None (torch's current device), an int ordinal, ``"cuda:N"`` or a
``torch.device``. ``stream``: None (torch's current stream on that device), a
``torch.cuda.Stream`` or its ``cuda_stream`` int. On return the handle's stream is
``stream`` (``cudnnSetStream`` ran only if it changed) and the right CUDA context is
current on this thread (the stream's own for a real stream, else the device's). A CPU
device, an out-of-range ordinal or a stream of another device raises; so does the
first request of a thread while its stream is capturing a CUDA graph (warm up first),
and any request in a child forked after handles existed.)doc");
  m.def("pool_stats", &pool_stats,
        "{'devices': {ordinal: {'created', 'in_use', 'free'}}, 'set_stream_calls': n}: what the pool "
        "made per device, how many of those live threads hold, and how often it called cudnnSetStream.");
  m.def(
      "bind_context",
      [](py::handle device_arg, py::handle stream_arg) {
        const int device = parse_device(device_arg);
        context::ensure_current(device, parse_stream(stream_arg, device).stream, nullptr);
      },
      py::arg("device") = py::none(), py::arg("stream") = py::none(),
      "Make the right CUDA context current on this thread for work of `device` on `stream` "
      "(a real stream's own context, else the device's), for callers that launch through the "
      "driver themselves.");
  m.def("current_context_device", &context::current_context_device,
        "The device of the CUDA context current on this thread, or -1 when none is.");
  m.def(
      "native_register",
      [](int64_t graph, int device, const py::sequence& inputs, const py::sequence& outputs, std::vector<int64_t> uids,
         const py::bytes& plan_json) {
        auto plan = std::make_shared<const NativePlan>(device, std::string(plan_json), std::move(uids),
                                                       layouts_of(inputs), layouts_of(outputs));
        const int64_t workspace = plan->workspace_size();
        NativePlanTable::instance().add(graph, std::move(plan));
        return workspace;
      },
      "Deserialize a backend plan for `device` and let cudnn_fe.execute run it from C++ for "
      "exactly these input layouts; returns its workspace size.");
  m.def("native_forget", [](int64_t graph, int device, const py::sequence& inputs) {
    return NativePlanTable::instance().remove(graph, device, layouts_of(inputs));
  });
  m.def("native_plan_count", [] { return NativePlanTable::instance().size(); });
  m.def(
      "_native_breakdown",
      [](int64_t graph, std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs, int64_t calls) {
        return native_breakdown(graph, inputs, outputs, calls);
      },
      py::arg("graph"), py::arg("inputs"), py::arg("outputs"), py::arg("calls"),
      py::call_guard<py::gil_scoped_release>(), "bench/: host us per call of each step of a native execute (op/native_breakdown.h).");
  m.def("cudnn_library_path", [] { return backend::cudnn_library().path; });
  m.def("cudnn_backend_version", [] { return backend::cudnn_library().version(); });
#endif
}
