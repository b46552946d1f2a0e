"""One tokenisation per cluster: an hf: source pinned to a revision, which its cache key and
dataset_id name (a local .jsonl corpus stands for the Hub: the same code path after the
download); a token cache on a path every node shares, built once by one of two nodes and read by
the other, a corrupt copy rebuilt; the unigram counts computed once with the cache, in chunks."""

import json
import socket

import numpy as np
import pytest

from benchmark.data import DataConfig, prepare, sources
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


@pytest.mark.slow
def test_two_nodes_sharing_a_cache_tokenise_once(corpus, tmp_path):
    """A two-node local Ray cluster (its head on a free port), both nodes preparing the same corpus
    into one shared cache folder at once: the splits are written once (two builds: train and
    validation) and both nodes read the same checksummed arrays; then a corrupt copy of the
    shared array is rebuilt by the next node that reads it, and only it is."""
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    shared = str(tmp_path / "shared-cache")
    cfg = DataConfig(source=str(corpus / "text.txt"), tokenizer="bpe:320", cache_dir=shared)

    @ray.remote(num_cpus=1)
    def prepare_here(cfg):
        from benchmark.data import cache as c

        builds, write = [], c._write_tokens
        c._write_tokens = lambda *a, **k: builds.append(a[-1]) or write(*a, **k)
        data = c.prepare(cfg)
        return builds, data.dataset_id, str(data.train.path)

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "gcs_server_port": _free_port()}
    )
    nodes = [cluster.add_node(num_cpus=1), cluster.add_node(num_cpus=1)]
    try:
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)

        def on_each_node():
            return ray.get(
                [
                    prepare_here.options(
                        scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False)
                    ).remote(cfg)
                    for n in nodes
                ]
            )

        first = on_each_node()
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
        second = on_each_node()
        assert sorted(split for builds, _, _ in second for split in builds) == ["train"]
    finally:
        ray.shutdown()
        cluster.shutdown()
