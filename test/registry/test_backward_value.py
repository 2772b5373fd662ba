"""``Backward`` (registry/backward.py): one value per kind, checked when made, and the
options of earlier releases (``backward_operands=``, ``backward_fn=``, builder keywords)
still working for one release with a DeprecationWarning naming the new form, to the same
record: the same differentiability, the same gradients."""

import pytest
import torch

import torch_cudnn_handle as tch
from torch_cudnn_handle import Backward, BackwardOperand as Op


def relu(g, x):
    return g.relu(x)


def relu_grad(g, dy, x):
    return [g.relu_backward(dy, x)]


def scaled(g, x, *, scale):
    return g.scale(x, scale)


def test_each_kind_takes_only_its_own_options():
    assert Backward.graph(relu_grad).kind == "graph" and Backward.graph(relu_grad).compute_operands is not None
    assert Backward.graph(relu_grad, operands=[Op.grad(0), Op.input(0)]).operands == (Op.grad(0), Op.input(0))
    assert Backward.function(lambda g, i, o: [None], reads=[Op.input(0)]).reads == (Op.input(0),)
    with pytest.raises(TypeError, match="unexpected keyword argument 'reads'"):
        Backward.graph(relu_grad, reads=[Op.input(0)])
    with pytest.raises(TypeError, match="backward must be callable, got int"):
        Backward.graph(3)
    with pytest.raises(TypeError, match="backward must be callable, got str"):
        tch.register_graph(relu, backward="relu_grad")


def test_a_backward_and_old_options_together_are_refused():
    with pytest.raises(TypeError, match="give the backward as one Backward value; drop backward_operands"):
        tch.register_graph(relu, backward=Backward.graph(relu_grad), backward_operands=[Op.grad(0), Op.input(0)])


@pytest.mark.parametrize("old, new", [
    (dict(backward=relu_grad, backward_operands=[Op.grad(0), Op.input(0)]), Backward.graph(relu_grad, operands=[Op.grad(0), Op.input(0)])),
    (dict(backward=relu_grad, backward_operands=lambda grads, ins, outs: [grads[0], ins[0]]),
     Backward.graph(relu_grad, operands=lambda grads, ins, outs: [grads[0], ins[0]])),
    (dict(backward_fn=lambda grads, ins, outs: [grads[0] * (ins[0] > 0)], backward_reads=[Op.input(0)]),
     Backward.function(lambda grads, ins, outs: [grads[0] * (ins[0] > 0)], reads=[Op.input(0)])),
], ids=["declared", "computed", "function"])
def test_the_old_options_warn_and_give_the_same_record(old, new):
    with pytest.warns(DeprecationWarning, match=r"is deprecated; pass backward=Backward\."):
        old_id = tch.register_graph(relu, name="old_form", **old)
    new_id = tch.register_graph(relu, name="new_form", backward=new)
    x = torch.empty(2, 8, 16, device="meta", requires_grad=True)
    for graph_id in (old_id, new_id):
        (y,) = tch.execute(graph_id, [x])
        assert y.requires_grad
        (grad,) = torch.autograd.grad(y.sum(), x)
        assert grad.shape == x.shape
    assert tch.registry.definition(old_id).backward.kind == tch.registry.definition(new_id).backward.kind


def test_params_that_are_not_a_dict_are_refused_with_what_they_must_be():
    with pytest.raises(TypeError, match="params must be a dict of the builder's keyword arguments, got int"):
        tch.register_graph(scaled, params=5)


def test_builder_parameters_as_keywords_warn_and_become_params():
    with pytest.warns(DeprecationWarning, match=r"builder parameters as keywords \(scale\) are deprecated; pass params=\{'scale': \.\.\.\}"):
        old_id = tch.register_graph(scaled, scale=0.5)
    assert dict(tch.registry.definition(old_id).params) == {"scale": 0.5}
    assert dict(tch.registry.definition(tch.register_graph(scaled, params={"scale": 0.5})).params) == {"scale": 0.5}


def test_a_builder_parameter_may_be_called_name_or_views_now():
    def named(g, x, *, name, views):
        return g.scale(x, views)

    graph_id = tch.register_graph(named, name="params_named", params=dict(name="mine", views=2.0))
    assert tch.registry.definition(graph_id).name == "params_named"
    assert dict(tch.registry.definition(graph_id).params) == {"name": "mine", "views": 2.0}
