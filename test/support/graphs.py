"""Graph builders the tests share.

* LINEAR_RELU: a fused linear layer, relu(x @ w + b). cuDNN fuses one matmul per
  graph, so its backward (two matmuls) is a torch-level ``backward_fn`` running three
  registered graphs (and a torch sum for the bias gradient).
* RELU: a pointwise relu whose backward is a single backward graph (``backward=``),
  its operands computed by a function; RELU_DECLARED: the same, its operands declared
  (``BackwardOperand``), so its backward can run natively without Python.
"""

import torch

import torch_cudnn_handle as tch


def linear_relu(graph, x, w, b):
    return graph.relu(graph.add(graph.matmul(x, w, name="mm"), b, name="bias"), name="act")


def matmul(graph, a, b):
    return graph.matmul(a, b, name="mm")


def relu_backward(graph, dy, y):
    return graph.relu_backward(dy, y, name="drelu")


MATMUL = tch.register_graph(matmul, name="matmul")
RELU_BACKWARD = tch.register_graph(relu_backward, name="relu_backward")


def linear_relu_backward(grads, inputs, outputs):
    (dy,), (x, w, _b), (y,) = grads, inputs, outputs
    (dz,) = torch.ops.cudnn_fe.execute(RELU_BACKWARD, [dy, y])
    (dx,) = torch.ops.cudnn_fe.execute(MATMUL, [dz, w.mT])
    (dw,) = torch.ops.cudnn_fe.execute(MATMUL, [x.mT, dz])
    return [dx, dw, dz.sum(dim=1, keepdim=True)]


LINEAR_RELU = tch.register_graph(linear_relu, name="linear_relu", backward=tch.Backward.function(linear_relu_backward))


def relu(graph, x):
    return graph.relu(x, name="act")


def relu_grad(graph, dy, x):
    return [graph.relu_backward(dy, x, name="drelu")]


RELU = tch.register_graph(
    relu, name="relu", backward=tch.Backward.graph(relu_grad, operands=lambda grads, ins, outs: [grads[0], ins[0]]),
)
RELU_DECLARED = tch.register_graph(
    relu, name="relu_declared",
    backward=tch.Backward.graph(relu_grad, operands=[tch.BackwardOperand.grad(0), tch.BackwardOperand.input(0)]),
)


def linear_relu_reference(x, w, b):
    return torch.relu(torch.matmul(x.float(), w.float()) + b.float()).to(x.dtype)


def linear_inputs(batch=2, m=16, k=32, n=8, dtype=torch.float16, device="cuda", requires_grad=False, seed=0):
    generator = torch.Generator(device="cpu").manual_seed(seed)
    make = lambda *shape: (torch.randn(*shape, generator=generator) * 0.5).to(dtype=dtype, device=device)  # noqa: E731
    x, w, b = make(batch, m, k), make(batch, k, n), make(batch, 1, n)
    return [t.requires_grad_(requires_grad) for t in (x, w, b)]
