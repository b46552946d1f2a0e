"""The memory estimate (recipe/memory.py) and the plan's use of it: the estimate against peaks
measured here on a CPU, the micro-batch a GPU's memory fits with the declared batch kept, and the
one-line refusal of a run that cannot fit one sequence. Against the records (the H200 peaks, the
papers'-scale command): test_memory_records.py."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmark.perf import probe
from benchmark.perf.scale import reference_values
from benchmark.recipe import TrainConfig, estimate_memory, fit_micro_batch, parse_size
from benchmark.recipe.memory import GIB, USABLE
from benchmark.search import gpus
from benchmark.search.command import plan_main
from benchmark.search.gpus import Gpu, gpu_memory, kinds
from benchmark.space import load_space, resolve
from benchmark.space.memory import fitted_space, memory_columns
from benchmark.space.plan import TRIAL_REST_S
from benchmark.store.speeds import Speed

ROOT = Path(__file__).resolve().parent.parent
# Against peaks measured here (fp32, eager, CPU resident memory): -10% to +1% at micro-batch 32
# (the same report); resident memory also holds the allocator's slack, so the band is wider.
CPU_BAND = (-0.15, 0.10)


@pytest.fixture(autouse=True)
def fixed_machine(monkeypatch):
    monkeypatch.setattr(probe, "probe_speed", lambda spec, cfg: Speed(5e10, TRIAL_REST_S, 0))


def test_sizes():
    assert parse_size("80GiB") == 80 * 2**30
    assert parse_size("40GB") == 40 * 10**9
    assert parse_size("24") == 24 * 2**30  # a bare number is GiB, as GPUs are sold
    assert parse_size(1000) == 1000  # an int is bytes
    with pytest.raises(ValueError, match="expected a memory size like 80GiB"):
        parse_size("lots")


CPU_PROBE = """
import json, sys, torch
from benchmark.arch import ArchSpec
from benchmark.recipe import TrainConfig, estimate_memory
from benchmark.trial.memory import held_memory_bytes
from benchmark.trial.training import train
spec, cfg = ArchSpec.from_dict(json.loads(sys.argv[1])), TrainConfig.from_dict(json.loads(sys.argv[2]))
g = torch.Generator().manual_seed(0)
def batches():
    while True:
        x = torch.randint(spec.vocab_size, (cfg.batch_size, cfg.seq_len + 1), generator=g)
        yield x[:, :-1], x[:, 1:]
base = held_memory_bytes(torch.device("cpu"))
peak = train(spec, cfg, batches()).peak_mem_bytes - base  # VmHWM since train's reset, over base
print(json.dumps([peak, estimate_memory(spec, cfg).total]))
"""


# Two steps (the second holds Adam's state) of an eager fp32 model at micro-batch 32 x 256.
CPU_SPECS = {
    "transformer": {
        "family": "transformer",
        "d_model": 256,
        "n_heads": 4,
        "layers": 4,
        "ffn": {"d_ff": 768},
    },
    "looped": {
        "family": "looped",
        "d_model": 256,
        "n_heads": 4,
        "layers": {"begin": 1, "middle": 2, "end": 1},
        "loops": 3,
        "ffn": {"d_ff": 768},
    },
}
CPU_TRAINING = {"tokens": 2 * 32 * 256, "seq_len": 256, "batch_size": 32, "warmup": 0}
CPU_TRAINING |= {"precision": "fp32", "compile": False, "device": "cpu"}


@pytest.fixture(scope="module")
def cpu_probes():
    """Every case's probe, started together at the first case: each a fresh process whose resident
    high-water mark is its own, so running side by side changes neither measurement; each trains
    with one thread (OMP_NUM_THREADS, conftest.one_torch_thread), so on two cores the two take
    about the time of the longer one instead of the sum."""
    probes = {
        name: subprocess.Popen(
            [sys.executable, "-c", CPU_PROBE, json.dumps(spec), json.dumps(CPU_TRAINING)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, spec in CPU_SPECS.items()
    }
    yield probes
    for proc in probes.values():  # a case that was not selected, or timed out, leaves its probe
        if proc.poll() is None:
            proc.kill()
        proc.communicate()  # a second call returns what the first read


@pytest.mark.slow
@pytest.mark.parametrize("family", list(CPU_SPECS))
def test_estimate_against_a_cpu_peak(cpu_probes, family):
    """The probe of `family`'s model (CPU_SPECS, CPU_TRAINING), in a fresh process: its resident
    high-water mark over what it held before is within CPU_BAND of the estimate."""
    proc = cpu_probes[family]
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    measured, estimate = json.loads(out.splitlines()[-1])
    assert CPU_BAND[0] <= estimate / measured - 1 <= CPU_BAND[1], (measured, estimate)


def test_the_fit_keeps_the_batch():
    """The largest micro-batch dividing the declared batch that fits, and the accumulation that
    keeps it; a larger GPU fits a larger micro-batch; the fit's peak is the estimate there."""
    space = load_space(ROOT / "search_spaces" / "default.yaml", [])
    spec = resolve(space, reference_values(space, "looped", {})).solution.spec
    cfg = TrainConfig.from_dict(space.trial_training)  # 16 x 16 of 2048 tokens
    small, large = fit_micro_batch(spec, cfg, 40 * GIB), fit_micro_batch(spec, cfg, 80 * GIB)
    for fit in (small, large):
        assert fit.micro_batch * fit.grad_accum == 256
        assert fit.peak == estimate_memory(spec, cfg, fit.micro_batch).total <= USABLE * fit.limit
        assert estimate_memory(spec, cfg, fit.micro_batch * 2).total > USABLE * fit.limit
    assert (small.micro_batch, large.micro_batch) == (16, 32)
    assert fit_micro_batch(spec, cfg, 1 * GIB).micro_batch is None


