// The two backend descriptors built from data at run time, for the native path
// (csrc/native) and the bench-only extensions alike: an execution plan deserialized
// from its JSON, and a variant pack. The caller owns what they return.
#pragma once

#include <c10/util/ArrayRef.h>
#include <cudnn.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torch_cudnn_handle::backend {

// A backend execution plan from its JSON representation, finalized with `handle` (so
// for that handle's device).
cudnnBackendDescriptor_t deserialize_plan(const std::string& plan_json, cudnnHandle_t handle);

// A variant pack for `uids` and `pointers` (one per uid) with `workspace`.
cudnnBackendDescriptor_t make_variant_pack(const std::vector<int64_t>& uids, c10::ArrayRef<void*> pointers,
                                           void* workspace);

}  // namespace torch_cudnn_handle::backend
