// torch_cudnn_handle._C: each part binds itself beside what it binds (bindings.h).
#include <torch/extension.h>

#include "bindings.h"
#include "pool/pool_seam.h"

namespace py = pybind11;

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
}
