"""One tokenisation per cluster: an hf: source pinned to a revision, which its cache key and
dataset_id name (a local .jsonl corpus stands for the Hub: the same code path after the
download); a token cache on a path every node shares, built once by one of two nodes and read by
the other, a corrupt copy rebuilt; the unigram counts computed once with the cache, in chunks."""

import contextlib
import json
import logging
import os
import socket
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
import pytest

from benchmark.data import DataConfig, cached_parts, load_corpus, prepare, sources
from benchmark.data import cache as data_cache

HUB_NAME = "org/webtext"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """`hf:org/webtext` served from a local .jsonl through the datasets library's own streaming
    reader: each revision's download is a file of its own; the current revision is `r2`."""
    import datasets

    real = datasets.load_dataset
    files = {}
    for revision, extra in (("r1", 0), ("r2", 20)):
        path = tmp_path / f"webtext-{revision}.jsonl"
        words = "the cat dog sat ran on under a mat log hill and then".split()
        records = [
            {"id": f"doc{i}", "text": " ".join(words[(i + k) % len(words)] for k in range(30))}
            for i in range(200 + extra)
        ]
        path.write_text("\n".join(json.dumps(r) for r in records))
        files[revision] = str(path)
    asked = []

    def from_the_hub(path, **kwargs):
        if path != HUB_NAME:
            return real(path, **kwargs)
        asked.append(kwargs["revision"])
        return real("json", data_files=[files[kwargs["revision"]]], split="train", streaming=True)

    monkeypatch.setattr(datasets, "load_dataset", from_the_hub)
    monkeypatch.setattr(sources, "resolve_revision", lambda name: "r2")
    return asked


def test_an_hf_source_is_read_at_a_pinned_revision(hub, tmp_path):
    """Unpinned, the current revision is resolved and written into the source, the dataset_id and
    the cache key; pinned, that revision is read: two revisions, two caches, two ids."""
    cache = str(tmp_path / "cache")
    now = prepare(DataConfig(source=f"hf:{HUB_NAME}", tokenizer="bpe:300", cache_dir=cache))
    old = prepare(DataConfig(source=f"hf:{HUB_NAME}@r1", tokenizer="bpe:300", cache_dir=cache))
    assert now.dataset_id.startswith(f"hf:{HUB_NAME}@r2@") and old.dataset_id.startswith(
        f"hf:{HUB_NAME}@r1@"
    )
    assert now.train.fingerprint != old.train.fingerprint and len(now.train) > len(old.train)
    assert set(hub) == {"r1", "r2"}
    again = prepare(DataConfig(source=f"hf:{HUB_NAME}@r2", tokenizer="bpe:300", cache_dir=cache))
    assert again.dataset_id == now.dataset_id and again.train.path == now.train.path


def test_an_hf_stream_is_read_once_for_both_splits(hub, tmp_path):
    """Tokenising opens the stream once (with gpt2, which is not trained on the corpus, nothing
    else reads it): each document goes to its split as it arrives. The arrays are the bytes that
    reading each split in a stream of its own wrote (their checksums, from the code before), and
    what encoding each split's documents gives."""
    cfg = DataConfig(
        source=f"hf:{HUB_NAME}@r1", tokenizer="gpt2", val_fraction=0.2, cache_dir=str(tmp_path)
    )
    data = prepare(cfg)
    assert hub == ["r1"]
    assert data.dataset_id == f"hf:{HUB_NAME}@r1@c307f1d181e2"
    sums = {
        split: json.loads(array.path.with_suffix(".json").read_text())["checksum"]
        for split, array in (("train", data.train), ("validation", data.val))
    }
    assert sums == {
        "train": "309251d770a2219ff0e5b79aed06dfaf",
        "validation": "41c49207a61707152ea72c896e34b442",
    }
    corpus, eot = load_corpus(cfg), [data.tokenizer.eot_id]
    for split, array in (("train", data.train), ("validation", data.val)):
        docs = corpus.documents(corpus.parts[0], split)
        assert array.tokens.tolist() == [
            t for _, text in docs for t in data.tokenizer.encode(text) + eot
        ]
    assert (len(data.train), len(data.val)) == (4898, 1302)


