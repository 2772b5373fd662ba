"""adopt_frontend_ops() without a GPU: the seams it patches, the version guard, refusals.

These fail when the installed frontend changes a handle cache adoption relies on: a seam
moves, changes its signature, stops making the handles, or a new handle factory appears.
Every test leaves the process unadopted (the autouse fixture restores).
"""

import ast
import importlib
import importlib.util
import pathlib
import subprocess
import sys
import types

import cudnn
import pytest
import torch

from conftest import run_concurrently

# The frontend's gated attention block imports the CuTe DSL (cutlass), which the frontend's
# own requirements bring (CI has it). Where it is missing, adoption skips that seam with a
# warning, which the tests below do not expect: they need every seam importable.
pytestmark = pytest.mark.dsl
from torch_cudnn_handle import frontend_ops
from torch_cudnn_handle.frontend_ops import SEAMS, adopt_frontend_ops, check_frontend_version, restore_frontend_ops

# The spec, written independently of the module's table: seam -> (module defining the
# frontend's function, its parameters, the names in its module that create handles).
EXPECTED_SEAMS = {
    "cudnn.sdpa.fwd.torch_op._get_handle": ("cudnn.sdpa.fwd.torch_op", "(device)", {"_get_handle"}),
    "cudnn.ops.norm._common.get_handle": ("cudnn.ops.norm._common", "(device)", {"get_handle"}),
    "cudnn.ops.norm.rmsnorm.get_handle": ("cudnn.ops.norm._common", "(device)", set()),
    "cudnn.ops.norm.layernorm.get_handle": ("cudnn.ops.norm._common", "(device)", set()),
    "cudnn.gemm.ops.moe_grouped_matmul._get_handle": ("cudnn.gemm.ops.moe_grouped_matmul", "(device)", {"_get_handle"}),
    "cudnn.gemm.ops.swiglu_moe._cudnn_handle": ("cudnn.gemm.ops.swiglu_moe", "(tensor)", {"_cudnn_handle"}),
    "cudnn.gemm.ops.swiglu_mlp._handle": ("cudnn.gemm.ops.swiglu_mlp", "(device)", {"_handle"}),
    "cudnn.linear_attention.ops.common.get_handle": ("cudnn.linear_attention.ops.common", "(device, stream=None)", {"get_handle"}),
    "cudnn.gated_attention_block.kernels.proj_gemm.handle_for_stream": (
        "cudnn.gated_attention_block.kernels.proj_gemm",
        "(device, stream)",
        {"handle_for_stream"},
    ),
}

# Files of the installed frontend that call create_handle and are deliberately not adopted.
KNOWN_UNADOPTED = {
    "__init__.py": "cudnn.create_handle itself",
    "_pygraph.py": "the graph API's default handle for a pygraph built without one (lowering only, destroyed at exit)",
    "wrapper.py": "cudnn.Graph(handle='auto')'s per-thread handle: the user graph API, with its destroy_default_handle()",
    "native_sparse_attention/sliding_window_attention/api.py": "one handle per attention object, or the caller's",
    "triangle_attention/api.py": "one handle per compiled plan object",
    "deepseek_sparse_attention/aligned_hca_backward/_gemms.py": "one handle per GEMM plan object",
}

SEAM_BY_NAME = {seam.name: seam for seam in SEAMS}


@pytest.fixture(autouse=True)
def leave_unadopted():
    yield
    restore_frontend_ops()


def seam_value(seam):
    return getattr(importlib.import_module(seam.module), seam.attribute, None)


def assert_nothing_adopted():
    replaced = [seam.name for seam in SEAMS if seam_value(seam) is seam.replacement]
    assert replaced == [], f"half-adopted: {replaced}"
    assert restore_frontend_ops() == []


def test_adoption_covers_exactly_the_expected_seams():
    assert set(SEAM_BY_NAME) == set(EXPECTED_SEAMS)
    for name, (defined_in, signature, _factories) in EXPECTED_SEAMS.items():
        seam = SEAM_BY_NAME[name]
        assert (seam.defined_in, seam.signature) == (defined_in, signature), name
        assert frontend_ops.plain_signature(seam.replacement) == signature, f"{name}: the replacement must take the same arguments"


