#pragma once

#include <cstdint>
#include <map>

#include "pool/device_thread_handle_pool.h"

namespace torch_cudnn_handle::seam {

int64_t reserve(int device);  // this thread's seam handle id for `device`
std::map<int, DeviceHandleCounts> counts();
void set_create_delay_us(int us);  // make creation slow, to observe it overlap
int max_concurrent_creates();

}  // namespace torch_cudnn_handle::seam