def test_the_unigram_counts_are_computed_once_with_the_cache(hub, tmp_path, monkeypatch):
    """The first reader counts each part in chunks and writes the counts beside the array; a
    later process reads them; they are np.bincount's."""
    data = prepare(
        DataConfig(source=f"hf:{HUB_NAME}@r1", tokenizer="bpe:300", cache_dir=str(tmp_path))
    )
    monkeypatch.setattr(data_cache, "COUNT_CHUNK", 100)  # many chunks
    tokens = np.asarray(data.train.part("webtext"), dtype=np.int64)
    first = data.train.part_counts("webtext")
    assert np.array_equal(first, np.bincount(tokens))
    assert (data.train.path.parent / f"{data.train.path.stem}.counts-webtext.npy").exists()

    def counted_again(*args, **kwargs):
        raise AssertionError("counted again: the cache's counts were not read")

    monkeypatch.setattr(data_cache, "streamed_bincount", counted_again)
    data_cache._COUNTS.clear()  # as a new process starts
    assert np.array_equal(data.train.part_counts("webtext"), first)
    assert data.train.counts(300).sum() == pytest.approx(len(tokens))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def two_nodes():
    """A two-node local Ray cluster (its head on a free port, with no CPUs) and a function that
    runs `task.remote(*args)` pinned to each node, args_by_node[i] on node i (None: not on
    it), at once."""
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "gcs_server_port": _free_port()}
    )
    nodes = [cluster.add_node(num_cpus=1), cluster.add_node(num_cpus=1)]

    def on_nodes(task, *args_by_node):
        pinned = [NodeAffinitySchedulingStrategy(n.node_id, soft=False) for n in nodes]
        return ray.get(
            [
                task.options(scheduling_strategy=s).remote(*a)
                for s, a in zip(pinned, args_by_node)
                if a is not None
            ]
        )

    try:
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        yield on_nodes
    finally:
        ray.shutdown()
        cluster.shutdown()


def counting_prepare():
    """prepare(cfg, own_cache) -> (the splits it tokenised, dataset_id, the training array's
    path), its node's cache `own_cache` when given. A closure, so that Ray ships it by value to
    workers that cannot import this test module."""

    def prepare_counting(cfg, own_cache=None):
        from benchmark.data import cache as c

        if own_cache is not None:
            os.environ["SHAPEBENCH_CACHE"] = own_cache
        builds, write = [], c._write_tokens
        c._write_tokens = lambda *a, **k: builds.extend(a[0]) or write(*a, **k)
        try:
            data = c.prepare(cfg)
        finally:
            c._write_tokens = write
        return builds, data.dataset_id, str(data.train.path)

    return prepare_counting


@pytest.mark.slow
def test_two_nodes_sharing_a_cache_tokenise_once(corpus, tmp_path):
    """Both nodes preparing the same corpus into one shared cache folder at once: the splits are
    written once (two builds: train and validation) and both nodes read the same checksummed
    arrays; then a corrupt copy of the shared array is rebuilt by the next node that reads it,
    and only it is."""
    import ray

    shared = str(tmp_path / "shared-cache")
    cfg = DataConfig(source=str(corpus / "text.txt"), tokenizer="bpe:320", cache_dir=shared)
    task = ray.remote(num_cpus=1)(counting_prepare())
    with two_nodes() as on_nodes:
        first = on_nodes(task, [cfg], [cfg])
        assert sorted(split for builds, _, _ in first for split in builds) == [
            "train",
            "validation",
        ]
        assert len({(d, p) for _, d, p in first}) == 1  # one dataset, one array, both nodes
        array = first[0][2]
        with open(array, "r+b") as f:  # a corrupt shared copy: one byte changed
            byte = f.read(1)
            f.seek(0)
            f.write(bytes([byte[0] ^ 0xFF]))
        second = on_nodes(task, [cfg], [cfg])
        assert sorted(split for builds, _, _ in second for split in builds) == ["train"]