@pytest.mark.parametrize("name", sorted(EXPECTED_SEAMS))
def test_seam_has_its_expected_shape_and_adoption_makes_it_the_pools(name):
    defined_in, signature, factories = EXPECTED_SEAMS[name]
    seam = SEAM_BY_NAME[name]
    module = importlib.import_module(seam.module)
    original = getattr(module, seam.attribute)
    # The installed frontend still has the seam as this adoption knows it.
    assert isinstance(original, types.FunctionType) and original.__module__ == defined_in
    assert frontend_ops.plain_signature(original) == signature
    assert "create_handle" in original.__code__.co_names, f"{name} no longer creates the op's handles"
    assert frontend_ops.handle_factories(module) == factories, f"{seam.module} makes handles elsewhere too"
    # After adoption the op reads the pool's function there; restoring gives the frontend's back.
    assert name in adopt_frontend_ops()
    assert getattr(module, seam.attribute) is seam.replacement
    assert restore_frontend_ops() and getattr(module, seam.attribute) is original


def test_installed_frontend_is_the_release_adoption_was_written_for():
    check_frontend_version()
    assert cudnn.__version__.startswith(frontend_ops.WRITTEN_FOR + ".")


@pytest.mark.parametrize("version", ["1.32.0", "1.32.7", "1.32.0rc1"])
def test_version_guard_accepts_the_1_32_series(version):
    check_frontend_version(version)


@pytest.mark.parametrize("version", ["1.31.9", "1.33.0", "2.32.0", "1.3.2", "1.320.0"])
def test_version_guard_refuses_other_releases(version):
    with pytest.raises(RuntimeError) as refusal:
        check_frontend_version(version)
    message = str(refusal.value)
    assert f"but {version} is installed" in message and "written for nvidia-cudnn-frontend 1.32.x" in message
    assert "nvidia-cudnn-frontend==1.32.*" in message and "do not call adopt_frontend_ops()" in message


def test_another_installed_release_adopts_nothing(monkeypatch):
    monkeypatch.setattr(cudnn, "__version__", "1.33.0")
    with pytest.raises(RuntimeError, match="but 1.33.0 is installed"):
        adopt_frontend_ops()
    assert_nothing_adopted()


def test_adoption_is_idempotent_and_restorable():
    adopted = adopt_frontend_ops()
    assert adopted == [seam.name for seam in SEAMS]
    assert adopt_frontend_ops() == adopted
    assert all(seam_value(seam) is seam.replacement for seam in SEAMS)
    assert restore_frontend_ops() == adopted
    assert_nothing_adopted()


def test_concurrent_adoptions_adopt_once():
    results = run_concurrently(lambda _: adopt_frontend_ops(), 8)
    assert all(result == results[0] for result in results)
    restore_frontend_ops()
    # Adopting twice would have saved a replacement as "the original": it would still be there.
    assert_nothing_adopted()


def test_restore_refuses_to_undo_a_later_replacement(monkeypatch):
    adopt_frontend_ops()
    seam = SEAM_BY_NAME["cudnn.sdpa.fwd.torch_op._get_handle"]
    monkeypatch.setattr(importlib.import_module(seam.module), seam.attribute, lambda device: None)
    with pytest.raises(RuntimeError, match=r"_get_handle was replaced again after adoption"):
        restore_frontend_ops()
    monkeypatch.undo()


def frontend_function(module, parameters, makes_handles=True):
    """A stand-in for a frontend function, defined as if in ``module``."""
    body = "cudnn.create_handle()" if makes_handles else "None"
    namespace = {"cudnn": cudnn}
    exec(f"def changed{parameters}:\n    return {body}\n", namespace)
    function = namespace["changed"]
    function.__module__ = module
    return function


