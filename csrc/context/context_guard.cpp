#include "context/context_guard.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>

namespace torch_cudnn_handle::context {
namespace {

// Driver entry points, resolved through the CUDA runtime torch already loaded
// (cudaGetDriverEntryPointByVersion), so the extension never links libcuda itself.
struct DriverApi {
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*ctx_set_current)(CUcontext) = nullptr;
  CUresult (*ctx_get_device)(CUdevice*) = nullptr;
  CUresult (*stream_get_ctx)(CUstream, CUcontext*) = nullptr;
  CUresult (*ctx_push_current)(CUcontext) = nullptr;
  CUresult (*ctx_pop_current)(CUcontext*) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice) = nullptr;
};

template <typename Fn>
void resolve(const char* name, unsigned version, Fn& slot) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  cudaError_t err = cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &found);
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
    cudaGetLastError();  // do not leave a sticky-looking error for torch to find
    throw std::runtime_error(std::string("torch_cudnn_handle: the CUDA driver has no ") + name);
  }
  slot = reinterpret_cast<Fn>(fn);
}

const DriverApi& driver() {
  static const DriverApi api = [] {
    DriverApi a;
    resolve("cuCtxGetCurrent", 12000, a.ctx_get_current);
    resolve("cuCtxSetCurrent", 12000, a.ctx_set_current);
    resolve("cuCtxGetDevice", 12000, a.ctx_get_device);
    resolve("cuStreamGetCtx", 12000, a.stream_get_ctx);
    resolve("cuCtxPushCurrent", 12000, a.ctx_push_current);
    resolve("cuCtxPopCurrent", 12000, a.ctx_pop_current);
    resolve("cuDeviceGet", 12000, a.device_get);
    resolve("cuDevicePrimaryCtxRetain", 12000, a.primary_ctx_retain);
    return a;
  }();
  return api;
}

void check(CUresult result, const char* what) {
  if (result != CUDA_SUCCESS) {
    throw std::runtime_error(std::string("torch_cudnn_handle: ") + what +
                             " failed with CUDA driver error " + std::to_string(result));
  }
}

// Primary contexts, retained once per device and never released: a retain per call
// would grow the usage count without bound, and releasing at exit races teardown.
// Read lock-free on every call; written once per device under the mutex.
constexpr int kMaxDevices = 256;
std::array<std::atomic<CUcontext>, kMaxDevices> primary_contexts{};
std::mutex primary_mutex;

CUcontext primary_context(int device) {
  if (device < 0 || device >= kMaxDevices) {
    throw std::out_of_range("torch_cudnn_handle: device ordinal " + std::to_string(device) + " out of range");
  }
  if (CUcontext known = primary_contexts[device].load(std::memory_order_acquire)) return known;
  std::lock_guard<std::mutex> lock(primary_mutex);
  if (CUcontext known = primary_contexts[device].load(std::memory_order_relaxed)) return known;
  CUdevice handle;
  CUcontext primary = nullptr;
  check(driver().device_get(&handle, device), "cuDeviceGet");
  check(driver().primary_ctx_retain(&primary, handle), "cuDevicePrimaryCtxRetain");
  primary_contexts[device].store(primary, std::memory_order_release);
  return primary;
}

}  // namespace

bool is_default_stream(cudaStream_t stream) {
  auto raw = reinterpret_cast<uintptr_t>(stream);
  return raw == 0 || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD;
}

CUcontext context_of_stream(cudaStream_t stream) {
  if (is_default_stream(stream)) return nullptr;
  CUcontext ctx = nullptr;
  check(driver().stream_get_ctx(reinterpret_cast<CUstream>(stream), &ctx), "cuStreamGetCtx");
  return ctx;
}

int device_of_stream(cudaStream_t stream) {
  // Not cuStreamGetDevice: it is not capture-safe (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
  // invalidates a capture in progress), while cuStreamGetCtx and a push/pop are.
  CUcontext ctx = context_of_stream(stream);
  if (ctx == nullptr) return -1;
  const DriverApi& api = driver();
  check(api.ctx_push_current(ctx), "cuCtxPushCurrent");
  CUdevice device;
  CUresult result = api.ctx_get_device(&device);
  CUcontext popped;
  check(api.ctx_pop_current(&popped), "cuCtxPopCurrent");
  check(result, "cuCtxGetDevice");
  return static_cast<int>(device);
}

CUcontext current_context() {
  CUcontext current = nullptr;
  check(driver().ctx_get_current(&current), "cuCtxGetCurrent");
  return current;
}

int current_context_device() {
  if (current_context() == nullptr) return -1;
  CUdevice device;
  check(driver().ctx_get_device(&device), "cuCtxGetDevice");
  return static_cast<int>(device);
}

namespace {

// The context that work of `device` on `stream` must run in, given the one current.
CUcontext target_context(int device, cudaStream_t stream, CUcontext stream_context, CUcontext current) {
  if (!is_default_stream(stream)) {
    return stream_context ? stream_context : context_of_stream(stream);
  }
  CUcontext primary = primary_context(device);
  if (current == primary || current == nullptr) return primary;
  CUdevice current_device;
  // Someone else's context on the right device (e.g. one they created) is kept.
  if (driver().ctx_get_device(&current_device) == CUDA_SUCCESS && current_device == device) return current;
  return primary;
}

}  // namespace

void bind(int device, cudaStream_t stream, CUcontext stream_context) {
  CUcontext current = current_context();
  CUcontext target = target_context(device, stream, stream_context, current);
  if (target != current) check(driver().ctx_set_current(target), "cuCtxSetCurrent");
}

ContextGuard::ContextGuard(int device, cudaStream_t stream, CUcontext stream_context) {
  previous_ = current_context();
  CUcontext target = target_context(device, stream, stream_context, previous_);
  if (target != previous_) {
    check(driver().ctx_set_current(target), "cuCtxSetCurrent");
    restore_ = previous_ != nullptr;
  }
}

ContextGuard::~ContextGuard() {
  // Putting back a context we read a moment ago cannot fail short of a driver in ruin;
  // a destructor must not throw, so the result is not checked.
  if (restore_) driver().ctx_set_current(previous_);
}

}  // namespace torch_cudnn_handle::context
