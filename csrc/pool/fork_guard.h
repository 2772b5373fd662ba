// Handles and CUDA contexts do not survive fork(): the child inherits the parent's
// memory, including every thread's pool window, but not its CUDA state. Once any
// pool in this process has created a handle, a forked child must not touch a pool.
#pragma once

namespace torch_cudnn_handle {

// Called by a pool after it creates a handle. Installs the fork handler once.
void note_handle_created();

// Throws a clear error in a child forked after handles were created.
void check_not_forked();

}  // namespace torch_cudnn_handle