CHANGES = {
    "seam gone": (None, "has no _get_handle"),
    "new signature": (lambda: frontend_function("cudnn.sdpa.fwd.torch_op", "(device, stream=None)"), r"expected _get_handle\(device\), found _get_handle\(device, stream=None\)"),
    "no longer makes handles": (lambda: frontend_function("cudnn.sdpa.fwd.torch_op", "(device)", makes_handles=False), "no longer calls cudnn.create_handle"),
    "not a frontend function": (lambda: frontend_function("somewhere.else", "(device)"), "expected a function defined in cudnn.sdpa.fwd.torch_op"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_changed_seam_is_refused_by_name_and_nothing_is_adopted(change, monkeypatch):
    make, problem = CHANGES[change]
    module = importlib.import_module("cudnn.sdpa.fwd.torch_op")
    if make is None:
        monkeypatch.delattr(module, "_get_handle")
    else:
        monkeypatch.setattr(module, "_get_handle", make())
    with pytest.raises(RuntimeError, match=problem) as refusal:
        adopt_frontend_ops()
    assert "cudnn.sdpa.fwd.torch_op._get_handle is not the handle cache" in str(refusal.value)
    assert "Nothing was adopted" in str(refusal.value)
    monkeypatch.undo()
    assert_nothing_adopted()


def test_a_second_handle_factory_beside_a_seam_is_refused(monkeypatch):
    module = importlib.import_module("cudnn.gemm.ops.swiglu_mlp")
    monkeypatch.setattr(module, "_another_cache", frontend_function(module.__name__, "(device)"), raising=False)
    with pytest.raises(RuntimeError, match="cudnn.gemm.ops.swiglu_mlp also makes handles in _another_cache"):
        adopt_frontend_ops()
    monkeypatch.undo()
    assert_nothing_adopted()


def failing_import(module_name, missing):
    """importlib as frontend_ops sees it, with ``module_name`` failing for want of ``missing``."""

    def import_module(name):
        if name == module_name:
            raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)
        return importlib.import_module(name)

    return types.SimpleNamespace(import_module=import_module)


def test_a_seam_whose_optional_dependency_is_missing_is_skipped_with_a_warning(monkeypatch):
    seam = SEAM_BY_NAME["cudnn.gated_attention_block.kernels.proj_gemm.handle_for_stream"]
    monkeypatch.setattr(frontend_ops, "importlib", failing_import(seam.module, "cutlass"))
    with pytest.warns(RuntimeWarning, match=r"handle_for_stream not adopted: .* needs 'cutlass'"):
        adopted = adopt_frontend_ops()
    assert adopted == [other.name for other in SEAMS if other is not seam]
    assert seam_value(seam) is not seam.replacement


def test_a_frontend_module_that_is_gone_is_refused(monkeypatch):
    seam = SEAM_BY_NAME["cudnn.linear_attention.ops.common.get_handle"]
    monkeypatch.setattr(frontend_ops, "importlib", failing_import(seam.module, seam.module))
    with pytest.raises(RuntimeError, match=r"common.get_handle is not the handle cache .* importing cudnn.linear_attention.ops.common failed"):
        adopt_frontend_ops()
    monkeypatch.undo()
    assert_nothing_adopted()


class IntLike:
    """A raw stream the way cuda-python spells one: int() of it is the handle."""

    def __init__(self, value):
        self.value = value

    def __int__(self):
        return self.value


CUDA3 = torch.device("cuda", 3)
TENSOR_ON_CUDA3 = types.SimpleNamespace(device=CUDA3)  # all the SwiGLU MoE seam reads of its tensor
# seam -> [(arguments, the current_handle(device, stream) call expected, stream returned beside the handle or None)]
ROUTING = {
    "cudnn.sdpa.fwd.torch_op._get_handle": [((CUDA3,), (CUDA3, None), None)],
    "cudnn.ops.norm._common.get_handle": [((CUDA3,), (CUDA3, None), None)],
    "cudnn.ops.norm.rmsnorm.get_handle": [((CUDA3,), (CUDA3, None), None)],
    "cudnn.ops.norm.layernorm.get_handle": [((CUDA3,), (CUDA3, None), None)],
    "cudnn.gemm.ops.moe_grouped_matmul._get_handle": [((CUDA3,), (CUDA3, None), None)],
    "cudnn.gemm.ops.swiglu_moe._cudnn_handle": [((TENSOR_ON_CUDA3,), (CUDA3, None), None)],
    "cudnn.gemm.ops.swiglu_mlp._handle": [((CUDA3,), (CUDA3, None), 0xABC)],
    "cudnn.linear_attention.ops.common.get_handle": [
        ((CUDA3,), (CUDA3, None), None),
        ((torch.device("cuda"), None), (torch.device("cuda"), None), None),  # the current device, as before
        ((CUDA3, 1234), (CUDA3, 1234), None),
        ((CUDA3, IntLike(99)), (CUDA3, 99), None),
        ((CUDA3, types.SimpleNamespace(cuda_stream=77)), (CUDA3, 77), None),  # a stream object that is not torch's
    ],
    "cudnn.gated_attention_block.kernels.proj_gemm.handle_for_stream": [
        ((CUDA3, 0), (CUDA3, 0), None),
        (("cuda:2", IntLike(5)), (torch.device("cuda", 2), 5), None),
    ],
}


def test_adopted_seams_ask_the_pool_for_the_ops_device_and_stream(monkeypatch):
    """Through a stand-in for current_handle (the GPU tests use the real pool)."""
    assert set(ROUTING) == set(SEAM_BY_NAME)
    calls, bound = [], []
    # A handle as the pool returns it: for cuda:5, set to stream 0xABC.
    pooled = types.SimpleNamespace(stream=0xABC, device=types.SimpleNamespace(ordinal=5))

    def recording_current_handle(device=None, stream=None):
        calls.append((device, stream))
        return pooled

    monkeypatch.setattr(frontend_ops, "current_handle", recording_current_handle)
    monkeypatch.setattr(frontend_ops, "bind_context", lambda device, stream: bound.append((device, stream)))
    adopt_frontend_ops()
    for name, cases in ROUTING.items():
        seam = importlib.import_module(SEAM_BY_NAME[name].module).__dict__[SEAM_BY_NAME[name].attribute]
        for arguments, expected_call, stream_beside in cases:
            calls.clear()
            bound.clear()
            returned = seam(*arguments)
            assert calls == [expected_call], name
            assert bound == [(5, 0xABC)], name  # the op's device's context, for the launches that follow
            assert returned == ((pooled, stream_beside) if stream_beside is not None else pooled), name


def frontend_files_that_create_handles():
    """Files of the installed frontend with a call to ``create_handle`` (comments and strings aside)."""
    root = pathlib.Path(cudnn.__file__).parent
    found = set()
    for path in root.rglob("*.py"):
        text = path.read_text(encoding="utf-8", errors="replace")
        if "create_handle" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call):
                function = node.func
                called = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
                if called == "create_handle":
                    found.add(path.relative_to(root).as_posix())
                    break
    return found


def test_every_handle_factory_in_the_frontend_is_adopted_or_known():
    adopted = {seam.defined_in.removeprefix("cudnn.").replace(".", "/") + ".py" for seam in SEAMS}
    found = frontend_files_that_create_handles()
    assert found - adopted - set(KNOWN_UNADOPTED) == set(), "new handle factories: adopt them or list them with a reason"
    assert (adopted | set(KNOWN_UNADOPTED)) - found == set(), "these no longer create handles: update the lists"


def test_adoption_leaves_the_frontends_lazy_exports_callable():
    # A fresh interpreter: importing a seam's module (cudnn.gemm.ops.swiglu_mlp) writes the
    # module over the package's lazy export of the same name unless adoption puts it back.
    script = (
        "import torch_cudnn_handle as tch\n"
        "tch.adopt_frontend_ops()\n"
        "from cudnn.gemm.ops import moe_grouped_matmul, swiglu_mlp, situ_mlp, swiglu_moe\n"
        "import cudnn.gemm.ops as ops\n"
        "for f in (moe_grouped_matmul, swiglu_mlp, situ_mlp, swiglu_moe, ops.swiglu_mlp):\n"
        "    assert callable(f) and not isinstance(f, type(ops)), f\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr
