"""Graph ids (Note [Graph ids] in registry/definition.py): the same definition gets the same id
in every process, another definition another id, so torch.compile's caches on disk, which
key a compiled graph by its code (where a cuDNN graph is its id), never replay one graph's
compiled code for another. Run here on CPU tensors (the op's interpreter kernel) with
inductor's CPU backend, as a GPU run would with CUDA tensors."""

import os
import subprocess
import sys
import textwrap

import torch

import torch_cudnn_handle as tch
from support.paths import REPO


def relu(g, x):
    return g.relu(x)


def activation(name):
    def builder(g, x):  # the same code for every name: the captured value tells them apart
        return getattr(g, name)(x)

    return builder


def test_each_registration_gets_an_id_of_its_own():
    ids = [tch.register_graph(relu, name="ids_relu"), tch.register_graph(relu, name="ids_relu"), tch.register_graph(relu, name="ids_other")]
    ids += [tch.register_graph(activation("relu"), name="ids_act"), tch.register_graph(activation("sigmoid"), name="ids_act")]
    assert len(set(ids)) == len(ids) and all(0 < i < 2**48 for i in ids)
    x = torch.randn(2, 4, 8)
    torch.testing.assert_close(tch.execute(ids[3], [x])[0], torch.relu(x))
    torch.testing.assert_close(tch.execute(ids[4], [x])[0], torch.sigmoid(x))


PROGRAM = textwrap.dedent("""
    import sys, cudnn, torch, torch_cudnn_handle as tch

    def relu(g, x):
        return g.relu(x)

    def row_sum(g, x):
        total = g.reduction(x, mode=cudnn.reduction_mode.ADD)
        total.set_dim([x.dim[0], 1, x.dim[2]]).set_stride([x.dim[2], x.dim[2], 1])
        return total

    graph = tch.register_graph(relu if sys.argv[1] == "relu" else row_sum, name="g")  # each process's first graph
    step = torch.compile(lambda x: tch.execute(graph, [x])[0] * 2, fullgraph=True)
    x = torch.randn(2, 4, 8)
    want = 2 * (torch.relu(x) if sys.argv[1] == "relu" else x.sum(1, keepdim=True))
    torch.testing.assert_close(step(x), want)
    print(graph)
""")


def test_a_compiled_graph_on_disk_is_never_replayed_for_another_graph(tmp_path):
    """Two processes, one inductor cache: each registers a different graph first. With ids
    counted per process both were id 1, and the second replayed the first's compiled code
    (an AssertionError on sizes its fake kernel never gave)."""
    environment = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), PYTHONPATH=REPO)
    ids = {}
    for which in ("relu", "row_sum", "relu"):
        run = subprocess.run([sys.executable, "-c", PROGRAM, which], env=environment, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        ids.setdefault(which, set()).add(int(run.stdout.split()[-1]))
    assert len(ids["relu"]) == 1, "one definition, one id in every process"
    assert ids["relu"] != ids["row_sum"]
