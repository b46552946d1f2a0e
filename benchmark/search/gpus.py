"""The GPU memory a plan and a search fit each run's micro-batch to (space/memory.py):
`--gpu-memory SIZE` when given, else, with `--address`, the connected cluster's GPUs.

The cluster's are read by one Ray task per kind of GPU, holding one GPU and asking torch for its
name and total memory. Ray's `accelerator_type:*` resources name the kinds (one node may serve
for all of its kind); a GPU node that declares no type is probed as a kind of its own. The
smallest wins, so a run fits whichever node it lands on. A cluster without GPUs fits nothing, as
without the flag, and the plan says so in one line."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from benchmark.recipe.memory import fmt_size

# A probe holds a whole GPU: on a cluster whose GPUs are all busy it would wait for ever, so the
# plan goes on without after this long and says so.
PROBE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Gpu:
    kind: str | None  # Ray's accelerator type (e.g. H100); None for a node that declares none
    name: str  # as torch names the device, e.g. "NVIDIA H100 80GB HBM3"
    memory: int  # bytes, torch.cuda.get_device_properties(0).total_memory


def gpu_memory(
    given: int | None, address: str | None, probe: Callable[[str], list[Gpu]] | None = None
) -> tuple[int | None, str | None]:
    """(the bytes runs are fitted to, or None; the line that says where they came from, or None
    when the flag gave them or no cluster is named). `probe`: the cluster's GPUs (cluster_gpus)."""
    if given or not address:
        return given, None
    try:
        gpus = (probe or cluster_gpus)(address)
    except Exception as e:  # noqa: BLE001 - Ray fails in many ways here; each is one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return None, (
            f"GPU memory: not read from the cluster at {address} ({first}); runs are not "
            "fitted to a GPU: --gpu-memory SIZE fits them"
        )
    if not gpus:
        return None, (
            f"GPU memory: the cluster at {address} has no GPUs; runs are not fitted to one"
        )
    gpus = sorted(gpus, key=lambda g: g.memory)
    seen = ", ".join(f"{g.name} {fmt_size(g.memory)}" for g in gpus)
    return gpus[0].memory, (
        f"GPU memory: {fmt_size(gpus[0].memory)}, the smallest of the cluster's GPUs ({seen}); "
        "--gpu-memory SIZE overrides it"
    )


def kinds(nodes: Iterable[Mapping[str, Any]]) -> list[tuple[str | None, str | None]]:
    """(accelerator type, node id) to probe, one per kind of GPU among the alive nodes of
    `ray.nodes()`: (type, None) for a declared type, (None, node) for a GPU node without one."""
    typed, untyped = set(), []
    for node in nodes:
        resources = node.get("Resources", {})
        if not node.get("Alive") or not resources.get("GPU"):
            continue
        declared = [r.split(":", 1)[1] for r in resources if r.startswith("accelerator_type:")]
        typed.update(declared)
        if not declared:
            untyped.append(node["NodeID"])
    return [(kind, None) for kind in sorted(typed)] + [(None, node) for node in untyped]


def cluster_gpus(
    address: str,
    measure: Callable[[], tuple[str, int]] | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> list[Gpu]:
    """The cluster's GPUs, one per kind (kinds); [] when it has none. Connects to the cluster
    at `address` and disconnects after, unless this process was connected already. `measure`,
    run in a task holding one GPU: (name, bytes) of the GPU it holds (this_gpu)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    connected = ray.is_initialized()
    if not connected:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    try:
        task = ray.remote(num_cpus=0, num_gpus=1)(measure or this_gpu)
        probes = kinds(ray.nodes())
        refs = [
            task.options(accelerator_type=kind).remote()
            if kind
            else task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
            ).remote()
            for kind, node in probes
        ]
        try:
            found = ray.get(refs, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            for ref in refs:
                ray.cancel(ref, force=True)
            raise TimeoutError(f"no GPU free for a probe within {timeout_s:g} s") from None
        return [Gpu(kind, name, memory) for (kind, _), (name, memory) in zip(probes, found)]
    finally:
        if not connected:
            ray.shutdown()


def this_gpu() -> tuple[str, int]:
    """The name and total memory of the GPU Ray gave this task (CUDA_VISIBLE_DEVICES: device 0)."""
    import torch

    props = torch.cuda.get_device_properties(0)
    return props.name, props.total_memory