@pytest.mark.slow
def test_two_nodes_download_the_cache_the_driver_built_into_the_storage(
    corpus, tmp_path, monkeypatch
):
    """The driver tokenises into the study's storage (a file:// URI standing for the bucket);
    two nodes, each with a cache of its own, prepare at once and tokenise nothing: they read the
    driver's arrays. The stored training array corrupted, a node with an empty cache rebuilds that
    split alone and replaces it, and the other node, its cache emptied too, downloads the good one."""
    import ray

    from benchmark.store.location import read_bytes, write_bytes

    uri = f"file://{tmp_path}/bucket/cache"
    cfg = DataConfig(source=str(corpus / "text.txt"), tokenizer="bpe:320", cache_dir=uri)
    monkeypatch.setenv("SHAPEBENCH_CACHE", str(tmp_path / "driver"))
    builds, dataset_id, array = counting_prepare()(cfg)
    assert sorted(builds) == ["train", "validation"]
    stored = f"{uri}/{Path(array).relative_to(tmp_path / 'driver')}"
    task = ray.remote(num_cpus=1)(counting_prepare())
    own = [str(tmp_path / "node0"), str(tmp_path / "node1")]
    with two_nodes() as on_nodes:
        read = on_nodes(task, [cfg, own[0]], [cfg, own[1]])
        assert [builds for builds, _, _ in read] == [[], []]
        assert {d for _, d, _ in read} == {dataset_id}
        assert [Path(p).read_bytes() for _, _, p in read] == [Path(array).read_bytes()] * 2

        data = bytearray(read_bytes(stored))
        data[10] ^= 0xFF
        write_bytes(stored, bytes(data))
        fresh = [str(tmp_path / "node0-again"), str(tmp_path / "node1-again")]
        rebuilt = on_nodes(task, [cfg, fresh[0]])
        again = on_nodes(task, None, [cfg, fresh[1]])
    assert [builds for builds, _, _ in rebuilt + again] == [["train"], []]
    assert read_bytes(stored) == Path(array).read_bytes()


# ---- a token cache in the study's storage: each node downloads what one built ------------------


@pytest.fixture(params=["file", "s3"])
def bucket(request, tmp_path):
    """The study's storage: a file:// URI (pyarrow's LocalFileSystem) or a prefix in a bucket of
    the moto S3 server (pyarrow's S3 client, as a cloud bucket gets)."""
    if request.param == "file":
        return f"file://{tmp_path}/bucket/cache"
    return f"{request.getfixturevalue('s3_prefix')}/cache"


@pytest.fixture
def builds(monkeypatch):
    """What this process built: the splits it tokenised and the tokenizers it trained."""
    from benchmark.data import tokenizer

    done = []
    write, train = data_cache._write_tokens, tokenizer.train_bpe
    monkeypatch.setattr(
        data_cache, "_write_tokens", lambda *a, **k: done.extend(a[0]) or write(*a, **k)
    )
    monkeypatch.setattr(tokenizer, "train_bpe", lambda *a: done.append("bpe") or train(*a))
    return done


def _on_node(monkeypatch, tmp_path, node: str, cfg: DataConfig):
    """`prepare(cfg)` as on a node whose own cache is tmp_path/node."""
    monkeypatch.setenv("SHAPEBENCH_CACHE", str(tmp_path / node))
    return prepare(cfg)


def _files(fs, root: str) -> list[str]:
    found = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return sorted(i.path[len(root) + 1 :] for i in found if i.type == pafs.FileType.File)


def _mirrored(uri: str, node) -> tuple[list[str], list[str]]:
    """(the storage's files, the node cache's tokenizer and token files), by path in the cache."""
    from benchmark.store.location import resolve

    local = [f for f in _files(pafs.LocalFileSystem(), str(node)) if f.startswith("token")]
    return _files(*resolve(uri)), local


