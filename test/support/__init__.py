"""What the tests share besides conftest.py's fixtures: graph builders and the graphs they
register (graphs.py, graph_inputs.py, ragged_graphs.py, upstream_graphs/), helpers more than
one test file uses (pool_counts.py, ubjson.py), where things are (paths.py),
host_sync_probe.py (a program test_semantics_gpu.py runs) and csrc/, the pool's C++ test seam.

Importable as ``support`` because test/conftest.py puts test/ on sys.path. Import each
module by this one name (``from support.graphs import ...``): a module imported under two
names would register its graphs twice, with other graph ids.
"""
