"""The pool's counts for one device (``tch.stats.pool()``) and a wait for its handles in use to
come back: test_pool_gpu.py's, which test_frontend_ops_gpu.py uses too."""

import time

import torch_cudnn_handle as tch


def device_counts(device=0):
    return tch.stats.pool()["devices"].get(device, {"created": 0, "in_use": 0, "free": 0})


def wait_for_in_use(expected, device=0, timeout=10.0):
    # Handles go back to the pool as each OS thread exits, a moment after join().
    deadline = time.monotonic() + timeout
    while device_counts(device)["in_use"] > expected:
        assert time.monotonic() < deadline, f"in_use stuck at {device_counts(device)}"
        time.sleep(0.001)
