#include "backend/cudnn_library.h"

#include <dlfcn.h>
#include <link.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <set>
#include <stdexcept>

namespace torch_cudnn_handle::backend {
namespace {

// True for ".../libcudnn.so" and ".../libcudnn.so.<anything>", not for the
// sub-libraries (libcudnn_graph.so.9, libcudnn_engines_*.so.9, ...).
bool is_cudnn_main_library(const char* path) {
  const char* base = std::strrchr(path, '/');
  base = base ? base + 1 : path;
  static constexpr char kName[] = "libcudnn.so";
  return std::strncmp(base, kName, sizeof(kName) - 1) == 0 &&
      (base[sizeof(kName) - 1] == '\0' || base[sizeof(kName) - 1] == '.');
}

int collect_cudnn(struct dl_phdr_info* info, size_t, void* out) {
  if (info->dlpi_name && *info->dlpi_name && is_cudnn_main_library(info->dlpi_name)) {
    char resolved[PATH_MAX];
    const char* path = realpath(info->dlpi_name, resolved) ? resolved : info->dlpi_name;
    static_cast<std::set<std::string>*>(out)->insert(path);
  }
  return 0;
}

template <typename Fn>
void bind(void* library, const std::string& path, const char* symbol, Fn& slot) {
  void* address = dlsym(library, symbol);
  if (!address) {
    throw std::runtime_error("torch_cudnn_handle: " + path + " has no symbol " + symbol);
  }
  slot = reinterpret_cast<Fn>(address);
}

CudnnLibrary load() {
  std::set<std::string> loaded;
  dl_iterate_phdr(&collect_cudnn, &loaded);
  if (loaded.empty()) {
    throw std::runtime_error(
        "torch_cudnn_handle: libcudnn is not loaded in this process. `import cudnn` (the "
        "nvidia-cudnn-frontend package) loads it; torch_cudnn_handle imports it first, so this "
        "means the frontend found no libcudnn: install nvidia-cudnn-cu12/cu13 or set LD_LIBRARY_PATH.");
  }
  if (loaded.size() > 1) {
    std::string paths;
    for (const auto& p : loaded) paths += "\n  " + p;
    throw std::runtime_error(
        "torch_cudnn_handle: more than one libcudnn is loaded in this process:" + paths +
        "\nA cuDNN handle from one copy is not valid in the other, so the pool cannot promise the "
        "frontend a usable handle. Make torch and the cuDNN frontend load the same file (unset "
        "LD_LIBRARY_PATH entries that point at a second cuDNN).");
  }
  CudnnLibrary lib;
  lib.path = *loaded.begin();
  void* handle = dlopen(lib.path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (!handle) {
    throw std::runtime_error("torch_cudnn_handle: could not re-open " + lib.path + ": " + dlerror());
  }
  // The reference taken by dlopen above is kept for the life of the process.
  bind(handle, lib.path, "cudnnCreate", lib.create);
  bind(handle, lib.path, "cudnnSetStream", lib.set_stream);
  bind(handle, lib.path, "cudnnGetErrorString", lib.error_string);
  bind(handle, lib.path, "cudnnGetVersion", lib.version);
  bind(handle, lib.path, "cudnnBackendCreateDescriptor", lib.create_descriptor);
  bind(handle, lib.path, "cudnnBackendDestroyDescriptor", lib.destroy_descriptor);
  bind(handle, lib.path, "cudnnBackendSetAttribute", lib.set_attribute);
  bind(handle, lib.path, "cudnnBackendGetAttribute", lib.get_attribute);
  bind(handle, lib.path, "cudnnBackendFinalize", lib.finalize);
  bind(handle, lib.path, "cudnnBackendExecute", lib.execute);
#if CUDNN_VERSION >= 90500
  lib.populate_cuda_graph =
      reinterpret_cast<decltype(lib.populate_cuda_graph)>(dlsym(handle, "cudnnBackendPopulateCudaGraph"));
  lib.update_cuda_graph = reinterpret_cast<decltype(lib.update_cuda_graph)>(dlsym(handle, "cudnnBackendUpdateCudaGraph"));
#endif
  return lib;
}

}  // namespace

const CudnnLibrary& cudnn_library() {
  // Leaked on purpose (Note [Leaked on purpose], pool/device_thread_handle_pool.h); a throw
  // here is retried on the next call.
  static const CudnnLibrary* lib = new CudnnLibrary(load());
  return *lib;
}

void check_cudnn(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("torch_cudnn_handle: ") + what + " failed: " +
                             cudnn_library().error_string(status));
  }
}

ScopedDescriptor::ScopedDescriptor(cudnnBackendDescriptorType_t type) {
  check_cudnn(cudnn_library().create_descriptor(type, &descriptor_), "cudnnBackendCreateDescriptor");
}

ScopedDescriptor::~ScopedDescriptor() {
  if (descriptor_) cudnn_library().destroy_descriptor(descriptor_);
}

cudnnBackendDescriptor_t ScopedDescriptor::release() {
  auto descriptor = descriptor_;
  descriptor_ = nullptr;
  return descriptor;
}

void set_attribute(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t name,
                   cudnnBackendAttributeType_t type, int64_t count, const void* values, const char* what) {
  check_cudnn(cudnn_library().set_attribute(descriptor, name, type, count, values), what);
}

}  // namespace torch_cudnn_handle::backend
