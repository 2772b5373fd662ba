"""The plan store and what a stored plan must prove before it is loaded; no GPU needed:
keys, the file format, corrupt and stale entries, concurrent writers (threads and
spawned processes), the settings, the description fingerprint and the blob check."""

import json
import multiprocessing
import os
import warnings

import pytest
import torch

from conftest import run_concurrently
from support.ubjson import encode
import torch_cudnn_handle as tch
from torch_cudnn_handle import settings
from torch_cudnn_handle.registry.plans import store as plan_store
from torch_cudnn_handle.registry.routes import Facts, Resolved, decide
from torch_cudnn_handle.registry.plans.store import PlanStore, plan_key
from torch_cudnn_handle.registry.plans.stored_graphs import check_blob, description_fingerprint

LAYOUT = [((2, 8, 136, 64), (69632, 8704, 64, 1), torch.bfloat16), ((2, 8, 136, 1), (1088, 136, 1, 1), torch.float32)]
KEY_ARGS = dict(
    backend_version=91900, frontend_version="1.32.0", device="NVIDIA H200 sm90 132SMs", graph="ab12", name="nn_sdpa_causal",
    params="[('causal', True)]", layout=LAYOUT, deterministic=False, dynamic_shapes=False, tuned=False,
)


def key(**changes):
    return plan_key(**dict(KEY_ARGS, **changes))


def test_the_key_names_everything_a_plan_depends_on():
    base = key()
    assert base == key(layout=[(list(s), list(t), d) for s, t, d in LAYOUT])  # tuples or lists
    variants = [
        dict(backend_version=92100),
        dict(frontend_version="1.31.0"),
        dict(device="NVIDIA H100 80GB HBM3 sm90 132SMs"),
        dict(device="NVIDIA H200 sm90 66SMs"),  # a MIG slice or a green context: fewer SMs
        dict(graph="ab13"),
        dict(name="nn_sdpa_full"),
        dict(params="[('causal', False)]"),
        dict(layout=[((2, 8, 137, 64), (70144, 8768, 64, 1), torch.bfloat16), LAYOUT[1]]),
        dict(layout=[((2, 8, 136, 64), (69632, 64, 512, 1), torch.bfloat16), LAYOUT[1]]),  # BSHD strides
        dict(layout=[((2, 8, 136, 64), (69632, 8704, 64, 1), torch.float16), LAYOUT[1]]),
        dict(deterministic=True),
        dict(dynamic_shapes=True),
        dict(tuned=True),
    ]
    keys = [key(**variant) for variant in variants]
    assert len(set(keys + [base])) == len(variants) + 1


def test_a_stored_blob_loads_back_whole_with_its_metadata(tmp_path):
    store = PlanStore(tmp_path / "plans")
    assert store.load(key()) is None  # the directory does not even exist yet
    blob = bytes(range(256)) * 3 + b"\n\n"
    assert store.store(key(), blob, {"engine": "backend:eng4", "index": 0})
    assert store.load(key()) == (blob, {"engine": "backend:eng4", "index": 0})
    assert store.stats() == dict(hits=1, misses=1, writes=1, rejected=0, write_errors=0)
    assert os.listdir(tmp_path / "plans") == [os.path.basename(store.path_of(key()))]  # no temp file left


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[:-1],  # truncated blob
        lambda data: data[:10],  # truncated header
        lambda data: data[:-3] + b"xyz",  # same length, other bytes
        lambda data: b"garbage" + data,
        lambda data: data.replace(b'"format":1', b'"format":2'),
        lambda data: b"",
    ],
)
def test_a_corrupt_entry_warns_misses_and_is_removed(tmp_path, damage):
    store = PlanStore(tmp_path)
    store.store(key(), b"the plan" * 100)
    path = store.path_of(key())
    with open(path, "rb") as file:
        data = file.read()
    with open(path, "wb") as file:
        file.write(damage(data))
    with pytest.warns(UserWarning, match="was rejected"):
        assert store.load(key()) is None
    assert not os.path.exists(path)
    assert store.stats()["rejected"] == 1
    store.store(key(), b"rebuilt")  # the build that follows writes a good entry
    assert store.load(key())[0] == b"rebuilt"


def test_a_stale_version_is_a_miss_and_a_file_under_another_key_is_rejected(tmp_path):
    store = PlanStore(tmp_path)
    store.store(key(backend_version=91800), b"old cuDNN's plan")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a plain miss: no warning
        assert store.load(key()) is None
    os.replace(store.path_of(key(backend_version=91800)), store.path_of(key()))  # copied under the new name
    with pytest.warns(UserWarning, match="written for another key"):
        assert store.load(key()) is None
    assert store.stats()["rejected"] == 1 and not os.path.exists(store.path_of(key()))


def test_a_rejection_leaves_a_file_that_was_replaced_meanwhile(tmp_path):
    store = PlanStore(tmp_path)
    store.store(key(), b"first")
    seen = os.stat(store.path_of(key()))
    store.store(key(), b"another process's good entry, written after the bad one was read")
    with pytest.warns(UserWarning):
        store.reject(key(), "damaged", seen=seen)
    assert store.load(key())[0].startswith(b"another process's")


