// The cuDNN C entry points this extension calls, taken from the libcudnn that the
// cuDNN frontend (`import cudnn`) already loaded into the process.
//
// Why it is safe: a pooled handle must be valid for the frontend's own execute, and a
// plan deserialized here must be executable with it, so everything must come from
// the same libcudnn instance. The frontend dlopen()s libcudnn.so.9 by path before
// anything here runs. We find the loaded copy by walking the process's link map
// (dl_iterate_phdr), insist that exactly one copy is loaded, and re-open that very
// file with RTLD_NOLOAD, which returns the already-loaded instance and never loads
// another. Every entry point is dlsym()ed from that handle, never resolved by global
// symbol lookup, so neither torch's own cuDNN linkage nor load order can hand us a
// different instance; two copies is an error. Only the C API (cudnn.h: plain
// functions, opaque handles and enums) is used, so no C++ ABI is shared with anyone.
#pragma once

#include <cudnn.h>

#include <string>

namespace torch_cudnn_handle::backend {

struct CudnnLibrary {
  std::string path;  // the loaded file
  decltype(&cudnnCreate) create = nullptr;
  decltype(&cudnnSetStream) set_stream = nullptr;
  decltype(&cudnnGetErrorString) error_string = nullptr;
  decltype(&cudnnGetVersion) version = nullptr;
  decltype(&cudnnBackendCreateDescriptor) create_descriptor = nullptr;
  decltype(&cudnnBackendDestroyDescriptor) destroy_descriptor = nullptr;
  decltype(&cudnnBackendSetAttribute) set_attribute = nullptr;
  decltype(&cudnnBackendGetAttribute) get_attribute = nullptr;
  decltype(&cudnnBackendFinalize) finalize = nullptr;
  decltype(&cudnnBackendExecute) execute = nullptr;
#if CUDNN_VERSION >= 90500
  // cuDNN's native CUDA graph API (declared from 9.5): null when the loaded libcudnn is older.
  decltype(&cudnnBackendPopulateCudaGraph) populate_cuda_graph = nullptr;
  decltype(&cudnnBackendUpdateCudaGraph) update_cuda_graph = nullptr;
#endif
};

// Resolved once, on first use; throws a clear error when libcudnn is not loaded or
// more than one copy is.
const CudnnLibrary& cudnn_library();

// Throws "torch_cudnn_handle: <what> failed: <cuDNN's message>" unless status is success.
void check_cudnn(cudnnStatus_t status, const char* what);

// A backend descriptor destroyed on every path out of a scope, unless released.
class ScopedDescriptor {
 public:
  explicit ScopedDescriptor(cudnnBackendDescriptorType_t type);  // a new one
  explicit ScopedDescriptor(cudnnBackendDescriptor_t adopted) : descriptor_(adopted) {}
  ~ScopedDescriptor();
  ScopedDescriptor(const ScopedDescriptor&) = delete;
  ScopedDescriptor& operator=(const ScopedDescriptor&) = delete;
  cudnnBackendDescriptor_t get() const { return descriptor_; }
  cudnnBackendDescriptor_t release();

 private:
  cudnnBackendDescriptor_t descriptor_ = nullptr;
};

// cudnnBackendSetAttribute, checked; `what` names the attribute in the error.
void set_attribute(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t name,
                   cudnnBackendAttributeType_t type, int64_t count, const void* values, const char* what);

}  // namespace torch_cudnn_handle::backend
