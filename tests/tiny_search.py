"""The tiny searches of the search, cluster, tuning and fault tests (imported as `tiny_search`:
pytest puts tests/ on the path): the `corpus` fixture (conftest.py) tokenised by a small BPE, as
`SearchOptions.data` and as the command line's flags, trained eagerly in float32."""

from __future__ import annotations

import os
import time
from pathlib import Path

from benchmark.data import DataConfig

TOKENIZER = "bpe:320"

# One CPU a trial, on a Ray of this machine's CPUs: a run trains with as many torch threads as its
# trial's CPUs (search/trainable.py), and on a 2-core machine, where Ray's own processes, the
# driver and the test take turns on the cores too, a run's two threads wait on each other at every
# operation (the dated suite benchmark measures it). As SearchOptions' cpus_per_trial and as the
# command line's flag.
CPUS_PER_TRIAL = 1
CPU_FLAGS = ["--cpus-per-trial", str(CPUS_PER_TRIAL)]


def space(name: str, axes: list[str], *lines: str) -> str:
    """A tiny space's YAML (100K parameters, 3 layers, 4K tokens a run) as a `str.format` template:
    its `axes:` lines, then `lines` (objectives, trials, ...), their `{fields}` the caller's."""
    return (
        "\n".join(
            [
                f"name: {name}",
                "budget: 100K",
                "count: total",
                "tolerance: 2%",
                "base: {{vocab_size: 320, n_heads: 2, layers: {{begin: 1, middle: 1, end: 1}}}}",
                "axes:",
                *(f"  {a}" for a in axes),
                "training: {{tokens: 4K, seq_len: 32, batch_size: 8, lr: 3e-3, eval_tokens: 1K}}",
                *lines,
            ]
        )
        + "\n"
    )


def data(corpus: Path) -> DataConfig:
    """The corpus as a search's data, its token cache beside it (shared by the session's tests)."""
    return DataConfig(
        source=str(corpus / "text.txt"), tokenizer=TOKENIZER, cache_dir=str(corpus / "cache")
    )


def cli(corpus: Path) -> list[str]:
    """The same data and a fast, exact training policy as `shapebench search` flags."""
    return [
        "--data",
        str(corpus / "text.txt"),
        "--tokenizer",
        TOKENIZER,
        "--no-compile",
        "--precision",
        "fp32",
    ]


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
        return open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except OSError:
        return False


def gone(pids, within_s: float = 60.0) -> bool:
    """Whether every process of `pids` has ended, waiting up to `within_s` for those ending
    (a worker Ray has just been told to kill)."""
    deadline = time.monotonic() + within_s
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not any(alive(pid) for pid in pids)
