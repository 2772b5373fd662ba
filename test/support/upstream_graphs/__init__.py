"""Graphs from the frontend's own upstream Python tests (NVIDIA/cudnn-frontend, test/python/),
one entry per graph, for test_upstream_graphs_gpu.py (GPU) and test_upstream_graphs.py (CPU).

Each builder makes the node calls upstream makes, with upstream's attributes; only the glue
differs: the builder receives one cudnn tensor per op input (the registry, or
``describe_with_frontend`` in frontend.py, creates them from the call's tensors) instead of creating
them with ``graph.tensor``/``graph.tensor_like``, and returns its outputs instead of calling
``set_output(True)`` (the registry does). Shapes, dtypes, layouts and tolerances are
upstream's unless an entry's ``note`` says otherwise.

An entry holds: name, family, builder, params (passed to the builder as keyword arguments;
part of the registered definition), make_inputs(device) (op inputs in the builder's order;
a host scalar stays a CPU tensor, as upstream passes it), reference(inputs) (upstream's torch
reference: one expected tensor or None per output), tolerances (atol, rtol) per output,
region(outputs, inputs) (the part of each output a graph defines, for graphs that leave
padding rows unwritten), in_place ({output: input} where upstream binds an output to an
input's buffer: registered so, and bound so when the frontend runs the graph), and frontend_types: the graph-level data types upstream gives a graph the registry cannot
describe (an all-integer graph), used only when the frontend runs the graph itself.

Upstream files the entries come from (paths in NVIDIA/cudnn-frontend):
  test/python/test_matmul_bias_relu.py (matmul + bias; int8 x bf16 matmul)
  test/python/conv/graph/test_conv_bias.py (conv fprop fusions, leaky relu backward, int8 conv)
  test/python/conv/graph/test_wgrads.py (scale-bias-relu-wgrad)
  test/python/norm/graph/test_layernorm.py, test_rmsnorm.py, test_instancenorm.py, test_batchnorm.py
  test/python/sdpa/fp16.py + fp16_ref.py (the SDPA forward/backward graphs of test_mhas_v2.py,
    its RoPE pre-processing, dropout, padding and ragged configurations, and its references)
Entries whose ``note`` says "public API" are written from the frontend's API where the stored
upstream snapshot has no such graph (conv dgrad, fp8 matmul).

The package: entry.py (UpstreamGraph, the input helpers), one module per family holding its
builders, inputs, references and ENTRIES (matmul.py, conv.py, norm.py, batchnorm.py,
sdpa.py), frontend.py (the frontend running a graph itself); here, GRAPHS: every family's
entries in that order, each registered once at import (graph name ``upstream_<name>``).
"""

from __future__ import annotations

from typing import List

import torch_cudnn_handle as tch

from . import batchnorm, conv, matmul, norm, sdpa
from .entry import UpstreamGraph
from .frontend import _TORCH_OF, as_cudnn_bits, compare_region, describe_with_frontend, from_cudnn_bits, path_of, run_with_frontend

__all__ = [
    "BY_NAME", "GRAPHS", "UpstreamGraph", "_TORCH_OF", "as_cudnn_bits", "compare_region", "describe_with_frontend",
    "from_cudnn_bits", "path_of", "run_with_frontend",
]

# =====================================================================================
# The table

GRAPHS: List[UpstreamGraph] = [*matmul.ENTRIES, *conv.ENTRIES, *norm.ENTRIES, *batchnorm.ENTRIES, *sdpa.ENTRIES]

BY_NAME = {entry.name: entry for entry in GRAPHS}

for _entry in GRAPHS:
    _entry.graph_id = tch.register_graph(
        _entry.builder, name=f"upstream_{_entry.name}", in_place=_entry.in_place, params=_entry.params, **(_entry.frontend_types or {})
    )
