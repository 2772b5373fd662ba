// The docstrings of the pool's public functions, one copy for both builds: the CUDA
// build binds them on the functions (pool/bindings.cpp); the CPU build, which has no
// pool, exports them as _C.pool_docs for the Python stand-ins that refuse (pool.py).
#pragma once

namespace torch_cudnn_handle {
namespace pool_docs {

constexpr const char* kCurrentHandle =
    R"doc(This thread's pooled cuDNN handle for ``device``, ready to execute on ``stream``.

``device``: None (torch's current device), an int ordinal, ``"cuda:N"`` or a
``torch.device``. ``stream``: None (torch's current stream on that device), a
``torch.cuda.Stream`` or its ``cuda_stream`` int. On return the handle's stream is
``stream`` (``cudnnSetStream`` ran only if it changed). The calling thread's CUDA context
(and so torch's current device) is left as it was, except that a thread with no context
at all gets the device's. To run the frontend's own ``graph.execute`` with a handle of
another device, do it under ``torch.cuda.device(device)``. A CPU device, an out-of-range
ordinal or a stream of another device raises; so does the first request of a thread
while its stream is capturing a CUDA graph (warm up first), and any request in a child
forked after handles existed.)doc";

constexpr const char* kPoolStats =
    "{'devices': {ordinal: {'created', 'in_use', 'free'}}, 'set_stream_calls': n}: what the pool "
    "made per device, how many of those live threads hold, and how often it called cudnnSetStream.";

constexpr const char* kBindContext =
    "Make the right CUDA context current on this thread for work of `device` on `stream` "
    "(a real stream's own context, else the device's) and leave it current, for callers that "
    "launch through the driver themselves. The one call of this library that changes the "
    "caller's context on purpose.";

}  // namespace pool_docs
}  // namespace torch_cudnn_handle