def test_a_store_that_cannot_write_warns_and_returns_false(tmp_path):
    (tmp_path / "file").write_text("a file where the directory should be")
    store = PlanStore(tmp_path / "file" / "plans")
    with pytest.warns(UserWarning, match="could not store"):
        assert store.store(key(), b"plan") is False
    assert store.stats()["write_errors"] == 1


def test_concurrent_writers_and_readers_on_threads_never_see_a_torn_entry(tmp_path):
    store = PlanStore(tmp_path)
    blobs = [bytes([i]) * (100_000 + i) for i in range(8)]

    def work(i):
        seen = []
        for _ in range(20):
            assert store.store(key(), blobs[i])
            loaded = store.load(key())
            seen.append(loaded[0] if loaded else None)
        return seen

    results = run_concurrently(work, 8)
    assert all(blob in blobs for seen in results for blob in seen)  # every load whole (it was written before)
    assert store.stats()["rejected"] == 0
    assert os.listdir(tmp_path) == [os.path.basename(store.path_of(key()))]


def _write_in_a_process(directory, i, rounds):
    store = PlanStore(directory)
    for _ in range(rounds):
        store.store(key(), bytes([i]) * (200_000 + i))
        loaded = store.load(key())
        assert loaded is not None and set(loaded[0]) <= set(range(8)) and len(loaded[0]) == 200_000 + loaded[0][0]
    return store.stats()["rejected"]


def test_concurrent_writers_in_spawned_processes_leave_one_whole_entry(tmp_path):
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        rejected = pool.starmap(_write_in_a_process, [(str(tmp_path), i, 25) for i in range(4)])
    assert rejected == [0, 0, 0, 0]
    blob, _ = PlanStore(tmp_path).load(key())
    assert blob in {bytes([i]) * (200_000 + i) for i in range(4)}
    assert os.listdir(tmp_path) == [os.path.basename(PlanStore(tmp_path).path_of(key()))]


def _consults_the_store() -> bool:
    """Whether a CUDA call's route loads from (and writes to) the plan store now (registry/routes.py)."""
    definition = tch.registry.definition(tch.register_graph(lambda g, x: g.relu(x), name="stored"))
    return "plan_store" in decide(definition, Resolved.now(), Facts("cuda")).plan_from


def test_settings_the_call_wins_over_the_environment(tmp_path, monkeypatch, fresh_settings):
    monkeypatch.setenv("TORCH_CUDNN_HANDLE_PLAN_STORE", "0")
    assert not _consults_the_store()
    monkeypatch.setenv("TORCH_CUDNN_HANDLE_PLAN_STORE", "1")
    assert _consults_the_store()
    monkeypatch.setenv("TORCH_CUDNN_HANDLE_PLAN_STORE_DIR", str(tmp_path / "from_env"))
    assert plan_store.store().directory == str(tmp_path / "from_env")
    monkeypatch.delenv("TORCH_CUDNN_HANDLE_PLAN_STORE_DIR")
    assert settings.get("plan_store_dir") == os.path.join(os.path.expanduser("~"), ".cache", "torch_cudnn_handle", "plans")
    settings.set_plan_store_dir(tmp_path / "mine")
    settings.set_plan_store(False)
    assert not _consults_the_store()
    settings.set_plan_store(True)  # the directory stays
    assert _consults_the_store()
    assert plan_store.store().directory == str(tmp_path / "mine")
    plan_store.store().store(key(), b"x")
    assert plan_store.stats()["writes"] >= 1


def test_the_old_variables_still_work_with_a_deprecation_warning(tmp_path, monkeypatch, fresh_settings):
    monkeypatch.delenv("TORCH_CUDNN_HANDLE_PLAN_STORE", raising=False)
    monkeypatch.setenv("TORCH_CUDNN_HANDLE_PLAN_CACHE", "0")
    with pytest.warns(DeprecationWarning, match="TORCH_CUDNN_HANDLE_PLAN_CACHE is deprecated.*TORCH_CUDNN_HANDLE_PLAN_STORE instead"):
        assert settings.get("plan_store") is False


def test_an_unusable_directory_is_one_warning_and_the_store_is_off(tmp_path, fresh_settings):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    settings.set_plan_store(True)
    settings.set_plan_store_dir(blocker / "plans")
    with pytest.warns(RuntimeWarning, match=r"plan_store_dir directory .*a_file/plans' is unusable: it cannot be created"):
        assert plan_store.store() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plan_store.store() is None  # once: no second warning


# ---------------------------------------------------------------------------------
# What a loaded blob must prove (stored_graphs.check_blob), and the description's fingerprint

UIDS = (1, 2)