def test_a_cache_in_the_studys_storage_is_built_once_and_downloaded(
    corpus, tmp_path, monkeypatch, builds, bucket
):
    """The first node trains the tokenizer, tokenises both splits and uploads the five files; a
    second node, with a cache of its own, trains and tokenises nothing: a plan there reads the
    split's size from the storage, and prepare downloads the same bytes."""
    cfg = DataConfig(source=str(corpus / "text.txt"), tokenizer="bpe:320", cache_dir=bucket)
    built = _on_node(monkeypatch, tmp_path, "a", cfg)
    assert sorted(builds) == ["bpe", "train", "validation"]
    remote, local = _mirrored(bucket, tmp_path / "a")
    assert remote == local and len(remote) == 5  # tokenizer.json, two arrays, two sidecars
    builds.clear()
    monkeypatch.setenv("SHAPEBENCH_CACHE", str(tmp_path / "b"))
    assert cached_parts(cfg) == {"text": (len(built.train), 1.0)}
    read = _on_node(monkeypatch, tmp_path, "b", cfg)
    assert builds == []
    assert read.train.path == tmp_path / "b" / built.train.path.relative_to(tmp_path / "a")
    assert read.dataset_id == built.dataset_id
    assert read.tokenizer.tokenizer_id == built.tokenizer.tokenizer_id
    for split in ("train", "val"):
        assert np.array_equal(getattr(read, split).tokens, getattr(built, split).tokens)


def test_a_corrupt_copy_in_the_storage_is_rebuilt_and_replaced(
    corpus, tmp_path, monkeypatch, builds, bucket, caplog
):
    """One byte of the stored training array changed: the next node to download it finds the
    checksum wrong, keeps nothing of it, tokenises that split (only it) and uploads it over the
    bad copy; the node after that downloads the good one."""
    from benchmark.store.location import read_bytes, write_bytes

    cfg = DataConfig(source=str(corpus / "text.txt"), tokenizer="bpe:320", cache_dir=bucket)
    good = _on_node(monkeypatch, tmp_path, "a", cfg)
    stored = f"{bucket}/{good.train.path.relative_to(tmp_path / 'a')}"
    data = bytearray(read_bytes(stored))
    data[10] ^= 0xFF
    write_bytes(stored, bytes(data))
    builds.clear()
    with caplog.at_level(logging.WARNING, logger="benchmark.data"):
        rebuilt = _on_node(monkeypatch, tmp_path, "b", cfg)
    assert builds == ["train"]
    assert "checksum differs" in caplog.text and "rebuilding it" in caplog.text
    assert read_bytes(stored) == good.train.path.read_bytes()
    assert np.array_equal(rebuilt.train.tokens, good.train.tokens)
    builds.clear()
    _on_node(monkeypatch, tmp_path, "c", cfg)
    assert builds == []


def test_a_cache_made_before_the_storage_was_named_is_uploaded(
    corpus, tmp_path, monkeypatch, builds
):
    """A node whose own cache is warm, given the storage, uploads what it has rather than letting
    the other nodes each tokenise."""
    uri = f"file://{tmp_path}/bucket"
    source = str(corpus / "text.txt")
    _on_node(monkeypatch, tmp_path, "a", DataConfig(source=source, tokenizer="bpe:320"))
    builds.clear()
    _on_node(
        monkeypatch, tmp_path, "a", DataConfig(source=source, tokenizer="bpe:320", cache_dir=uri)
    )
    assert builds == []
    remote, local = _mirrored(uri, tmp_path / "a")
    assert remote == local and len(remote) == 5


def test_a_storage_that_cannot_take_the_cache_is_refused_in_one_line(tmp_path):
    (tmp_path / "taken").write_text("a file")
    cfg = DataConfig(source="embedded", cache_dir=f"file://{tmp_path}/taken")
    with pytest.raises(ValueError) as err:
        cfg.checked()
    assert (
        str(err.value) == f"--cache file://{tmp_path}/taken: exists and is a file, not a directory"
    )
