"""A build process's program: builds graph descriptions it is sent, returns serialized plans.

Run by build_process.py as a script (``python build_worker.py``); the package imports it
only for the message framing the two share. It imports the frontend and the CUDA runtime
bindings only, so it starts in a fraction of a second, until a request sends a recipe
(below): describing one imports torch and the package, once per helper. Its parent speaks to it over its stdin and stdout in
messages (``read_message`` / ``write_message``: an 8-byte length, then a pickle); its
own prints go to stderr, which it shares with the parent. Note [The build process]
(build_process.py) says why it exists.

  1. hello: ``{"libcudnn": path or None, "backend_version": int}``; it loads that libcudnn
     (the parent's, so both build for the same cuDNN: a version that differs is refused;
     None where the parent has none) and answers ``{"ok": True, "pid": ...}`` or
     ``{"ok": False, "error": ...}`` and exits;
  2. each request ``{"device": ordinal, "description": the backend's JSON}``, or
     ``{"device": ordinal, "recipe": a pickled (definition, specs, as_written)}`` (a graph a
     Python engine family may claim, whose JSON is the frontend's own: the helper describes
     it itself, as the registry does): the graph is built exactly as the registry builds
     one untuned (``build([A, FALLBACK])``, the frontend's own plan walk) on a handle of its
     own for that device, and the answer is ``{"ok": True, "blob": serialized plan,
     "engine": name}``, or ``{"ok": False, "error": ...}`` (a Python engine's plan, which
     cannot travel, included);
  3. end of its stdin (the parent exited or let it go): it exits.

One request at a time; its handles (one per device) and CUDA contexts live as long as it does.
"""

import ctypes
import os
import pickle
import struct
import sys

_LENGTH = struct.Struct("<Q")


def read_message(stream):
    """The next message on ``stream``, or None at its end."""
    header = _read_exactly(stream, _LENGTH.size)
    if header is None:
        return None
    payload = _read_exactly(stream, _LENGTH.unpack(header)[0])
    if payload is None:
        return None
    return pickle.loads(payload)


def write_message(stream, message) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(payload)) + payload)
    stream.flush()


def _read_exactly(stream, size: int):
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _load_frontend(hello):
    """The frontend and the CUDA runtime bindings, on the parent's libcudnn."""
    path = hello.get("libcudnn")
    if path:
        # Loaded first and globally: the frontend's own dlopen of libcudnn.so.9 then finds this copy.
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    import cudnn
    from cuda.bindings import runtime

    if hello.get("backend_version") is not None and cudnn.backend_version() != hello["backend_version"]:
        raise RuntimeError(f"the build process loaded cuDNN {cudnn.backend_version()}, its parent runs {hello['backend_version']}")
    return cudnn, runtime


def _build(cudnn, runtime, handles: dict, request) -> dict:
    device = int(request["device"])
    if device not in handles:
        (status,) = runtime.cudaSetDevice(device)
        if int(status) != 0:
            raise RuntimeError(f"cudaSetDevice({device}) failed: {status}")
        handles[device] = cudnn.create_handle()
    runtime.cudaSetDevice(device)
    if "recipe" in request:
        graph = _described(handles[device], request["recipe"])
    else:
        graph = cudnn.pygraph(handle=handles[device])
        graph.deserialize(request["description"])
    graph.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    if getattr(graph, "selected_engine", None) is not None:
        return {"ok": False, "error": f"the walk selected the frontend's Python engine {graph.selected_engine.name!r}, whose plan "
                                      "is built in the caller's process"}
    try:  # what serves it, as registry/plans' engine_of names it
        engine = f"backend:{graph.get_plan_name_at_index(graph._plan_index)}"
    except Exception:  # noqa: BLE001 -- a name is a report, never a reason to fail a build
        engine = "backend"
    return {"ok": True, "blob": graph.serialize(as_bytes=True), "engine": engine}


def _described(handle, recipe: bytes):
    """The graph a recipe describes, described as the registry describes it (this imports the
    builder's module, so torch and the package)."""
    definition, specs, as_written = pickle.loads(recipe)
    from torch_cudnn_handle.registry.describe import describe

    return describe(definition, specs, handle, as_written=as_written).graph


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]  # its folder's modules are not top-level ones
    requests = sys.stdin.buffer
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # a stray print (cuDNN's, the frontend's) goes to stderr, never into the answers
    hello = read_message(requests)
    if hello is None:
        return
    try:
        cudnn, runtime = _load_frontend(hello)
    except BaseException as error:  # noqa: BLE001 -- told to the parent, which builds in-process
        write_message(answers, {"ok": False, "error": f"{type(error).__name__}: {error}"})
        return
    write_message(answers, {"ok": True, "pid": os.getpid()})
    handles = {}
    while True:
        request = read_message(requests)
        if request is None:
            return
        try:
            answer = _build(cudnn, runtime, handles, request)
        except BaseException as error:  # noqa: BLE001 -- one failed build is the parent's to handle
            answer = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        write_message(answers, answer)


if __name__ == "__main__":
    main()
