import os
import sys
import threading

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def outcome_in_forked_child(action) -> str:
    """Fork, run ``action()`` in the child and return what happened there: "no error",
    or the message of the RuntimeError it raised. The child leaves with os._exit, so
    it runs nothing of the parent's (no atexit, no pytest teardown)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            action()
            message = b"no error"
        except RuntimeError as error:
            message = str(error).encode()
        os.write(write, message)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode()
    os.waitpid(pid, 0)
    return message


def run_concurrently(fn, count: int) -> list:
    """``[fn(0), ..., fn(count - 1)]``, each on its own new thread, all released
    together by a barrier; the first exception any thread raised is re-raised here."""
    barrier = threading.Barrier(count)
    results, errors = [None] * count, []

    def body(i):
        try:
            barrier.wait()
            results[i] = fn(i)
        except BaseException as error:  # noqa: BLE001 -- re-raised on the calling thread
            errors.append(error)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results