def test_a_fitted_space_trains_at_the_smallest_fit():
    space = load_space(ROOT / "search_spaces" / "default.yaml", [])
    cfg = TrainConfig.from_dict(space.trial_training)
    rows = [memory_columns(spec, cfg, "80GiB") for spec in _specs(space, "transformer", "looped")]
    fitted = fitted_space(space, rows)
    assert [r["micro_batch"] for r in rows] == [64, 32]
    assert (fitted.training["batch_size"], fitted.training["grad_accum"]) == (32, 8)
    assert fitted.training["seq_len"] == 2048


def _specs(space, *families):
    return [resolve(space, reference_values(space, f, {})).solution.spec for f in families]


def test_the_plan_prints_memory(capsys):
    assert plan_main([str(ROOT / "search_spaces" / "quickstart.yaml"), "--json"]) == 0
    out, err = capsys.readouterr()
    rows = [json.loads(line) for line in out.splitlines()]
    assert all(r["peak_mem_est"] > 0 and r["gpu_memory"] is None for r in rows)
    assert "est. peak memory" in err


def test_a_run_that_cannot_fit_is_refused(capsys):
    """Micro-batch 1 of 2048 tokens of the default space at 113M does not fit 2 GiB: exit 2, one
    line at training.batch_size naming the candidate and its estimate."""
    default = str(ROOT / "search_spaces" / "default.yaml")
    assert plan_main([default, "--trials", "2", "--gpu-memory", "2GiB", "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert re.search(
        r"default\.yaml:\d+:\d+: training\.batch_size: candidate 0 \([\w-]+, 11\d\.\dM parameters\) "
        r"needs an estimated \d+\.\d GiB at micro-batch 1 x seq_len 2048, more than 90% of the GPU's "
        r"2\.0 GiB \(--gpu-memory\)",
        err,
    ), err


# ---- the GPU memory of the connected cluster (search/gpus.py) ----------------------------------

H100 = Gpu("H100", "NVIDIA H100 80GB HBM3", 85_031_714_816)
A10G = Gpu("A10G", "NVIDIA A10G", 23_836_033_024)


def _no_probe(address):
    raise AssertionError("the cluster was probed")


def test_the_gpu_memory_is_the_flags_else_the_smallest_of_the_clusters():
    assert gpu_memory(80 * GIB, "auto", _no_probe) == (80 * GIB, None)
    assert gpu_memory(None, None, _no_probe) == (None, None)
    assert gpu_memory(None, "auto", lambda a: [H100, A10G]) == (
        A10G.memory,
        "GPU memory: 22.2 GiB, the smallest of the cluster's GPUs (NVIDIA A10G 22.2 GiB, "
        "NVIDIA H100 80GB HBM3 79.2 GiB); --gpu-memory SIZE overrides it",
    )
    assert gpu_memory(None, "auto", lambda a: []) == (
        None,
        "GPU memory: the cluster at auto has no GPUs; runs are not fitted to one",
    )

    def busy(address):
        raise TimeoutError("no GPU free for a probe within 120 s")

    assert gpu_memory(None, "auto", busy) == (
        None,
        "GPU memory: not read from the cluster at auto (no GPU free for a probe within 120 s); "
        "runs are not fitted to a GPU: --gpu-memory SIZE fits them",
    )


def test_one_probe_per_kind_of_gpu():
    """Ray's accelerator types name the kinds; a GPU node without one is probed itself; CPU-only
    and dead nodes are not."""

    def node(name, alive=True, **resources):
        return {"NodeID": name, "Alive": alive, "Resources": {"CPU": 8.0, **resources}}

    nodes = [
        node("n1", GPU=8.0, **{"accelerator_type:H100": 1.0}),
        node("n2", GPU=8.0, **{"accelerator_type:H100": 1.0}),
        node("n3", GPU=1.0, **{"accelerator_type:A10G": 1.0}),
        node("n4", GPU=2.0),
        node("n5"),
        node("n6", alive=False, GPU=1.0, **{"accelerator_type:T4": 1.0}),
    ]
    assert kinds(nodes) == [("A10G", None), ("H100", None), (None, "n4")]


def test_a_plan_with_an_address_fits_the_clusters_smallest_gpu(monkeypatch, capsys):
    quickstart = str(ROOT / "search_spaces" / "quickstart.yaml")
    monkeypatch.setattr(gpus, "cluster_gpus", lambda address: [H100, A10G])
    assert plan_main([quickstart, "--address", "auto", "--json"]) == 0
    out, err = capsys.readouterr()
    assert {json.loads(line)["gpu_memory"] for line in out.splitlines()} == {A10G.memory}
    assert "GPU memory: 22.2 GiB, the smallest of the cluster's GPUs" in err


@pytest.mark.slow
def test_the_probe_on_a_local_cluster(capsys):
    """A CPU-only cluster: the plan is what it is without --address, plus one line. Then two nodes
    that declare one GPU each (one an A10G, one of no type; this machine has none, so `measure`
    stands for torch and answers by node): each is probed on its own node, and the smaller is
    fitted to. With the typed GPU held by an actor, its probe waits, and gives up."""
    import ray
    from ray.cluster_utils import Cluster

    quickstart = str(ROOT / "search_spaces" / "quickstart.yaml")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        assert plan_main([quickstart, "--json"]) == 0
        alone = capsys.readouterr()
        assert plan_main([quickstart, "--json", "--address", cluster.address]) == 0
        out, err = capsys.readouterr()
        assert out == alone.out and not ray.is_initialized()
        line = (
            f"GPU memory: the cluster at {cluster.address} has no GPUs; runs are not fitted to one"
        )
        seconds = re.compile(r"[0-9.]+ s\b")  # the plan's own timings
        assert seconds.sub("", err) == seconds.sub("", f"{line}\n{alone.err}")

        typed = cluster.add_node(num_cpus=0, num_gpus=1, resources={"accelerator_type:A10G": 1})
        plain = cluster.add_node(num_cpus=0, num_gpus=1)
        cluster.wait_for_nodes()
        seen = {typed.node_id: ("fake A10G", 24 * GIB), plain.node_id: ("fake GPU", 16 * GIB)}

        def measure():
            import ray

            return seen[ray.get_runtime_context().get_node_id()]

        ray.init(address=cluster.address)
        found = gpus.cluster_gpus(cluster.address, measure)
        assert found == [Gpu("A10G", "fake A10G", 24 * GIB), Gpu(None, "fake GPU", 16 * GIB)]
        assert gpus.gpu_memory(None, cluster.address, lambda a: found)[0] == 16 * GIB

        @ray.remote(num_cpus=0, num_gpus=1, resources={"accelerator_type:A10G": 0.001})
        class Holder:
            def ready(self):
                return True

        holder = Holder.remote()
        ray.get(holder.ready.remote())
        with pytest.raises(TimeoutError, match="no GPU free for a probe within 2 s"):
            gpus.cluster_gpus(cluster.address, measure, timeout_s=2)
    finally:
        ray.shutdown()
        cluster.shutdown()
