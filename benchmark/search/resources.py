"""What one trial asks of the cluster, decided per node

A trial runs on one node, so its CPUs and GPUs must fit on one node: the defaults come from the
nodes, never from the cluster's totals (two 1-CPU nodes cannot hold a 2-CPU trial). Defaults: one
GPU per trial when any node has GPUs, else none; the CPUs of the largest node that holds a trial,
shared among the trials that node runs at once; as many trials at once as the nodes hold.

A trial of several workers (`--gpus-per-trial N` with N >= 2, one GPU a worker, or
`--workers-per-trial W` on CPUs) runs as a Ray Train job (trial/distributed.py): its workers,
packed on one node, hold the CPUs and GPUs; the Tune trial that drives them asks for none.

Pure functions of the node list (`ray.nodes()`-shaped dicts), so they are tested without Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from benchmark.trial import Workers


class ResourcesError(ValueError):
    """No node can hold a trial as asked: the message names what is missing."""


@dataclass(frozen=True)
class Node:
    cpus: float
    gpus: float

    def holds(self, cpus: float, gpus: float) -> int:
        """How many trials of (cpus, gpus) this node runs at once."""
        by_cpu = math.floor(self.cpus / cpus + 1e-9) if cpus else math.inf
        by_gpu = math.floor(self.gpus / gpus + 1e-9) if gpus else math.inf
        n = min(by_cpu, by_gpu)
        return 0 if n == math.inf else int(n)


@dataclass(frozen=True)
class TrialResources:
    cpus: float
    gpus: float
    concurrency: int
    workers: int = 1  # > 1: a Ray Train job of this many workers, sharing cpus and gpus

    @property
    def threads(self) -> int:
        """torch threads in a trial (in each of its workers): its CPUs."""
        return max(1, int(self.cpus / self.workers))

    def bundle(self) -> dict[str, float]:
        """Ray Tune's `with_resources` request: the trial's own, or for a Train job none (its
        workers reserve theirs, `worker_group`; the job's controller takes no CPU either). Tune
        refuses a trial that asks for nothing: a token of memory (1 MiB) stands for it."""
        return (
            {"cpu": self.cpus, "gpu": self.gpus}
            if self.workers == 1
            else {"cpu": 0, "memory": 2**20}
        )

    def worker_group(self, parallel: str = "auto"):
        """What each worker of a Train job asks for (trial/distributed.py Workers); None for one process."""
        if self.workers == 1:
            return None

        return Workers(
            count=self.workers,
            cpus=self.cpus / self.workers,
            gpus=self.gpus / self.workers,
            parallel=parallel,
        )

    def describe(self) -> str:
        cpu = f"{_num(self.cpus)} CPU{'s' if self.cpus != 1 else ''}"
        both = cpu + (
            f" and {_num(self.gpus)} GPU{'s' if self.gpus != 1 else ''}" if self.gpus else ""
        )
        return both if self.workers == 1 else f"{both} in {self.workers} workers"


def nodes_of(ray_nodes: Iterable[Mapping[str, Any]]) -> list[Node]:
    """The alive nodes of `ray.nodes()` that can run work (a 0-CPU head runs none)."""
    out = []
    for n in ray_nodes:
        if n.get("Alive", n.get("alive", True)):
            res = n.get("Resources", {})
            out.append(Node(float(res.get("CPU", 0)), float(res.get("GPU", 0))))
    return out


def per_trial(
    nodes: list[Node],
    cpus: float | None = None,
    gpus: float | None = None,
    concurrency: int | None = None,
    workers: int | None = None,
) -> TrialResources:
    """A trial's CPUs and GPUs and how many run at once; ResourcesError when no node holds one.
    `gpus` >= 2 runs a trial as that many workers, one GPU each; `workers` sets the count (CPU
    workers when there are no GPUs); `cpus` is the whole trial's, shared by its workers."""
    if gpus is None:
        gpus = 1.0 if any(n.gpus for n in nodes) else 0.0
    if workers is None:
        workers = int(gpus) if gpus >= 2 else 1
    if workers > 1 and gpus and gpus != workers:
        raise ResourcesError(
            f"GPU: a trial of {workers} workers takes one GPU each; --gpus-per-trial {_num(gpus)} "
            f"is not {workers} (set --gpus-per-trial {workers})"
        )
    if cpus is None:
        cpus = _default_cpus(nodes, gpus, concurrency)
    fits = [n for n in nodes if n.holds(cpus, gpus) > 0]
    if not fits:
        raise ResourcesError(_missing(nodes, cpus, gpus))
    slots = sum(n.holds(cpus, gpus) for n in fits)
    if workers > 1 and cpus < workers:
        raise ResourcesError(
            f"CPU: a trial of {workers} workers needs at least one CPU each; it has {_num(cpus)} "
            f"(raise --cpus-per-trial to {workers} or more)"
        )
    return TrialResources(
        cpus=cpus, gpus=gpus, concurrency=concurrency or max(1, slots), workers=workers
    )


def _default_cpus(nodes: list[Node], gpus: float, concurrency: int | None) -> float:
    """The largest node's CPUs, shared by the trials it runs at once (one per GPU share, or
    `--concurrency` spread over the nodes)."""
    able = [n for n in nodes if n.gpus >= gpus and n.cpus >= 1] or nodes
    if not able:
        return 1.0
    big = max(able, key=lambda n: (n.cpus, n.gpus))
    share = math.floor(big.gpus / gpus + 1e-9) if gpus else 1
    if concurrency and not gpus:
        share = math.ceil(concurrency / max(1, len([n for n in able if n.cpus >= 1])))
    return float(max(1, int(big.cpus // max(1, share))))


def _missing(nodes: list[Node], cpus: float, gpus: float) -> str:
    want = TrialResources(cpus, gpus, 1).describe()
    if not nodes:
        return f"no node can hold a trial: it asks for {want} and the cluster has no alive node"
    big_cpu = max(n.cpus for n in nodes)
    big_gpu = max(n.gpus for n in nodes)
    short = []
    if big_cpu < cpus:
        short.append(f"CPU: a trial asks for {_num(cpus)}, the largest node has {_num(big_cpu)}")
    if big_gpu < gpus:
        short.append(f"GPU: a trial asks for {_num(gpus)}, the largest node has {_num(big_gpu)}")
    if not short:  # each is there, never on one node
        short.append(f"no single node has {want} (a trial runs on one node)")
    return (
        f"no node can hold a trial ({len(nodes)} node{'s' if len(nodes) != 1 else ''}): missing "
        + "; ".join(short)
        + ". Lower --cpus-per-trial / --gpus-per-trial, or add a node that has them"
    )


def _num(x: float) -> str:
    return f"{x:g}"
