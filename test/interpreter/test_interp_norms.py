"""The interpreter's normalization nodes, forward and backward, against torch (CPU)."""

import cudnn
import pytest
import torch
import torch.nn.functional as F

from support.interpreter import assert_close, randn, run

TRAINING, INFERENCE = cudnn.norm_forward_phase.TRAINING, cudnn.norm_forward_phase.INFERENCE
F32 = cudnn.data_type.FLOAT


def _eps(value, rank):
    return torch.full((1,) * rank, value)  # a host scalar: pass-by-value


def _stats(*tensors):
    for t in tensors:
        if t is not None:
            t.set_data_type(F32)
    return list(tensors)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_layernorm_training_writes_y_and_its_saved_statistics(dtype):
    x = randn(4, 16, 64, dtype=dtype, seed=1, scale=2.0, shift=0.5)
    scale, bias = randn(1, 1, 64, dtype=dtype, seed=2), randn(1, 1, 64, dtype=dtype, seed=3)

    def builder(g, x, scale, bias, eps):
        y, mean, inv_var = g.layernorm(norm_forward_phase=TRAINING, input=x, scale=scale, bias=bias, epsilon=eps)
        return [y, *_stats(mean, inv_var)]

    y, mean, inv_var = run(builder, [x, scale, bias, _eps(1e-5, 3)])
    x64 = x.double()
    assert_close(y, F.layer_norm(x64, [64], scale.double().reshape(-1), bias.double().reshape(-1), eps=1e-5).to(dtype))
    assert mean.shape == (4, 16, 1) and mean.dtype == torch.float32
    assert_close(mean, x64.mean(-1, keepdim=True).float())
    assert_close(inv_var, torch.rsqrt(x64.var(-1, keepdim=True, correction=0) + 1e-5).float())


def test_layernorm_inference_without_a_bias():
    x, scale = randn(2, 8, 32, seed=4), randn(1, 1, 32, seed=5)
    (y,) = run(lambda g, x, s, e: g.layernorm(norm_forward_phase=INFERENCE, input=x, scale=s, bias=None, epsilon=e)[0],
               [x, scale, _eps(1e-3, 3)])
    assert_close(y, F.layer_norm(x.double(), [32], scale.double().reshape(-1), eps=1e-3).float())


@pytest.mark.parametrize("with_bias", [False, True])
def test_rmsnorm_training(with_bias):
    x = randn(3, 10, 48, dtype=torch.float16, seed=6)
    scale, bias = randn(1, 1, 48, dtype=torch.float16, seed=7), randn(1, 1, 48, dtype=torch.float16, seed=8)

    def builder(g, x, scale, bias, eps):
        y, inv_var = g.rmsnorm(norm_forward_phase=TRAINING, input=x, scale=scale, bias=bias if with_bias else None, epsilon=eps)
        return [y, *_stats(inv_var)]

    y, inv_var = run(builder, [x, scale, bias, _eps(1e-6, 3)])
    expected = F.rms_norm(x.double(), [48], scale.double().reshape(-1), eps=1e-6) + (bias.double() if with_bias else 0)
    assert_close(y, expected.half())
    assert_close(inv_var, torch.rsqrt(x.double().square().mean(-1, keepdim=True) + 1e-6).float())


def test_rmsnorm_with_a_graph_owned_epsilon_in_rows_of_the_canonical_4d_layout():
    x, scale = randn(6, 32, 1, 1, dtype=torch.bfloat16, seed=9), randn(1, 32, 1, 1, dtype=torch.bfloat16, seed=10)

    def builder(g, x, scale):
        eps = g.tensor_scalar(1e-5, cudnn.scalar_type.RUNTIME_PARAM, name="epsilon")  # no op input: its value is in the graph
        y, _ = g.rmsnorm(norm_forward_phase=INFERENCE, input=x, scale=scale, epsilon=eps)
        return y

    (y,) = run(builder, [x, scale])
    expected = F.rms_norm(x.double().reshape(6, 32), [32], scale.double().reshape(-1), eps=1e-5).reshape(6, 32, 1, 1)
    assert_close(y, expected.to(torch.bfloat16))


