"""The memory estimate against the records: the peaks the H200 record measured
(results/perf-h200-hc-kernels) and the papers'-scale command of results/reference-2/README.md
planned on 80 GiB GPUs. A records check (tests/test_layers.py RECORD_CHECKS): it reads results/."""

import dataclasses
import json
import re
import shlex
from pathlib import Path

import pytest

from benchmark.perf import probe
from benchmark.perf.scale import reference_values
from benchmark.recipe import TrainConfig, estimate_memory, parse_size
from benchmark.recipe.memory import GIB
from benchmark.search.command import plan_main
from benchmark.space import load_space, resolve
from benchmark.space.plan import TRIAL_REST_S
from benchmark.store.speeds import Speed

ROOT = Path(__file__).resolve().parent.parent
H200_LOG = ROOT / "results" / "perf-h200-hc-kernels" / "3_scale_after.log"
REFERENCE_2 = ROOT / "results" / "reference-2" / "README.md"
# The estimate against the H200 record's peaks (bf16, compiled, micro-batch 16 x 2048 at 113M): it
# is 2-7% above each (benchmarks/2026-11-29-memory-estimate.md); above is the safe side, as a plan
# that fits by it fits the run. The band allows 0-10% above.
H200_BAND = (0.0, 0.10)


@pytest.fixture(autouse=True)
def fixed_machine(monkeypatch):
    monkeypatch.setattr(probe, "probe_speed", lambda spec, cfg: Speed(5e10, TRIAL_REST_S, 0))


def h200_peaks() -> list[tuple[str, str, float]]:
    """(family, streams, peak GiB) of each row of the record's table."""
    rows = []
    for line in H200_LOG.read_text().splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 12 and cells[0] != "family":
            rows.append((cells[0], cells[5], float(cells[11])))
    return rows


def test_estimate_against_the_h200_record():
    """Every path of the record (default space at 113M, bf16 compiled, micro-batch 16 x 2048), its
    spec resolved as `perf scale` resolved it: the estimate is within H200_BAND of what it measured."""
    space = load_space(ROOT / "search_spaces" / "default.yaml", [])
    cfg = TrainConfig.from_dict({**space.trial_training, "precision": "bf16"})
    peaks = h200_peaks()
    assert len(peaks) == 8
    for family, streams, measured in peaks:
        spec = resolve(space, reference_values(space, family, {})).solution.spec
        if spec.hyper is not None:
            spec = dataclasses.replace(
                spec, hyper=dataclasses.replace(spec.hyper, stream_dtype=streams)
            )
        error = estimate_memory(spec, cfg).total / GIB / measured - 1
        assert H200_BAND[0] <= error <= H200_BAND[1], (family, streams, measured, error)


def papers_scale_commands() -> list[list[str]]:
    """Each `shapebench search` of the README's papers'-scale section, as a plan's arguments."""
    section = REFERENCE_2.read_text().split("## At the papers' scale")[1]
    script = section.split("```bash")[1].split("```")[0]
    common = shlex.split(re.search(r"^P='(.*)'$", script, re.M).group(1))
    budgets = dict(re.findall(r"([\w|*]+)\) B='--set budget=([^']+)'", script))
    spaces = re.search(r"for s in ([\w ]+); do", script).group(1).split()
    flags = shlex.split(re.search(r"--gpu-memory \S+", script).group(0))
    out = []
    for s in spaces:
        named = [b for names, b in budgets.items() if s in names.split("|")]
        budget = named[0] if named else budgets["*"]
        space = str(ROOT / "search_spaces" / "reference-2" / f"{s}.yaml")
        out.append([space, "--set", f"budget={budget}", *common, "--tokenizer", "gpt2", *flags])
    return out


def test_the_papers_scale_fits(capsys):
    """The README's command at the papers' scale, planned as written (it names --gpu-memory
    80GiB): every candidate of every space fits, at the paper's batch of 256 x 2048."""
    commands = papers_scale_commands()
    assert len(commands) == 8 and all("--gpu-memory" in c for c in commands)
    for args in commands:
        assert plan_main([*args, "--json"]) == 0, capsys.readouterr().err
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert rows and all(r["micro_batch"] * r["grad_accum"] == 256 for r in rows)
        assert all(r["peak_mem_est"] <= parse_size("80GiB") for r in rows)
