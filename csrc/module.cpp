// torch_cudnn_handle._C: each part binds itself beside what it binds (bindings.h).
#include <torch/extension.h>
#include <torch/version.h>

#include "bindings.h"
#include "pool/pool_docs.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace torch_cudnn_handle;
  m.doc() = "torch_cudnn_handle native core: the handle pool, the context guard, the op, the native path";
#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
  // The torch whose headers this was compiled against ("2.13.0"): __init__.py compares it
  // with the torch it runs with, for a clear error instead of a crash or a wrong layout.
  m.attr("torch_version") = TORCH_VERSION;
  // The pool functions' docstrings, for both builds' Python faces (pool/pool_docs.h).
  pybind11::dict docs;
  docs["current_handle"] = pool_docs::kCurrentHandle;
  docs["pool_stats"] = pool_docs::kPoolStats;
  docs["bind_context"] = pool_docs::kBindContext;
  m.attr("pool_docs") = docs;
  bind_device_arguments(m);
  bind_op(m);
#ifdef TORCH_CUDNN_HANDLE_WITH_CUDA
  bind_pool(m);
  bind_native(m);
#endif
}