def test_instancenorm_training_on_channels_last():
    x = randn(2, 8, 6, 5, dtype=torch.float16, seed=11).to(memory_format=torch.channels_last)
    scale, bias = randn(1, 8, 1, 1, dtype=torch.float16, seed=12), randn(1, 8, 1, 1, dtype=torch.float16, seed=13)

    def builder(g, x, scale, bias, eps):
        y, mean, inv_var = g.instancenorm(norm_forward_phase=TRAINING, input=x, scale=scale, bias=bias, epsilon=eps)
        return [y, *_stats(mean, inv_var)]

    y, mean, inv_var = run(builder, [x, scale, bias, _eps(1e-5, 4)])
    x64 = x.double()
    assert_close(y, F.instance_norm(x64, weight=scale.double().reshape(-1), bias=bias.double().reshape(-1), eps=1e-5).half())
    assert mean.shape == (2, 8, 1, 1)
    assert_close(mean, x64.mean((2, 3), keepdim=True).float())
    assert_close(inv_var, torch.rsqrt(x64.var((2, 3), keepdim=True, correction=0) + 1e-5).float())


def test_batchnorm_training_updates_the_running_statistics():
    x = randn(4, 6, 5, 7, seed=14, scale=1.5, shift=0.3)
    scale, bias = randn(1, 6, 1, 1, seed=15), randn(1, 6, 1, 1, seed=16)
    running_mean, running_var = randn(1, 6, 1, 1, seed=17), randn(1, 6, 1, 1, seed=18).abs() + 0.5

    def builder(g, x, scale, bias, rm, rv, eps, momentum):
        return _stats(*g.batchnorm(input=x, scale=scale, bias=bias, in_running_mean=rm, in_running_var=rv, epsilon=eps, momentum=momentum))

    y, mean, inv_var, next_mean, next_var = run(builder, [x, scale, bias, running_mean, running_var, _eps(1e-3, 4), _eps(0.1, 4)])
    rm, rv = running_mean.double().reshape(-1).clone(), running_var.double().reshape(-1).clone()
    expected = F.batch_norm(x.double(), rm, rv, scale.double().reshape(-1), bias.double().reshape(-1), training=True, momentum=0.1, eps=1e-3)
    assert_close(y, expected.float())
    assert_close(mean, x.double().mean((0, 2, 3), keepdim=True).float())
    assert_close(inv_var, torch.rsqrt(x.double().var((0, 2, 3), keepdim=True, correction=0) + 1e-3).float())
    assert_close(next_mean, rm.view(1, 6, 1, 1).float())  # torch updated rm, rv in place: unbiased variance, as cuDNN
    assert_close(next_var, rv.view(1, 6, 1, 1).float())


def test_batchnorm_inference_with_saved_statistics():
    x = randn(2, 6, 4, 4, dtype=torch.float16, seed=19).to(memory_format=torch.channels_last)
    scale, bias, mean = (randn(1, 6, 1, 1, seed=s) for s in (20, 21, 22))
    var = randn(1, 6, 1, 1, seed=23).abs() + 0.1
    inv_var = torch.rsqrt(var + 1e-5)
    (y,) = run(lambda g, x, s, b, m, iv: g.batchnorm_inference(input=x, mean=m, inv_variance=iv, scale=s, bias=b),
               [x, scale, bias, mean, inv_var])
    expected = F.batch_norm(x.double(), mean.double().reshape(-1), var.double().reshape(-1), scale.double().reshape(-1),
                            bias.double().reshape(-1), training=False, eps=1e-5)
    assert_close(y, expected.half())


def _autograd(forward, x, weight, bias, dy):
    leaves = [t.double().requires_grad_() for t in (x, weight, bias)]
    forward(*leaves).backward(dy.double())
    return [t.grad for t in leaves]


