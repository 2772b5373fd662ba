// The native path's Python face: registering plans, their use, CUDA-graph keep-alive.
#include <torch/csrc/Dtype.h>
#include <torch/extension.h>

#include <c10/cuda/CUDAStream.h>

#include "backend/cudnn_library.h"
#include "bindings.h"
#include "native/graph_keepalive.h"
#include "native/native_plan.h"
#include "native/native_scratch.h"
#include "native/plan_graphs.h"

namespace py = pybind11;

namespace torch_cudnn_handle {
namespace {

using native::NativePlan;
using native::NativePlanTable;
using native::OperandLayout;
using native::PlanExtras;

// [(shape, stride, dtype[, host]), ...] from the Python registry (host: a host scalar).
std::vector<OperandLayout> layouts_of(const py::sequence& specs) {
  std::vector<OperandLayout> layouts;
  for (const auto& spec : specs) {
    auto fields = spec.cast<py::sequence>();
    py::handle dtype = fields[2];
    TORCH_CHECK_TYPE(THPDtype_Check(dtype.ptr()), "torch_cudnn_handle: a layout's dtype must be a torch.dtype");
    const bool host = fields.size() > 3 && fields[3].cast<bool>();
    layouts.push_back({fields[0].cast<std::vector<int64_t>>(), fields[1].cast<std::vector<int64_t>>(),
                       reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type, host});
  }
  return layouts;
}

PlanExtras extras_of(const py::sequence& by_value, int64_t fe_workspace_size, const py::sequence& workspace_tensors,
                     const py::sequence& replacements) {
  PlanExtras extras;
  for (const auto& item : by_value) {
    auto fields = item.cast<py::tuple>();
    extras.by_value.emplace_back(fields[0].cast<int64_t>(), fields[1].cast<std::string>());
  }
  extras.fe_workspace_size = fe_workspace_size;
  for (const auto& item : workspace_tensors) {
    auto fields = item.cast<py::tuple>();
    extras.workspace_tensors.push_back({fields[0].cast<int64_t>(), fields[1].cast<int64_t>(), fields[2].cast<int64_t>()});
  }
  for (const auto& item : replacements) {
    auto fields = item.cast<py::tuple>();
    extras.replacements.push_back({fields[0].cast<int64_t>(), fields[1].cast<int64_t>(), fields[2].cast<int64_t>()});
  }
  return extras;
}

}  // namespace

void bind_native(py::module& m) {
  m.def(
      "native_register",
      [](int64_t graph, int device, const py::sequence& inputs, const py::sequence& outputs, std::vector<int64_t> uids,
         const py::bytes& plan_json, const py::sequence& by_value, int64_t fe_workspace_size,
         const py::sequence& workspace_tensors, const py::sequence& replacements,
         std::vector<int64_t> output_positions, bool deterministic, const std::vector<int64_t>& tokens_of,
         bool cuda_graph) {
        auto input_layouts = layouts_of(inputs);
        auto output_layouts = layouts_of(outputs);
        TORCH_CHECK(tokens_of.empty() || tokens_of.size() == input_layouts.size() + output_layouts.size(),
                    "torch_cudnn_handle: tokens_of needs one entry per input and output");
        for (size_t i = 0; i < tokens_of.size(); ++i) {
          auto& layout = i < input_layouts.size() ? input_layouts[i] : output_layouts[i - input_layouts.size()];
          layout.tokens_of = tokens_of[i];
        }
        auto extras = extras_of(by_value, fe_workspace_size, workspace_tensors, replacements);
        std::string json(plan_json);
        std::shared_ptr<const NativePlan> plan;
        {
          py::gil_scoped_release no_gil;  // deserializing and finalizing a plan takes a while
          plan = std::make_shared<const NativePlan>(device, json, std::move(uids), std::move(input_layouts),
                                                    std::move(output_layouts), std::move(extras),
                                                    std::move(output_positions), deterministic, cuda_graph);
        }
        NativePlanTable::instance().add(graph, plan);
        const char* route = plan->cuda_graph_route();
        return py::make_tuple(plan->serial(), plan->workspace_size(), route ? py::object(py::str(route)) : py::object(py::none()));
      },
      py::arg("graph"), py::arg("device"), py::arg("inputs"), py::arg("outputs"), py::arg("uids"), py::arg("plan_json"),
      py::arg("by_value") = py::list(), py::arg("fe_workspace_size") = 0, py::arg("workspace_tensors") = py::list(),
      py::arg("replacements") = py::list(), py::arg("output_positions") = std::vector<int64_t>(),
      py::arg("deterministic") = false, py::arg("tokens_of") = std::vector<int64_t>(), py::arg("cuda_graph") = false,
      "Deserialize a backend plan for `device` and let cudnn_fe.execute run it from C++ for exactly "
      "these input layouts; returns (serial, workspace bytes, how its CUDA graphs are made or None). `deterministic`: the plan was chosen among "
      "deterministic engines only, so calls under torch.use_deterministic_algorithms(True) may run it. "
      "`tokens_of`: per operand (inputs, then outputs), the input whose first size a packed (ragged) "
      "operand has, whatever it is (-1: exact sizes); empty: none is packed. `cuda_graph`: the plan's "
      "engine supports cuDNN's native CUDA graph API, so cuDNN populates the graphs its calls launch; "
      "other plans' graphs are captured from their execute (plan_graphs.h).");
  m.def("set_native_cuda_graphs", &native::set_native_cuda_graphs, py::arg("enabled"),
        "Whether the native path may launch plans as CUDA graphs (plan_graphs.h); returns the previous setting.");
  m.def("native_cuda_graphs_enabled", &native::native_cuda_graphs_enabled);
  m.def(
      "native_cuda_graph_counts",
      [] {
        native::PlanGraphCounts counts;
        {
          py::gil_scoped_release no_gil;  // waits for each handle's call in flight
          counts = native::plan_graph_counts();
        }
        py::dict out;
        out["populated"] = counts.populated;
        out["captured"] = counts.captured;
        out["launched"] = counts.launched;
        out["failed"] = counts.failed;
        out["kept"] = counts.kept;
        return out;
      },
      "The native path's CUDA graphs, all handles together: populated by cuDNN, captured, launched, "
      "failed (could not be made), kept now.");
  m.def("forget_native_cuda_graphs", [] { return native::forget_native_graphs(0); }, py::call_guard<py::gil_scoped_release>(),
        "Destroy every kept CUDA graph of the native path; returns how many.");
  // Without the GIL: removing a plan waits on each handle's scratch mutex (its graphs),
  // which a thread holds across a call; no path holding one takes the GIL.
  m.def("native_forget", [](int64_t graph, uint64_t serial) { return NativePlanTable::instance().remove(graph, serial); },
        py::arg("graph"), py::arg("serial"), py::call_guard<py::gil_scoped_release>());
  m.def("native_last_used", [] { return NativePlanTable::instance().last_used(); },
        "serial -> when each native plan last ran (monotonic clock, ns; 0 = never).");
  m.def("native_calls", [] { return NativePlanTable::instance().calls(); }, "serial -> calls each native plan ran.");
  m.def("native_plan_count", [] { return NativePlanTable::instance().size(); });
  m.def("native_plans_alive", &NativePlan::alive,
        "Native plans alive: in the table, executing, or kept by a CUDA graph that captured them.");
  m.def(
      "keep_alive_while_captured",
      [](py::object owner) {
        auto* held = owner.release().ptr();  // one strong reference, dropped by release_dropped() (GIL held)
        std::shared_ptr<const void> keep(held, [](const void* object) {
          Py_DECREF(static_cast<PyObject*>(const_cast<void*>(object)));
        });
        return native::keep_alive_while_captured(c10::cuda::getCurrentCUDAStream().stream(), std::move(keep));
      },
      py::arg("owner"),
      "If torch's current stream is capturing a CUDA graph, keep `owner` alive until that graph is "
      "destroyed; returns whether it was capturing.");
  m.def("release_native_workspaces", &native::release_native_workspaces, py::call_guard<py::gil_scoped_release>(),
        "Free the native path's kept workspaces (see native_scratch.h); returns the bytes freed at once.");
  m.def("release_dropped", &native::release_dropped,
        "Release what destroyed CUDA graphs kept alive; returns how many. Call with the GIL held.");
  m.def("cudnn_library_path", [] { return backend::cudnn_library().path; });
  m.def("cudnn_backend_version", [] { return backend::cudnn_library().version(); });
}

}  // namespace torch_cudnn_handle
