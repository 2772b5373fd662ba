// What a CUDA graph's replays need, kept alive as long as that graph.
//
// A captured cuDNN call leaves kernel nodes whose code and parameters belong to the
// plan that launched them (a runtime-compiled engine's module, a frost plan's compiled
// kernels). The registry may evict that plan while the graph still exists, so a call
// made during capture hands the plan's owner to the graph being captured, through a
// CUDA user object (cudaStreamGetCaptureInfo + cudaUserObjectCreate +
// cudaGraphRetainUserObject, as the CUDA programming guide shows): the graph and every
// executable instantiated from it hold a reference, and CUDA drops the last one when
// they are all destroyed.
//
// CUDA runs that release on an internal thread where no CUDA call (and no Python) is
// allowed, so it only moves the owner to a list; release_dropped() destroys them later
// on an ordinary thread (the registry calls it, with the GIL held, on every build).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

namespace torch_cudnn_handle::native {

// If `stream` is capturing, `owner` lives until the graph being captured (and its
// executables) are destroyed and release_dropped() runs. Returns whether it was captured.
bool keep_alive_while_captured(cudaStream_t stream, std::shared_ptr<const void> owner);

// Destroys the owners of graphs CUDA has destroyed since the last call. Callers that
// may drop Python objects hold the GIL. Returns how many were released.
size_t release_dropped();

}  // namespace torch_cudnn_handle::native
