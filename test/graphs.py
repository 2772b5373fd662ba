"""Graph builders the tests share: a fused linear layer, relu(x @ w + b), and its backward."""

import cudnn
import torch

import torch_cudnn_handle as tch


def linear_relu(graph, x, w, b):
    return graph.relu(graph.add(graph.matmul(x, w, name="mm"), b, name="bias"), name="act")


def linear_relu_backward(graph, dy, y, x_t, w_t):
    dz = graph.relu_backward(dy, y, name="drelu")
    dx = graph.matmul(dz, w_t, name="dx")
    dw = graph.matmul(x_t, dz, name="dw")
    db = graph.reduction(dz, mode=cudnn.reduction_mode.ADD, name="db")
    batch, _, n = dy.dim  # dz has no dims until validate() infers them
    db.set_dim([batch, 1, n]).set_stride([n, n, 1]).set_data_type(dy.data_type)
    return [dx, dw, db]


def linear_relu_backward_operands(grads, inputs, outputs):
    (dy,), (x, w, _b), (y,) = grads, inputs, outputs
    return [dy, y, x.mT, w.mT]


LINEAR_RELU = tch.register_graph(
    linear_relu, name="linear_relu", backward=linear_relu_backward, backward_operands=linear_relu_backward_operands
)


def linear_relu_reference(x, w, b):
    return torch.relu(torch.matmul(x.float(), w.float()) + b.float()).to(x.dtype)


def linear_inputs(batch=2, m=16, k=32, n=8, dtype=torch.float16, device="cuda", requires_grad=False, seed=0):
    generator = torch.Generator(device="cpu").manual_seed(seed)
    make = lambda *shape: (torch.randn(*shape, generator=generator) * 0.5).to(dtype=dtype, device=device)  # noqa: E731
    x, w, b = make(batch, m, k), make(batch, k, n), make(batch, 1, n)
    return [t.requires_grad_(requires_grad) for t in (x, w, b)]