def test_layernorm_backward_is_autograd_of_layer_norm():
    x, scale, bias, dy = randn(4, 8, 32, seed=24, scale=2.0), randn(1, 1, 32, seed=25), randn(1, 1, 32, seed=26), randn(4, 8, 32, seed=27)
    mean = x.mean(-1, keepdim=True)
    inv_var = torch.rsqrt(x.var(-1, keepdim=True, correction=0) + 1e-5)
    dx, dscale, dbias = run(
        lambda g, dy, x, s, m, iv: g.layernorm_backward(grad=dy, input=x, scale=s, mean=m, inv_variance=iv), [dy, x, scale, mean, inv_var]
    )
    grads = _autograd(lambda x, w, b: F.layer_norm(x, [32], w.reshape(-1), b.reshape(-1), eps=1e-5), x, scale, bias, dy)
    for got, expected in zip((dx, dscale, dbias), grads):
        assert_close(got, expected.float(), scale=10)


@pytest.mark.parametrize("has_dbias", [False, True])
def test_rmsnorm_backward_is_autograd_of_rms_norm(has_dbias):
    x, scale, dy = randn(16, 64, 1, 1, seed=28), randn(1, 64, 1, 1, seed=29), randn(16, 64, 1, 1, seed=30)
    inv_var = torch.rsqrt(x.square().mean(1, keepdim=True) + 1e-5)

    def builder(g, dy, x, s, iv):
        dx, dscale, dbias = g.rmsnorm_backward(grad=dy, input=x, scale=s, inv_variance=iv, has_dbias=has_dbias)
        return [dx, dscale] + ([dbias] if has_dbias else [])

    got = run(builder, [dy, x, scale, inv_var])
    assert len(got) == 2 + has_dbias
    rows = lambda t: t.reshape(16, 64)  # noqa: E731
    grads = _autograd(lambda x, w, b: F.rms_norm(rows(x), [64], w.reshape(-1), eps=1e-5).reshape(16, 64, 1, 1) + b, x, scale,
                      torch.zeros(1, 64, 1, 1), dy)
    for g, expected in zip(got, grads):
        assert_close(g, expected.float(), scale=10)


def test_instancenorm_backward_is_autograd_of_instance_norm():
    x, dy = randn(2, 4, 6, 6, seed=31, scale=2.0), randn(2, 4, 6, 6, seed=32)
    scale, bias = randn(1, 4, 1, 1, seed=33), randn(1, 4, 1, 1, seed=34)
    mean, inv_var = x.mean((2, 3), keepdim=True), torch.rsqrt(x.var((2, 3), keepdim=True, correction=0) + 1e-5)
    got = run(lambda g, dy, x, s, m, iv: g.instancenorm_backward(grad=dy, input=x, scale=s, mean=m, inv_variance=iv), [dy, x, scale, mean, inv_var])
    grads = _autograd(lambda x, w, b: F.instance_norm(x, weight=w.reshape(-1), bias=b.reshape(-1), eps=1e-5), x, scale, bias, dy)
    for g, expected in zip(got, grads):
        assert_close(g, expected.float(), scale=10)


def test_batchnorm_backward_is_autograd_of_batch_norm():
    x, dy = randn(4, 6, 5, 5, seed=35, scale=2.0), randn(4, 6, 5, 5, seed=36)
    scale, bias = randn(1, 6, 1, 1, seed=37), randn(1, 6, 1, 1, seed=38)
    mean, inv_var = x.mean((0, 2, 3), keepdim=True), torch.rsqrt(x.var((0, 2, 3), keepdim=True, correction=0) + 1e-5)
    got = run(lambda g, dy, x, s, m, iv: g.batchnorm_backward(grad=dy, input=x, scale=s, mean=m, inv_variance=iv), [dy, x, scale, mean, inv_var])
    grads = _autograd(lambda x, w, b: F.batch_norm(x, None, None, w.reshape(-1), b.reshape(-1), training=True, eps=1e-5), x, scale, bias, dy)
    for g, expected in zip(got, grads):
        assert_close(g, expected.float(), scale=10)


def test_an_adaptive_layernorm_has_no_handler_and_is_refused_by_name():
    x, scale, bias = randn(2, 8, 16), randn(2, 1, 16), randn(2, 1, 16)
    with pytest.raises(NotImplementedError, match=r"node 'ada' \(ADALAYERNORM\) attribute 'node type'"):
        run(lambda g, x, s, b, e: g.adalayernorm(norm_forward_phase=INFERENCE, input=x, scale=s, bias=b, epsilon=e, name="ada")[0],
            [x, scale, bias, _eps(1e-5, 3)])
