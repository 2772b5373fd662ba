// torch_cudnn_handle._C: each part binds itself beside what it binds (bindings.h).
#include <torch/extension.h>

#include "bindings.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace torch_cudnn_handle;
  m.doc() = "torch_cudnn_handle native core: the handle pool, the context guard, the op, the native path";
#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
  bind_device_arguments(m);
  bind_op(m);
#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
  bind_pool(m);
  bind_native(m);
#endif
}
