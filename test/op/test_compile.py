"""torch.compile sees cudnn_fe.execute as one op: no graph breaks, forward and backward.

Runs without a GPU: the forward with fake CUDA tensors, forward+backward with meta
tensors (a CPU build of torch cannot give a fake CUDA tensor autograd metadata). The
fake kernel answers from the graph's layout, so nothing is built here.
"""

import torch
from expecttest import TestCase
from torch._dynamo.testing import AotEagerAndRecordGraphs, normalize_gm
from torch._subclasses.fake_tensor import FakeTensorMode

from support.graphs import LINEAR_RELU, MATMUL, RELU, RELU_BACKWARD


def linear_relu_loss(x, w, b):
    return torch.ops.cudnn_fe.execute(LINEAR_RELU, [x, w, b])[0].float().sum()


def with_named_ids(graph_code: str) -> str:
    """Graph ids depend on registration order; name them so the expected text does not."""
    for name, graph_id in (("LINEAR_RELU", LINEAR_RELU), ("MATMUL", MATMUL), ("RELU_BACKWARD", RELU_BACKWARD)):
        graph_code = graph_code.replace(f".default({graph_id}, ", f".default({name}, ")
    return graph_code


def linear_shapes():
    return [(2, 16, 32), (2, 32, 8), (2, 1, 8)]


class TestCompile(TestCase):
    def setUp(self):
        torch._dynamo.reset()

    def test_fullgraph_forward_with_fake_cuda_tensors(self):
        with FakeTensorMode():
            x, w, b = (torch.empty(shape, dtype=torch.float16, device="cuda") for shape in linear_shapes())
        backend = AotEagerAndRecordGraphs()
        out = torch.compile(linear_relu_loss, backend=backend, fullgraph=True)(x, w, b)
        self.assertEqual(out.device.type, "cuda")
        self.assertEqual(len(backend.fw_graphs), 1)
        self.assertExpectedInline(
            with_named_ids(normalize_gm(backend.fw_graphs[0].print_readable(print_output=False))),
            """\
class <lambda>(torch.nn.Module):
    def forward(self, arg0_1: "f16[2, 16, 32]", arg1_1: "f16[2, 32, 8]", arg2_1: "f16[2, 1, 8]"):
        execute = torch.ops.cudnn_fe.execute.default(LINEAR_RELU, [arg0_1, arg1_1, arg2_1]);  arg0_1 = arg1_1 = arg2_1 = None
        getitem: "f16[2, 16, 8]" = execute[0];  execute = None
        _to_copy: "f32[2, 16, 8]" = torch.ops.aten._to_copy.default(getitem, dtype = torch.float32);  getitem = None
        sum_1: "f32[]" = torch.ops.aten.sum.default(_to_copy);  _to_copy = None
        return (sum_1,)
""",
        )

    def test_fullgraph_forward_and_backward(self):
        x, w, b = (torch.empty(shape, dtype=torch.float16, device="meta", requires_grad=True) for shape in linear_shapes())
        backend = AotEagerAndRecordGraphs()
        torch.compile(linear_relu_loss, backend=backend, fullgraph=True)(x, w, b).backward()
        self.assertEqual((len(backend.fw_graphs), len(backend.bw_graphs)), (1, 1))
        self.assertEqual([x.grad.shape, w.grad.shape, b.grad.shape], [x.shape, w.shape, b.shape])
        bw = normalize_gm(backend.bw_graphs[0].print_readable(print_output=False))
        self.assertExpectedInline(
            with_named_ids(bw),
            """\
class GraphModule(torch.nn.Module):
    def forward(self, detach_1: "f16[2, 16, 8]", transpose: "f16[2, 8, 32]", transpose_1: "f16[2, 32, 16]", tangents_1: "f32[]"):
        expand: "f32[2, 16, 8]" = torch.ops.aten.expand.default(tangents_1, [2, 16, 8]);  tangents_1 = None
        _to_copy_1: "f16[2, 16, 8]" = torch.ops.aten._to_copy.default(expand, dtype = torch.float16, layout = torch.strided, device = device(type='meta'));  expand = None
        execute_1 = torch.ops.cudnn_fe.execute.default(RELU_BACKWARD, [_to_copy_1, detach_1]);  _to_copy_1 = detach_1 = None
        getitem_1: "f16[2, 16, 8]" = execute_1[0];  execute_1 = None
        execute_2 = torch.ops.cudnn_fe.execute.default(MATMUL, [getitem_1, transpose]);  transpose = None
        getitem_2: "f16[2, 16, 32]" = execute_2[0];  execute_2 = None
        execute_3 = torch.ops.cudnn_fe.execute.default(MATMUL, [transpose_1, getitem_1]);  transpose_1 = None
        getitem_3: "f16[2, 32, 8]" = execute_3[0];  execute_3 = None
        sum_2: "f16[2, 1, 8]" = torch.ops.aten.sum.dim_IntList(getitem_1, [1], True);  getitem_1 = None
        return (getitem_2, getitem_3, sum_2)
""",
        )

    def test_a_single_backward_graph_traces_too(self):
        x = torch.empty(4, 8, 16, dtype=torch.float16, device="meta", requires_grad=True)
        backend = AotEagerAndRecordGraphs()
        torch.compile(lambda x: torch.ops.cudnn_fe.execute(RELU, [x])[0].sum(), backend=backend, fullgraph=True)(x).backward()
        self.assertEqual((len(backend.fw_graphs), len(backend.bw_graphs)), (1, 1))
        self.assertEqual(x.grad.shape, x.shape)

    def test_fake_outputs_match_the_layout_exactly(self):
        with FakeTensorMode():
            x = torch.empty(3, 16, 32, dtype=torch.bfloat16, device="cuda")
            w = torch.empty(3, 32, 8, dtype=torch.bfloat16, device="cuda")
            b = torch.empty(3, 1, 8, dtype=torch.bfloat16, device="cuda")
            (y,) = torch.ops.cudnn_fe.execute(LINEAR_RELU, [x, w, b])
            self.assertEqual((tuple(y.shape), y.stride(), y.dtype, y.device), ((3, 16, 8), (128, 8, 1), torch.bfloat16, x.device))
            self.assertIsNone(torch.ops.cudnn_fe.execute.out(LINEAR_RELU, [x, w, b], out=[torch.empty_like(y)]))

    def test_opcheck_on_meta_tensors(self):
        x, w, b = (torch.randn(shape, dtype=torch.float16).to("meta") for shape in linear_shapes())
        torch.library.opcheck(torch.ops.cudnn_fe.execute.default, (LINEAR_RELU, [x, w, b]))
        x, w, b = (t.requires_grad_() for t in (x, w, b))
        torch.library.opcheck(torch.ops.cudnn_fe.execute.default, (LINEAR_RELU, [x, w, b]))
        out = torch.empty(2, 16, 8, dtype=torch.float16, device="meta")
        torch.library.opcheck(torch.ops.cudnn_fe.execute.out, (LINEAR_RELU, [x.detach(), w.detach(), b.detach()]), {"out": [out]})
        with torch.no_grad():  # inputs that require grad; no_grad as torch's own out= ops need
            torch.library.opcheck(torch.ops.cudnn_fe.execute.out, (LINEAR_RELU, [x, w, b]), {"out": [out]})

    def test_the_op_carries_the_tags_inductor_needs(self):
        for overload in (torch.ops.cudnn_fe.execute.default, torch.ops.cudnn_fe.execute.out):
            self.assertIn(torch.Tag.needs_exact_strides, overload.tags)
            self.assertIn(torch.Tag.pt2_compliant_tag, overload.tags)
