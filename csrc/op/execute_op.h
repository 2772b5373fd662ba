// Typed handles of the cudnn_fe ops, for calls from C++ through the dispatcher.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <vector>

namespace torch_cudnn_handle {

inline const c10::TypedOperatorHandle<std::vector<at::Tensor>(int64_t, at::TensorList)>& execute_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cudnn_fe::execute", "")
                             .typed<std::vector<at::Tensor>(int64_t, at::TensorList)>();
  return op;
}

inline const c10::TypedOperatorHandle<void(int64_t, at::TensorList, at::TensorList)>& execute_out_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cudnn_fe::execute", "out")
                             .typed<void(int64_t, at::TensorList, at::TensorList)>();
  return op;
}

inline const c10::TypedOperatorHandle<std::vector<at::Tensor>(int64_t, at::TensorList, at::TensorList)>&
execute_in_place_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cudnn_fe::execute_", "")
                             .typed<std::vector<at::Tensor>(int64_t, at::TensorList, at::TensorList)>();
  return op;
}

}  // namespace torch_cudnn_handle
