#include "pool/device_arguments.h"

#include <torch/csrc/Device.h>

#include <optional>
#include <string>

#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "bindings.h"

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

int check_ordinal(int64_t ordinal) {
  const int count = visible_device_count();
  TORCH_CHECK_VALUE(ordinal >= 0 && ordinal < count, "torch_cudnn_handle: cuda:", ordinal,
                    " does not exist: this process sees ", count, " CUDA device(s)",
                    count ? " (ordinals 0.." + std::to_string(count - 1) + ")" : std::string(), ". ", kDeviceHint);
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

}  // namespace

int parse_device(py::handle device) {
  if (device.is_none()) return current_ordinal();
  if (py::isinstance<py::bool_>(device)) {
    TORCH_CHECK_TYPE(false, "torch_cudnn_handle: a bool is not a device. ", kDeviceHint);
  }
  if (py::isinstance<py::int_>(device)) return check_ordinal(device.cast<int64_t>());
  if (py::isinstance<py::str>(device)) {
    // torch's parser keeps the index in 8 bits ("cuda:999" would wrap): read N here.
    const auto text = device.cast<std::string>();
    static const std::string kCudaPrefix = "cuda:";
    if (text.rfind(kCudaPrefix, 0) == 0 && text.size() > kCudaPrefix.size() &&
        text.find_first_not_of("0123456789", kCudaPrefix.size()) == std::string::npos &&
        text.size() - kCudaPrefix.size() < 10) {
      return check_ordinal(std::stoll(text.substr(kCudaPrefix.size())));
    }
  } else if (!THPDevice_Check(device.ptr())) {
    TORCH_CHECK_TYPE(false, "torch_cudnn_handle: expected a device, got ",
                     py::str(py::type::of(device).attr("__name__")).cast<std::string>(), ". ", kDeviceHint);
  }
  // torch.device objects and the other device strings: torch's own rules.
  std::optional<c10::Device> parsed;
  try {
    parsed.emplace(THPDevice_Check(device.ptr()) ? reinterpret_cast<THPDevice*>(device.ptr())->device
                                                 : c10::Device(device.cast<std::string>()));
  } catch (const c10::Error&) {
    TORCH_CHECK_VALUE(false, "torch_cudnn_handle: '", device.cast<std::string>(), "' is not a device string. ",
                      kDeviceHint);
  }
  TORCH_CHECK_VALUE(parsed->is_cuda(), "torch_cudnn_handle: cuDNN handles live on CUDA devices; got '",
                    parsed->str(), "'. ", kDeviceHint);
  return parsed->has_index() ? check_ordinal(parsed->index()) : current_ordinal();
}

#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
namespace {
constexpr const char* kStreamHint = "Pass None (torch's current stream), a torch.cuda.Stream, or its .cuda_stream int.";
}  // namespace

ParsedStream parse_stream(py::handle stream, int device) {
  if (stream.is_none()) {
    return {c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream(), true};
  }
  if (py::isinstance<py::int_>(stream) && !py::isinstance<py::bool_>(stream)) {
    const auto raw = stream.cast<int64_t>();
    TORCH_CHECK_VALUE(raw >= 0, "torch_cudnn_handle: ", raw, " is not a CUDA stream handle. ", kStreamHint);
    return {reinterpret_cast<cudaStream_t>(static_cast<intptr_t>(raw)), false};
  }
  if (py::hasattr(stream, "cuda_stream") && py::hasattr(stream, "device_index")) {
    const auto stream_device = stream.attr("device_index").cast<int64_t>();
    TORCH_CHECK_VALUE(stream_device == device, "torch_cudnn_handle: the stream is on cuda:", stream_device,
                      " but the handle is for cuda:", device, ". Use a stream of cuda:", device, ".");
    return {reinterpret_cast<cudaStream_t>(static_cast<intptr_t>(stream.attr("cuda_stream").cast<int64_t>())), true};
  }
  TORCH_CHECK_TYPE(false, "torch_cudnn_handle: expected a stream, got ",
                   py::str(py::type::of(stream).attr("__name__")).cast<std::string>(), ". ", kStreamHint);
}
#endif

void bind_device_arguments(py::module& m) {
  m.def("parse_device", [](py::handle device) { return parse_device(device); }, py::arg("device") = py::none(),
        "The ordinal `device` names (None = torch's current device); raises on a non-CUDA or "
        "out-of-range device.");
}

}  // namespace torch_cudnn_handle
