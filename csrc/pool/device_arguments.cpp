#include "pool/device_arguments.h"

#include <torch/csrc/Device.h>

#include <cstdlib>
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

// For an argument that is not a device at all: what to pass instead.
constexpr const char* kDeviceHint =
    "Pass a CUDA device: an int ordinal, 'cuda:N', torch.device('cuda', N), or a CUDA "
    "tensor's .device.";

std::string python_str(const py::handle& object) { return py::str(object).cast<std::string>(); }

// When this process sees no GPU at all, a well-formed device ("cuda:0", 0, None, "cuda")
// is not the mistake: say what is (this torch has no CUDA, or no GPU is visible to it)
// and the fix. Only on this error path, so the imports and the runtime query cost nothing
// on a call's path. `subject` names what was asked for ("cannot use cuda:0").
[[noreturn]] void throw_no_visible_device(const std::string& subject) {
  const py::module_ torch = py::module_::import("torch");
  const std::string version = python_str(torch.attr("__version__"));
#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
  // A CUDA torch that sees no device: no GPU, no (or a too old) driver, a container
  // started without its GPUs, or CUDA_VISIBLE_DEVICES hiding them. torch's count keeps
  // no reason (a runtime error reads as 0 devices); ask the runtime for it.
  int runtime_count = 0;
  const cudaError_t status = cudaGetDeviceCount(&runtime_count);
  (void)cudaGetLastError();  // leave no error behind for torch's next CUDA call
  const std::string runtime_says =
      status == cudaSuccess ? std::string("the CUDA runtime counts ") + std::to_string(runtime_count) + " device(s)"
                            : std::string("the CUDA runtime says: ") + cudaGetErrorString(status);
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string visible_fix =
      visible == nullptr ? std::string()
                         : std::string(" CUDA_VISIBLE_DEVICES is '") + visible +
                               "' in this process: it can hide every GPU, so unset it or name a GPU nvidia-smi lists.";
  TORCH_CHECK(false, "torch_cudnn_handle: ", subject, ": no CUDA GPU is visible to this process (torch ", version,
              " has CUDA ", python_str(torch.attr("version").attr("cuda")),
              ", but torch.cuda.is_available() is False; ", runtime_says,
              "). Run on a machine whose NVIDIA GPU and driver work (nvidia-smi lists the GPU); in a container, "
              "start it with the GPUs passed in (e.g. docker run --gpus all).",
              visible_fix);
#else
  TORCH_CHECK(false, "torch_cudnn_handle: ", subject, ": this torch (", version,
              ") is a CPU-only build without CUDA (torch.version.cuda is None), so no GPU can be used, and "
              "torch_cudnn_handle was compiled against it without its cuDNN handle pool. Install a CUDA build of "
              "torch (https://pytorch.org/get-started/locally/) on a machine with an NVIDIA GPU, then rebuild this "
              "package against it: pip install --no-build-isolation -e .");
#endif
}

int check_ordinal(int64_t ordinal) {
  TORCH_CHECK_VALUE(ordinal >= 0, "torch_cudnn_handle: cuda:", ordinal,
                    " does not exist: CUDA device ordinals start at 0. ", kDeviceHint);
  const int count = visible_device_count();
  if (count == 0) throw_no_visible_device("cannot use cuda:" + std::to_string(ordinal));
  TORCH_CHECK_VALUE(ordinal < count, "torch_cudnn_handle: cuda:", ordinal,
                    " does not exist: this process sees ", count, " CUDA device(s) (ordinals 0..",
                    count - 1, "). ", kDeviceHint);
  return static_cast<int>(ordinal);
}

int current_ordinal() {
  if (visible_device_count() == 0) throw_no_visible_device("there is no current CUDA device to take a cuDNN handle for");
#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
  return c10::cuda::current_device();
#else
  return -1;  // not reached: a build without CUDA sees no device
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
                     python_str(py::type::of(device).attr("__name__")), ". ", kDeviceHint);
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
                   python_str(py::type::of(stream).attr("__name__")), ". ", kStreamHint);
}
#endif

void bind_device_arguments(py::module& m) {
  m.def("parse_device", [](py::handle device) { return parse_device(device); }, py::arg("device") = py::none(),
        "The ordinal `device` names (None = torch's current device); raises on a non-CUDA or "
        "out-of-range device.");
}

}  // namespace torch_cudnn_handle