def serialized(**changes):
    tensors = [
        {"name": "1", "dim": list(LAYOUT[0][0]), "stride": list(LAYOUT[0][1])},
        {"name": "2", "dim": list(LAYOUT[1][0]), "stride": list(LAYOUT[1][1])},
    ]
    document = {
        "json_version": "2.0", "cudnn_backend_version": "9.19.0", "cudnn_frontend_version": 13200,
        "cudnn_backend_data": encode_json({"operationGraph": {"tensors": tensors}}), "variant_pack_uids": [1, 2],
    }
    document.update(changes)
    return encode({name: value for name, value in document.items() if value is not None})  # None: a field left out


def encode_json(value):
    return json.dumps(value)


def check(blob):
    return check_blob(blob, UIDS, backend_version=91900, frontend_version="1.32.0")


def test_a_blob_of_these_operands_from_this_cudnn_passes():
    assert check(serialized()) is None
    assert check(serialized(cudnn_backend_version=91900, cudnn_frontend_version="1.32.0")) is None  # either spelling
    assert check(serialized(cudnn_backend_version=None)) is None  # not written: the key's versions stand


@pytest.mark.parametrize(
    "changes, why",
    [
        (dict(cudnn_backend_version="9.18.1"), "built by cuDNN"),
        (dict(cudnn_frontend_version=13100), "built by frontend"),
        (dict(variant_pack_uids=[1, 3]), "lacks operands"),
        (dict(cudnn_backend_data='{"operationGraph": {"tensors": [{"name": "1", "dim": [2, 8, 136, 64]}]}}'), "operand 2 is not"),
        (dict(cudnn_backend_data="not json"), "not readable JSON"),
    ],
)
def test_a_blob_that_does_not_fit_is_refused_with_the_reason(changes, why):
    assert why in check(serialized(**changes))


def test_bytes_that_are_no_serialized_graph_are_refused():
    assert "not the frontend's serialized format" in check(b"\x00garbage")


def test_the_fingerprint_follows_the_description_and_is_stable():
    import cudnn

    def describe(seq, scale):
        graph = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16, intermediate_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT)
        x = graph.tensor(name="x", dim=[1, seq, 64], stride=[seq * 64, 64, 1], data_type=cudnn.data_type.BFLOAT16)
        w = graph.tensor(name="w", dim=[1, 64, 32], stride=[2048, 32, 1], data_type=cudnn.data_type.BFLOAT16)
        y = graph.mul(graph.matmul(x, w, name="mm"), graph.tensor_scalar(scale, cudnn.data_type.FLOAT), name="scale")
        y.set_output(True)
        return graph

    same = {description_fingerprint(describe(128, 0.5)) for _ in range(2)}
    assert len(same) == 1
    assert description_fingerprint(describe(136, 0.5)) not in same  # another length
    assert description_fingerprint(describe(128, 0.25)) not in same  # another pass-by-value scalar


def test_a_graph_with_packed_operands_is_keyed_without_its_token_count(monkeypatch):
    """A length bucket's ragged plan serves every token count of its bucket, so its key names the bucket only."""
    from support.interpreter import describe_registered
    from torch_cudnn_handle import registry
    from torch_cudnn_handle.nn.attention_buckets import lengths_and_offsets, ragged_sdpa_inference
    from torch_cudnn_handle.registry import Ragged, register_graph
    from torch_cudnn_handle.registry.plans import stored_graphs

    monkeypatch.setattr(stored_graphs, "device_identity", lambda device: "NVIDIA H200 sm90 132SMs")  # no GPU here to name,
    monkeypatch.setattr(stored_graphs.cudnn, "backend_version", lambda: 91900)  # nor a libcudnn to ask
    packed = {0: Ragged(5, 256), 1: Ragged(6, 256), 2: Ragged(6, 256)}
    ragged_id = register_graph(ragged_sdpa_inference, name="store_ragged", params=dict(causal=True), ragged=packed)
    definition = registry.definition(ragged_id)
    keys = []
    for length in (100, 150):
        q = torch.randn(2 * length, 4, 64, dtype=torch.bfloat16)
        inputs = [q, q, q, *lengths_and_offsets(2, length, 4, 64, torch.device("cpu"), False)]
        graph, *_ = describe_registered(ragged_id, inputs)
        keys.append(stored_graphs.key_of(definition, 0, graph, [], False, False, False))
    assert keys[0] is not None and keys[0] == keys[1]


def test_a_ragged_offset_a_tensor_of_the_plan_names_is_one_of_its_operands():
    plan = {"operationGraph": {"tensors": [{"name": "1", "dim": [512, 4, 64], "raggedOffset": {"name": "3", "dim": [3, 1, 1]}},
                                           {"name": "2", "dim": [512, 4, 64]}]}}
    blob = serialized(cudnn_backend_data=json.dumps(plan), variant_pack_uids=[1, 2, 3])
    assert check_blob(blob, (1, 2, 3), backend_version=91900, frontend_version="1.32.0") is None
    assert "operand 4 is not" in check_blob(serialized(variant_pack_uids=[1, 2, 4]), (1, 2, 4), backend_version=91900, frontend_version="1.32.0")
