"""adopt_frontend_ops() on a real GPU, no mocks: the frontend's own torch ops on pooled handles.

The ops run from THREADS short-lived threads, ALIVE at a time, and must give torch's
numbers while the pool creates at most ALIVE handles and the frontend none (its caches
make handles only through ``cudnn.create_handle()``, which ``frontend_handles`` counts; the
pool makes its own in C++). The same churn without adoption shows what the frontend's
caches do on their own. Families this GPU or install cannot serve (the frontend itself
refuses them here) are skipped, their seams still exercised directly on the real pool.
"""

import contextlib
import importlib

import cudnn
import pytest
import torch
import torch.nn.functional as F

import torch_cudnn_handle as tch
from conftest import run_concurrently, run_in_thread
from support.pool_counts import device_counts, wait_for_in_use
from torch_cudnn_handle.frontend_ops import SEAMS, adopt_frontend_ops, restore_frontend_ops

pytestmark = pytest.mark.gpu

THREADS, ALIVE = 64, 8  # short-lived threads per churn, and how many live at once
TOLERANCE = 2e-2  # max |cudnn - torch float32| <= TOLERANCE * (1 + max |torch float32|)


@contextlib.contextmanager
def adoption():
    adopt_frontend_ops()
    try:
        yield
    finally:
        restore_frontend_ops()


@pytest.fixture
def frontend_handles(monkeypatch):
    """The handles the frontend creates itself while the test runs."""
    made = []
    create_handle = cudnn.create_handle

    def counting_create_handle():
        handle = create_handle()
        made.append(handle)  # list.append is atomic: safe from the churn's threads
        return handle

    monkeypatch.setattr(cudnn, "create_handle", counting_create_handle)
    return made


def on_short_lived_threads(work, device=0):
    """``work()`` on THREADS new threads in waves of ALIVE (each wave released together, the
    next started once the last has given its handles back); the handles the pool created
    for ``device`` meanwhile."""
    before = device_counts(device)
    for _ in range(THREADS // ALIVE):
        run_concurrently(lambda _: work(), ALIVE)
        wait_for_in_use(before["in_use"], device)
    return device_counts(device)["created"] - before["created"]


def assert_matches(actual, expected, what):
    assert actual.shape == expected.shape and actual.device == expected.device, f"{what}: {actual.shape} on {actual.device}"
    error = (actual.float() - expected).abs().max().item()
    tolerance = TOLERANCE * (1 + expected.abs().max().item())
    assert error <= tolerance, f"{what}: max abs error {error:.3e} > tolerance {tolerance:.3e}"


def skip_unless_served(family, run):
    """Run ``run()`` once on the frontend's own handles, before adoption; skip the test when the
    frontend itself does not serve ``family`` on this GPU and install."""
    try:
        run()
        torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001 -- whatever the frontend refuses with, it is not served here
        pytest.skip(f"{family}: not served here by the frontend itself ({torch.cuda.get_device_name()}): {type(error).__name__}: {str(error)[:300]}")


class NormsAndAttention:
    """The frontend's rms_norm, layer_norm and sdpa on one device, with torch's float32 answers."""

    HIDDEN = 256

    def __init__(self, device):
        torch.manual_seed(0)
        self.x = torch.randn(64, self.HIDDEN, device=device).to(torch.bfloat16)
        self.weight = (1 + 0.1 * torch.randn(self.HIDDEN, device=device)).to(torch.bfloat16)
        self.bias = (0.1 * torch.randn(self.HIDDEN, device=device)).to(torch.bfloat16)
        self.q, self.k, self.v = (torch.randn(2, 4, 128, 64, device=device).to(torch.float16) for _ in range(3))
        x, weight, bias = self.x.float(), self.weight.float(), self.bias.float()
        self.expected = {
            "rms_norm": F.rms_norm(x, (self.HIDDEN,), weight, eps=1e-5),
            "layer_norm": F.layer_norm(x, (self.HIDDEN,), weight, bias, eps=1e-5),
            "sdpa": F.scaled_dot_product_attention(self.q.float(), self.k.float(), self.v.float(), is_causal=True),
        }

    def check(self, ambient_device=None):
        """Run each op, with ``ambient_device`` as torch's current device when given, and compare."""
        from cudnn.ops.norm import layer_norm, rms_norm
        from cudnn.sdpa.fwd.torch_op import sdpa

        ops = {
            "rms_norm": lambda: rms_norm(self.x, self.weight, eps=1e-5),
            "layer_norm": lambda: layer_norm(self.x, (self.HIDDEN,), self.weight, self.bias, eps=1e-5),
            "sdpa": lambda: sdpa(self.q, self.k, self.v, is_causal=True),
        }
        for name, op in ops.items():
            with torch.cuda.device(ambient_device):  # None: no change
                result = op()
            assert_matches(result, self.expected[name], name)


def test_without_adoption_every_thread_makes_its_own_frontend_handles(frontend_handles):
    assert restore_frontend_ops() == [], "an earlier test left the frontend ops adopted"
    work = NormsAndAttention("cuda:0")
    work.check()  # builds the graphs once, on this thread's frontend handles
    frontend_handles.clear()
    on_short_lived_threads(work.check)
    print(f"\nwithout adoption: {THREADS} threads made {len(frontend_handles)} frontend handles (never destroyed)")
    # Each new thread: one in the norms' per-thread cache, one in sdpa's.
    assert len(frontend_handles) == 2 * THREADS


def test_adopted_norms_and_sdpa_from_64_threads_use_at_most_8_pooled_handles(frontend_handles):
    with adoption():
        work = NormsAndAttention("cuda:0")
        work.check()  # builds the graphs once, on this thread's pooled handle
        created = on_short_lived_threads(work.check)
    print(f"\nadopted: {THREADS} threads, {ALIVE} at a time: the pool created {created} handles, the frontend {len(frontend_handles)}")
    assert frontend_handles == [], "the frontend created handles of its own"
    assert created <= ALIVE


def test_one_thread_runs_every_adopted_op_on_its_one_pooled_handle(frontend_handles):
    work = NormsAndAttention("cuda:0")
    with adoption():
        work.check()  # graphs built: the thread below only runs them
        before = device_counts()["in_use"]

        def thread():
            work.check()
            in_use = device_counts()["in_use"]
            lent = importlib.import_module("cudnn.sdpa.fwd.torch_op")._get_handle(torch.device("cuda", 0))
            return in_use, lent, tch.current_handle(0)

        in_use, lent, pooled = run_in_thread(thread)
    assert in_use == before + 1, "the three ops share the thread's one pooled handle"
    assert lent is pooled and pooled.device.ordinal == 0
    assert frontend_handles == []


def test_autograd_backward_of_adopted_ops_matches_torch(frontend_handles):
    from cudnn.ops.norm import rms_norm
    from cudnn.sdpa.fwd.torch_op import sdpa

    torch.manual_seed(0)
    x = torch.randn(64, 256, device="cuda").to(torch.bfloat16).requires_grad_()
    weight = (1 + 0.1 * torch.randn(256, device="cuda")).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(64, 256, device="cuda").to(torch.bfloat16)
    q, k, v = (torch.randn(2, 4, 128, 64, device="cuda").to(torch.float16).requires_grad_() for _ in range(3))
    d_o = torch.randn(2, 4, 128, 64, device="cuda").to(torch.float16)
    with adoption():  # the backwards run on autograd's device thread, on its pooled handle
        rms_norm(x, weight, eps=1e-5).backward(dy)
        o, _lse = sdpa(q, k, v, is_causal=True, return_lse=True)  # training needs the forward's stats
        o.backward(d_o)
        torch.cuda.synchronize()

    x32, weight32 = (t.detach().float().requires_grad_() for t in (x, weight))
    F.rms_norm(x32, (256,), weight32, eps=1e-5).backward(dy.float())
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    F.scaled_dot_product_attention(q32, k32, v32, is_causal=True).backward(d_o.float())
    for name, got, want in (("rms_norm dx", x.grad, x32.grad), ("rms_norm dweight", weight.grad, weight32.grad)):
        assert_matches(got, want, name)
    for name, got, want in (("sdpa dq", q.grad, q32.grad), ("sdpa dk", k.grad, k32.grad), ("sdpa dv", v.grad, v32.grad)):
        assert_matches(got, want, name)
    assert frontend_handles == []


def frontend_function(name: str):
    """``cudnn.gemm.ops.<name>``, the function: once its submodule of the same name is
    imported (adoption imports it to reach its seam), the package attribute is the module."""
    return getattr(importlib.import_module(f"cudnn.gemm.ops.{name}"), name)


def test_adopted_moe_grouped_matmul_from_64_threads(frontend_handles):
    moe_grouped_matmul = frontend_function("moe_grouped_matmul")

    experts, per_expert, k, n = 4, 32, 64, 64
    torch.manual_seed(0)
    token = (0.5 * torch.randn(1, experts * per_expert, k, device="cuda")).half()
    weight = (0.5 * torch.randn(experts, n, k, device="cuda")).half().transpose(1, 2)  # [E, K, N], column-major inner dims
    offsets = (per_expert * torch.arange(experts + 1, dtype=torch.int32, device="cuda")).reshape(-1, 1, 1)  # G+1 boundaries
    rows = [token[0, e * per_expert : (e + 1) * per_expert].float() @ weight[e].float() for e in range(experts)]
    expected = torch.cat(rows).unsqueeze(0)

    def run():
        return moe_grouped_matmul(token, weight, offsets, mode="none")

    skip_unless_served("moe_grouped_matmul", run)
    frontend_handles.clear()  # the probe ran on the frontend's own handle
    with adoption():
        run()
        created = on_short_lived_threads(lambda: assert_matches(run(), expected, "moe_grouped_matmul"))
    assert frontend_handles == []
    assert created <= ALIVE


def test_adopted_swiglu_mlp_from_64_threads(frontend_handles):
    swiglu_mlp = frontend_function("swiglu_mlp")

    torch.manual_seed(0)
    x = (0.5 * torch.randn(64, 128, device="cuda")).bfloat16()
    w_gate, w_up = ((0.1 * torch.randn(256, 128, device="cuda")).bfloat16() for _ in range(2))
    w_down = (0.1 * torch.randn(128, 256, device="cuda")).bfloat16()
    expected = (F.silu(x.float() @ w_gate.float().T) * (x.float() @ w_up.float().T)) @ w_down.float().T

    def run():
        return swiglu_mlp(x, w_gate, w_up, w_down)

    skip_unless_served("swiglu_mlp", run)  # the frontend serves it on SM100 only
    frontend_handles.clear()
    with adoption():
        run()
        created = on_short_lived_threads(lambda: assert_matches(run(), expected, "swiglu_mlp"))
    assert frontend_handles == []
    assert created <= ALIVE


def lent_with_its_stream(handle):
    return handle, handle.stream


# How each op calls its seam, on torch's current stream `stream` (or naming it, where the
# op does): -> (the handle lent, the stream the seam says it is on).
SEAM_CALLS = {
    "cudnn.sdpa.fwd.torch_op._get_handle": lambda seam, device, stream: lent_with_its_stream(seam(device)),
    "cudnn.ops.norm._common.get_handle": lambda seam, device, stream: lent_with_its_stream(seam(device)),
    "cudnn.ops.norm.rmsnorm.get_handle": lambda seam, device, stream: lent_with_its_stream(seam(device)),
    "cudnn.ops.norm.layernorm.get_handle": lambda seam, device, stream: lent_with_its_stream(seam(device)),
    "cudnn.gemm.ops.moe_grouped_matmul._get_handle": lambda seam, device, stream: lent_with_its_stream(seam(device)),
    "cudnn.gemm.ops.swiglu_moe._cudnn_handle": lambda seam, device, stream: lent_with_its_stream(seam(torch.empty(0, device=device))),
    "cudnn.gemm.ops.swiglu_mlp._handle": lambda seam, device, stream: seam(device),
    "cudnn.linear_attention.ops.common.get_handle": lambda seam, device, stream: lent_with_its_stream(seam(device, stream)),
    "cudnn.gated_attention_block.kernels.proj_gemm.handle_for_stream": lambda seam, device, stream: lent_with_its_stream(seam(device, stream.cuda_stream)),
}


@pytest.mark.parametrize("seam", SEAMS, ids=lambda seam: seam.name)
def test_adopted_seam_lends_the_threads_pooled_handle_on_the_ops_stream(seam, frontend_handles):
    """Every seam, the families this GPU cannot run included, on the real pool from 64 threads."""
    try:
        module = importlib.import_module(seam.module)
    except ImportError as error:
        pytest.skip(f"{seam.module} cannot be imported here: {error}")
    call = SEAM_CALLS[seam.name]
    device = torch.device("cuda", 0)

    def thread():
        side = torch.cuda.Stream(device)
        with torch.cuda.stream(side):
            lent, stream = call(getattr(module, seam.attribute), device, side)
            again, _ = call(getattr(module, seam.attribute), device, side)
        assert isinstance(lent, tch.PooledHandle) and again is lent
        assert lent.device.ordinal == 0 and stream == lent.stream == side.cuda_stream
        assert lent is tch.current_handle(0, side)

    with adoption():
        created = on_short_lived_threads(thread)
    assert frontend_handles == []
    assert created <= ALIVE


@pytest.mark.two_gpus
def test_ops_on_cuda1_called_with_device0_current_take_device1_handles(frontend_handles):
    work = NormsAndAttention("cuda:1")
    with adoption():
        before = {device: device_counts(device)["in_use"] for device in (0, 1)}

        def thread():
            work.check(ambient_device=0)  # builds too: this thread is the first to run them on cuda:1
            in_use = {device: device_counts(device)["in_use"] for device in (0, 1)}
            with torch.cuda.device(0):
                lent = importlib.import_module("cudnn.sdpa.fwd.torch_op")._get_handle(torch.device("cuda", 1))
            return in_use, lent

        in_use, lent = run_in_thread(thread)
    assert lent.device.ordinal == 1
    assert in_use == {0: before[0], 1: before[1] + 1}, f"in use before {before}, in the thread {in_use}"
    assert frontend_handles == []
