"""`shapebench plan`: the JSON records, the table, overrides, reproducibility, and the flags
that belong to the search (which must fail loudly rather than do nothing)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmark import count_flops, count_params, perf
from benchmark.perf import probe
from benchmark.recipe import TrainConfig
from benchmark.search.command import plan_main
from benchmark.search.command import search_main as main
from benchmark.space.plan import TRIAL_REST_S
from benchmark.store.speeds import Speed

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = str(ROOT / "search_spaces" / "quickstart.yaml")
FLOPS = 5e10  # a stand-in for this machine's measured training FLOP/s


@pytest.fixture(autouse=True)
def fixed_machine(monkeypatch):
    monkeypatch.setattr(
        probe, "probe_speed", lambda spec, cfg: Speed(FLOPS, TRIAL_REST_S, 0)
    )  # estimates() asks it


def plan_json(capsys, *args):
    assert plan_main([*args, "--json"]) == 0
    out, err = capsys.readouterr()
    return [json.loads(line) for line in out.splitlines()], err


def test_json_records(capsys):
    rows, err = plan_json(capsys, QUICKSTART)
    assert len(rows) == 3 and "median |Δ budget|" in err
    for r in rows:
        assert {
            "family",
            "spec",
            "params_total",
            "params_non_embedding",
            "budget",
            "budget_distance",
            "flops_per_token_train",
            "est_seconds",
        } <= set(r)
        counted = count_params(r["spec"])
        assert (counted["total"], counted["non_embedding"]) == (
            r["params_total"],
            r["params_non_embedding"],
        )
        assert (
            r["budget"] == 1_500_000
            and r["budget_distance"] == (r["params_total"] - 1_500_000) / 1_500_000
        )
        assert abs(r["budget_distance"]) <= 0.005
        assert r["flops_per_token_train"] == count_flops(r["spec"], 128)["train"]
        assert r["tokens"] == 600_000  # training.tokens of the quickstart space
        assert r["est_seconds"] == pytest.approx(
            r["flops_per_token_train"] * r["tokens"] / FLOPS + TRIAL_REST_S
        )
    assert [r["family"] for r in rows] == ["transformer", "looped", "hyperloop"]


@pytest.mark.parametrize("force_color", [None, "1"])
def test_a_piped_plan_keeps_each_row_on_one_line(capsys, monkeypatch, force_color):
    """Not on a terminal (a pipe, a log) rich would wrap the 12-column table to 80 columns, and
    FORCE_COLOR (colour in a CI log) makes rich take a pipe for a terminal."""
    if force_color:
        monkeypatch.setenv("FORCE_COLOR", force_color)
    else:
        monkeypatch.delenv("FORCE_COLOR", raising=False)
    assert plan_main([QUICKSTART]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "│ hyperloop " in line]
    assert len(rows) == 1 and rows[0].count("│") == 15, rows  # est. time, micro x accum, est. peak
    assert re.search(r"min +│ +16 x 1 +│ +\d+\.\d GiB +│$", rows[0].rstrip()), rows


def test_overrides(capsys):
    rows, _ = plan_json(
        capsys, QUICKSTART, "--budget", "3M", "--count", "non_embedding", "--tokens", "20x"
    )
    for r in rows:
        assert r["budget"] == 3_000_000 and abs(r["params_non_embedding"] / 3_000_000 - 1) <= 0.005
        # "20x" multiplies training.tokens_per, which in a space defaults to the budget's count
        assert r["tokens"] == 20 * r["params_non_embedding"] != 20 * r["params_total"]


def test_sampled_plans_follow_the_seed(capsys):
    default = str(ROOT / "search_spaces" / "default.yaml")
    a, _ = plan_json(capsys, default, "--budget", "20M", "--trials", "5", "--seed", "7")
    b, _ = plan_json(capsys, default, "--budget", "20M", "--trials", "5", "--seed", "7")
    c, _ = plan_json(capsys, default, "--budget", "20M", "--trials", "5", "--seed", "8")
    assert len(a) == 5 and a == b and a != c


def test_table(capsys):
    assert plan_main([QUICKSTART]) == 0
    out = capsys.readouterr().out
    assert "quickstart" in out and "1L→2L(×2)→1L" in out and "4× diagonal / loop" in out
    assert "3 (the whole grid) candidates x 2 seeds at 1.5M total parameters ± 0.5%" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--resume"], "shapebench plan: --resume applies only to a search, not to a plan"),
        (
            ["--name", "x", "--seeds", "2"],
            "shapebench plan: --name, --seeds apply only to a search, not to a plan",
        ),
        (
            ["--spec", "arch.yaml"],
            "shapebench plan: --spec applies only to a search, not to a plan",
        ),
        (  # where the curves go: a plan trains none
            ["--tensorboard", "--mlflow", "m"],
            "shapebench plan: --tensorboard, --mlflow apply only to a search, not to a plan",
        ),
        (  # a plan's runs-as-tasks is how --workers schedules them: alone it would change nothing
            ["--no-runs-as-tasks"],
            "shapebench plan: --no-runs-as-tasks schedules --workers N: give it too",
        ),
    ],
)
def test_search_flags_fail_loudly(args, message, capsys):
    assert plan_main([QUICKSTART, *args]) == 2
    assert capsys.readouterr().err == message + "\n"


@pytest.mark.parametrize(
    "flag, value, problem",
    [
        (
            "--data",
            "embedded:wiki=-1",
            "data.source: the weight of part 'wiki' must be a positive number, got '-1'",
        ),
        (
            "--data",
            "embedded:wiki=abc",
            "data.source: the weight of part 'wiki' must be a positive number, got 'abc'",
        ),
        (
            "--data",
            "embedded:wikki=0.5",
            "data.source: unknown embedded part(s) 'wikki' (did you mean 'wiki'?)",
        ),
        (
            "--data",
            "embedded:wiki=0,bible=0",
            "data.source: the weight of part 'wiki' must be a positive number, got '0'",
        ),
        ("--tokenizer", "bogus", "data.tokenizer: unknown tokenizer 'bogus'"),
        (
            "--data",
            "/nonexistent/corpus.txt",
            "data.source: no such file '/nonexistent/corpus.txt'",
        ),
    ],
)
def test_a_plan_refuses_the_data_its_search_would(flag, value, problem, capsys, tmp_path):
    """The same one line (under its own command's name) and exit 2 from the plan as from the search, which refuses it before training."""
    assert main([QUICKSTART, flag, value, "--results", str(tmp_path)]) == 2
    searched = capsys.readouterr().err
    assert plan_main([QUICKSTART, flag, value]) == 2
    planned = capsys.readouterr()
    assert planned.out == "" and searched.count("\n") == 1
    assert planned.err.removeprefix("shapebench plan: ") == searched.removeprefix(
        "shapebench search: "
    )
    assert searched.startswith(f"shapebench search: {problem}")
    assert not list(tmp_path.iterdir())


def test_resume_needs_an_existing_study(capsys, tmp_path):
    assert main([QUICKSTART, "--resume", "--name", "nosuch", "--results", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err
        == f"shapebench search: --resume: no study named 'nosuch' under {tmp_path}/\n"
    )
    assert not list(tmp_path.iterdir())


def test_bad_flags_are_usage_errors(capsys):
    with pytest.raises(SystemExit) as e:
        plan_main([QUICKSTART, "--budget", "lots"])
    assert e.value.code == 2
    assert (
        "argument --budget: expected an amount like 113M, 1.2B or 500K, got 'lots'"
        in capsys.readouterr().err
    )


def test_an_absurd_budget_is_a_plain_error_in_a_second(capsys):
    """--budget 1e30 used to search head counts for minutes; now the solver stops at MAX_WIDTH. The
    error names the flag that set the budget, not the file's `budget:` line it replaced."""
    import time

    t0 = time.perf_counter()
    assert plan_main([QUICKSTART, "--budget", "1e30"]) == 2
    assert time.perf_counter() - t0 < 10
    err = capsys.readouterr().err
    assert err.startswith("--budget 1e30: budget: ") and "would need d_model above 1,048,576" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("name", ["../outside", "a/b", "..", "."])
def test_a_study_name_is_one_folder(name, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main([QUICKSTART, "--name", name, "--results", str(tmp_path)])
    assert e.value.code == 2
    assert (
        f"argument --name: {name!r} is not a study name: use one folder name"
        in capsys.readouterr().err
    )
    assert not list(tmp_path.iterdir())


def test_a_space_whose_name_leaves_the_results_folder_is_refused(capsys, tmp_path):
    space = tmp_path / "evil.yaml"
    space.write_text("name: ../evil\nbudget: 1M\naxes: {family: [transformer]}\n")
    assert plan_main([str(space)]) == 2
    assert capsys.readouterr().err.startswith(f"{space}:1:7: name: '../evil' is not a study name")


@pytest.mark.parametrize("text, kind", [("- a list\n", "list"), ("just words\n", "str")])
def test_a_spec_file_that_is_not_a_mapping_is_one_line(text, kind, capsys, tmp_path):
    spec = tmp_path / "arch.yaml"
    spec.write_text(text)
    assert main(["--spec", str(spec), "--tokens", "1K"]) == 2
    assert capsys.readouterr().err == (
        f"{spec}:1:1: expected a mapping of architecture keys "
        f"(family: ..., d_model: ...), got a {kind}\n"
    )


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "family: looped\nd_model: 32\ntraining: {seq_len: 32, warmpu: 0.1}\n",
            "3:25: training.warmpu: unknown key (did you mean 'warmup'?)",
        ),
        ("family: looped\ntraining: [1, 2]\n", "2:11: training: expected a mapping, got [1, 2]"),
        (
            "family: looped\nfamily: hyperloop\n",
            "2:1: family: duplicate key (first given at line 1)",
        ),
    ],
)
def test_a_spec_files_errors_are_located_as_a_spaces(text, message, capsys, tmp_path):
    """--spec reads its file with the space's loader: the file, line and column of every error,
    its `training:` section checked as a space's is."""
    spec = tmp_path / "arch.yaml"
    spec.write_text(text)
    assert main(["--spec", str(spec)]) == 2
    assert capsys.readouterr().err == f"{spec}:{message}\n"


def test_missing_file(capsys, tmp_path):
    assert plan_main([str(tmp_path / "nope.yaml")]) == 2
    assert (
        capsys.readouterr().err
        == f"{tmp_path / 'nope.yaml'}: cannot read: No such file or directory\n"
    )


def test_run_search_py_plans_the_default_space(tmp_path, monkeypatch):
    """The older entry point, `run_search.py --plan` (an alias of `shapebench plan`), without SPACE
    (search_spaces/default.yaml), from another directory."""
    from benchmark.space.language import load_space
    from benchmark.space.plan import make_plan
    from benchmark.space.source import Override
    from benchmark.store import speeds

    monkeypatch.setenv("SHAPEBENCH_CACHE", str(tmp_path / "cache"))
    plan = make_plan(
        load_space(
            ROOT / "search_spaces" / "default.yaml", [Override.flag("budget", "budget", "113M")]
        )
    )
    first = probe.probe_key(
        plan.candidates[0].spec, TrainConfig.from_dict(plan.space.trial_training)
    )
    speeds.record_probe(
        perf.timing.speeds_file(), first, FLOPS, 10.0
    )  # so the child does not probe
    work = tmp_path / "work"
    work.mkdir()
    run = subprocess.run(
        [sys.executable, str(ROOT / "run_search.py"), "--plan", "--json", "--budget", "113M"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    rows = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(rows) == 32 and {r["budget"] for r in rows} == {113_000_000}
    assert all(abs(r["budget_distance"]) <= 0.005 for r in rows)
    assert list(work.iterdir()) == []


def test_the_headline_search_on_one_machine_asks_first(capsys, tmp_path):
    """`shapebench search --budget 113M` here is a cluster job: the estimate, the cluster command line,
    exit 2 without --yes when not at a terminal, and nothing trained or written."""
    assert main(["--budget", "113M", "--results", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    hours = float(err.split(" machine-hours")[0].rsplit(" ", 1)[1].replace(",", ""))
    assert hours > 24 and "GPU-hours at an assumed 400 TFLOP/s per GPU" in err
    assert (
        "  shapebench search --budget 113M --address auto --results s3://BUCKET/results --gpus-per-trial 1"
        in err
    )
    assert "Add --yes to run it here anyway." in err
    assert not (tmp_path / "results").exists()


def test_a_results_path_that_is_a_file_is_one_line_before_any_training(capsys, tmp_path):
    import time

    taken = tmp_path / "results.txt"
    taken.write_text("not a folder")
    t0 = time.perf_counter()
    assert main([QUICKSTART, "--results", str(taken), "--name", "q"]) == 2
    err = capsys.readouterr().err
    assert time.perf_counter() - t0 < 10 and err.count("\n") == 1
    assert (
        err.startswith("shapebench search: q: ") and str(taken) in err and "not a directory" in err
    )


def test_estimates_learn_from_the_trials_finished_here(monkeypatch, tmp_path):
    """`--plan` uses each family's measured training FLOP/s and time outside training once trials
    have run here; a family not yet run gets the mean of those that have."""
    from benchmark.space.language import load_space
    from benchmark.space.plan import make_plan, records
    from benchmark.store import speeds

    monkeypatch.setenv(speeds.ENV, str(tmp_path / "perf.json"))
    plan = make_plan(load_space(QUICKSTART))
    cfg = TrainConfig.from_dict(plan.space.trial_training)
    before = records(plan, perf.estimates(plan, cfg))
    assert all(r["est_from_trials"] == 0 for r in before)
    path = speeds.path_in(tmp_path)
    policy = speeds.policy_key("auto", True)
    speeds.record_trial(path, policy, "transformer", 2e10, 100.0)
    speeds.record_trial(path, policy, "transformer", 4e10, 60.0)
    speeds.record_trial(
        path, speeds.policy_key("fp32", False), "looped", 1e9, 1.0
    )  # another policy
    after = records(plan, perf.estimates(plan, cfg))
    for r in after:
        work = r["flops_per_token_train"] * r["tokens"]
        assert r["est_seconds"] == pytest.approx(work / 3e10 + 80.0)  # the mean of the two trials
        assert r["est_from_trials"] == (2 if r["family"] == "transformer" else 0)


def _probes(monkeypatch, peak: float = 1e15) -> list[tuple]:
    """What each probe measured (spec, policy, seq_len, batch_size): a fake step, a fake matmul peak."""
    from benchmark.trial import policy

    seen = []

    def fake_measure(paths, steps, warmup, seq_len, batch_size, until):
        seen.append((paths[0][0], paths[0][1], seq_len, batch_size))
        return [perf.Measurement(0.5, 20.5, 1e3, 2e10, 0, (0.5,) * 3)]

    monkeypatch.undo()  # the autouse stand-in for the probe
    monkeypatch.setattr(probe, "measure_together", fake_measure)
    monkeypatch.setattr(policy, "matmul_peak", lambda dtype, budget_s, device: peak)
    return seen


def test_the_first_estimate_probes_the_first_candidate_trained_as_its_trial_will_be(
    monkeypatch, tmp_path, capsys
):
    """Before any trial here, the plan probes its first candidate in the trials' policy (the precision
    `auto` resolves to, compiled unless --no-compile), at their sequence length and micro-batch: a
    small eager probe read a Xeon with AMX at a third of its compiled bf16 trials' speed. The first
    step beyond a steady one is the compilation the trial pays; a second plan reads the record."""
    from benchmark.store import speeds

    seen = _probes(monkeypatch)
    monkeypatch.setenv(speeds.ENV, str(tmp_path / "perf.json"))
    rows, _ = plan_json(capsys, QUICKSTART)
    ((spec, policy, seq_len, batch),) = seen
    assert spec.to_dict() == rows[0]["spec"] and (seq_len, batch) == (
        128,
        16,
    )  # the quickstart's training
    assert policy.precision == "auto" and policy.compile and policy.compile_scope == "regions"
    for r in rows:  # 2e10 FLOP/s, 20 s of compiling, and the rest of a trial
        assert r["est_seconds"] == pytest.approx(
            r["flops_per_token_train"] * r["tokens"] / 2e10 + 20.0 + TRIAL_REST_S
        )
    assert plan_json(capsys, QUICKSTART)[0] == rows and len(seen) == 1  # recorded: probed once
    plan_json(
        capsys, QUICKSTART, "--no-compile", "--precision", "fp32"
    )  # another policy: its own probe
    assert len(seen) == 2 and seen[1][1].precision == "fp32" and not seen[1][1].compile


def test_a_candidate_too_big_to_probe_is_probed_at_the_small_size(monkeypatch, tmp_path, capsys):
    """The probe keeps to seconds: a step beyond STEP_AT_PEAK_S at the matmul peak takes fewer
    sequences, and one whose single sequence is beyond it the small model of probe_shape."""
    from benchmark.perf.probe import STEP_AT_PEAK_S
    from benchmark.store import speeds

    per_sequence = count_flops(plan_json(capsys, QUICKSTART)[0][0]["spec"], 128)["train"] * 128
    small = perf.probe_shape("cpu")
    for name, sequences, expect in [("a", 4.5, 4), ("b", 0.5, None)]:
        seen = _probes(monkeypatch, peak=sequences * per_sequence / STEP_AT_PEAK_S)
        monkeypatch.setenv(speeds.ENV, str(tmp_path / f"{name}.json"))
        plan_json(capsys, QUICKSTART)
        spec, _, seq_len, batch = seen[0]
        assert (seq_len, batch) == ((128, expect) if expect else small[1:])
        assert (spec == small[0]) == (expect is None)


def test_a_real_probe_trains_the_candidate(monkeypatch, tmp_path):
    """The probe itself, unmocked, on a tiny eager candidate: a positive speed, recorded under its
    policy and shape."""
    from benchmark.space.language import load_space
    from benchmark.space.plan import make_plan
    from benchmark.store import speeds

    monkeypatch.undo()
    monkeypatch.setenv(speeds.ENV, str(tmp_path / "perf.json"))
    space = tmp_path / "tiny.yaml"
    space.write_text(
        "budget: 200K\nbase: {vocab_size: 512, n_heads: 2}\naxes: {family: [transformer]}\n"
        "training: {tokens: 1M, seq_len: 32, batch_size: 4}\n"
    )
    plan = make_plan(load_space(space))
    cfg = TrainConfig.from_dict({**plan.space.trial_training, "compile": False})
    monkeypatch.setattr(probe, "PROBE_S", 1.0)
    speed = probe.probe_speed(plan.candidates[0].spec, cfg)
    assert speed.flops_per_s > 0 and speed.overhead_s >= TRIAL_REST_S and speed.trials == 0
    key = probe.probe_key(plan.candidates[0].spec, cfg)
    assert key.startswith("auto|eager|") and speeds.probe(speeds.path_in(tmp_path), key) is not None


def test_the_plan_counts_the_search_around_the_trials_as_measured_here(
    monkeypatch, tmp_path, capsys
):
    """The plan's total is its trials plus the search's own time outside them (Ray's start, the
    driver around each trial): assumed until a search has run here, then the mean of those that
    did (recorded by the driver: tests/test_search.py). A new user's quickstart on an H100 spent
    34 s so beside 88 s of trials, which the plan had left out."""
    from benchmark.space.plan import SEARCH_START_S
    from benchmark.store import speeds

    monkeypatch.setenv(speeds.ENV, str(tmp_path / "perf.json"))
    rows, err = plan_json(capsys, QUICKSTART)
    trials = sum(r["est_seconds"] for r in rows) * 2  # the quickstart's two seeds
    assert f"the search around them {SEARCH_START_S:.0f} s (until a search has run here)" in err
    assert (
        f"est. {(trials + SEARCH_START_S) / 60:.1f} min here: the trials {trials / 60:.1f} min"
        in err
    )
    path = speeds.path_in(tmp_path)
    speeds.record_search(path, 20.0, 1.0)
    speeds.record_search(path, 30.0, 2.0)
    assert speeds.search_times(path, SEARCH_START_S) == (25.0, 1.5, 2)
    again, err = plan_json(capsys, QUICKSTART)
    assert again == rows  # the candidates' own estimates are the trials'
    around = 25.0 + 1.5 * len(rows)  # one trial per candidate, its seeds inside it
    assert f"the search around them {around:.0f} s (from 2 searches here)" in err
    assert f"est. {(trials + around) / 60:.1f} min here" in err
    # a damaged entry (hand-edited, cut short) is skipped, never an error
    data = json.loads(path.read_text())
    data["machines"][speeds.machine_key()]["searches"] += [
        ["a", 1],
        [5.0],
        [float("nan"), 1.0],
        [-1.0, 0.0],
    ]
    path.write_text(json.dumps(data))
    assert speeds.search_times(path, SEARCH_START_S) == (25.0, 1.5, 2)


TUNED = ["--set", "tune={grid: {lr: [1e-3, 3e-3]}, seeds: [100, 101]}", "--set", "pruner=none"]


def _gpu_hours(err: str) -> float:
    """The GPU time a plan or the gate printed, in hours, whichever unit it was said in."""
    said = re.search(r"about ([\d,.]+) GPU-(hours|minutes|seconds) at an assumed", err)
    per_hour = {"hours": 1, "minutes": 60, "seconds": 3600}[said.group(2)]
    return float(said.group(1).replace(",", "")) / per_hour


def test_the_plan_counts_every_run_a_candidate_trains(capsys):
    """A candidate trains its final seeds and, under `tune:`, every point of the grid on every tuning
    seed first (2 points x 2 seeds here): the summary, the records and the estimate count them all."""
    rows, err = plan_json(capsys, QUICKSTART)
    assert [r["runs"] for r in rows] == [
        2,
        2,
        2,
    ] and "3 (the whole grid) candidates x 2 seeds at" in err
    trials = sum(r["est_seconds"] for r in rows) * 2
    assert f"the trials {trials / 60:.1f} min" in err
    tuned, err = plan_json(capsys, QUICKSTART, *TUNED)
    assert [r["runs"] for r in tuned] == [6, 6, 6]
    assert "3 (the whole grid) candidates x (4 tuning + 2 seeds) runs at" in err
    assert [r["est_seconds"] for r in tuned] == [r["est_seconds"] for r in rows]  # one run each
    assert f"the trials {trials * 3 / 60:.1f} min" in err
    _, err = plan_json(capsys, QUICKSTART, *TUNED, "--set", "seeds=1")
    assert "candidates x (4 tuning + 1 seed) runs at" in err


@pytest.mark.parametrize("extra", [[], TUNED])
def test_the_plan_prints_the_searchs_gpu_hours_at_an_assumed_rate(capsys, extra):
    """FLOPs per token x tokens x runs, summed over the candidates, at 400 TFLOP/s per GPU unless
    --gpu-tflops says otherwise; the quickstart's FLOPs counted by hand from its records."""
    rows, err = plan_json(capsys, QUICKSTART, *extra)
    flops = sum(r["flops_per_token_train"] * r["tokens"] * r["runs"] for r in rows)
    runs = 6 if extra else 2
    assert flops == runs * 600_000 * sum(count_flops(r["spec"], 128)["train"] for r in rows)
    assert _gpu_hours(err) == pytest.approx(flops / 400e12 / 3600, rel=5e-3)
    assert (
        "GPU-seconds at an assumed 400 TFLOP/s per GPU" in err  # the quickstart: under a minute
        and f"({flops:.3g} training FLOPs" in err
    )
    _, slower = plan_json(capsys, QUICKSTART, *extra, "--gpu-tflops", "100")
    assert _gpu_hours(slower) == pytest.approx(flops / 100e12 / 3600, rel=5e-3)
    assert "GPU-seconds at an assumed 100 TFLOP/s per GPU" in slower
    assert _gpu_hours(slower) == pytest.approx(4 * _gpu_hours(err), rel=1e-2)


def test_gpu_tflops_must_be_positive(capsys):
    with pytest.raises(SystemExit) as e:
        plan_main([QUICKSTART, "--gpu-tflops", "0"])
    assert e.value.code == 2 and "expected a positive number, got '0'" in capsys.readouterr().err


def test_the_cluster_gate_counts_the_tuning_runs(capsys):
    """The quickstart at 113M is about 13 h of final seeds at FLOPS here: under the gate's day. Its
    4 tuning runs a candidate triple that, and the search asks first, with the GPU-hours of all
    18 runs (the flag's rate)."""
    from benchmark.search.gate import too_big
    from benchmark.space.language import load_space
    from benchmark.space.plan import make_plan, records
    from benchmark.space.source import Override, parse_set

    budget = [Override.flag("budget", "budget", "113M")]
    plain = make_plan(load_space(QUICKSTART, budget))
    cfg = TrainConfig.from_dict(plain.space.trial_training)
    rows = records(plain, FLOPS)
    assert 8 < sum(r["est_seconds"] for r in rows) * 2 / 3600 < 24
    assert too_big(plain, cfg, 2, "q", QUICKSTART, "113M") is None
    tuned = make_plan(load_space(QUICKSTART, [parse_set(t) for t in TUNED[1::2]] + budget))
    assert too_big(tuned, cfg, 2, "q", QUICKSTART, "113M", gpu_flops=200e12) == 2
    err = capsys.readouterr().err
    flops = sum(r["flops_per_token_train"] * r["tokens"] for r in rows) * 6
    assert "q: 3 candidates x 6 runs estimated at" in err and "at an assumed 200 TFLOP/s" in err
    assert _gpu_hours(err) == pytest.approx(flops / 200e12 / 3600, rel=5e-3)


@pytest.mark.parametrize(
    "flops, said",
    [
        (400e12 * 1.2, "about 1.2 GPU-seconds"),  # a tiny search: not "0.000333 GPU-hours"
        (400e12 * 90, "about 1.5 GPU-minutes"),
        (400e12 * 3600 * 12.34, "about 12.3 GPU-hours"),
        (400e12 * 3600 * 1234, "about 1,234 GPU-hours"),
    ],
)
def test_gpu_time_reads_in_the_unit_that_fits(flops, said):
    from benchmark.space.plan import gpu_time

    rows = [{"flops_per_token_train": flops / 1000, "tokens": 500, "runs": 2}]
    assert gpu_time(rows) == f"{said} at an assumed 400 TFLOP/s per GPU"


def test_the_wall_time_on_a_cluster_with_every_run_its_own_task(capsys):
    """search/schedule.py: tuning runs of every candidate side by side, then each candidate's final
    seeds once its tuning is done; the runs of one hour each, on 6 GPUs and on 1."""
    from benchmark.search.schedule import simulate

    hour = {"flops_per_token_train": 1.0, "tokens": 3600.0, "runs": 5}  # 2 tuning + 3 seeds
    six = simulate([hour, hour], tuning_runs=2, workers=6, gpu_flops=1.0)
    assert (six.runs, six.at_once, six.wall_h, six.gpu_h) == (10, 6, 2.0, 10.0)
    assert simulate([hour, hour], 2, 1, 1.0).wall_h == 10.0  # one at a time: the GPU-hours
    # on 4: the 4 tuning runs, then 6 final seeds in two rounds (4, then 2)
    assert simulate([hour, hour], 2, 4, 1.0).wall_h == 3.0
    # a candidate twice as long holds up its own seeds only
    long = {**hour, "tokens": 7200.0}
    assert simulate([long, hour], 2, 10, 1.0).wall_h == 4.0
    assert plan_main([QUICKSTART, "--workers", "4"]) == 0
    out = capsys.readouterr().out
    assert "on 4 GPUs, every run its own task: " in out and "h of wall time" in out
    # with --json: stdout one JSON object per candidate, the wall time on stderr
    assert plan_main([QUICKSTART, "--workers", "4", "--json"]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(x)["candidate"] for x in out.splitlines()] == [0, 1, 2]
    last = err.rstrip().splitlines()[-1]
    assert last.startswith("on 4 GPUs, every run its own task: ") and "h of wall time" in last


def test_the_wall_time_with_each_candidates_runs_in_turn_inside_its_trial(capsys):
    """`--no-runs-as-tasks`: a candidate is one trial on one GPU, its runs one after another, so
    its final seeds never train side by side: the same runs as above take longer on 6 GPUs and
    the same on 1 (the GPU-hours)."""
    from benchmark.search.schedule import in_trials

    hour = {"flops_per_token_train": 1.0, "tokens": 3600.0, "runs": 5}  # 2 tuning + 3 seeds
    six = in_trials([hour, hour], workers=6, gpu_flops=1.0)
    assert (six.runs, six.at_once, six.wall_h, six.gpu_h) == (10, 2, 5.0, 10.0)
    assert in_trials([hour, hour], 1, 1.0).wall_h == 10.0
    # in the plan's order, as the searcher asks them: the long one first holds one GPU 10 h
    long = {**hour, "tokens": 7200.0}
    assert in_trials([long, hour, hour], 2, 1.0).wall_h == 10.0
    assert plan_main([QUICKSTART, "--workers", "4"]) == 0
    tasks = _workers_line(capsys.readouterr().out)
    assert plan_main([QUICKSTART, "--workers", "4", "--no-runs-as-tasks"]) == 0
    line = _workers_line(capsys.readouterr().out)
    assert line.startswith("on 4 GPUs, a candidate's runs in turn inside its trial: 6 runs, ")
    assert "up to 3 at once" in line and line.endswith("one run of a candidate at a time)")
    assert _wall_h(line) > _wall_h(tasks)  # 3 candidates x 2 seeds: each one's seeds in turn


def _workers_line(out: str) -> str:
    """The plan's last line, `--workers`', as one line (the console wraps it)."""
    return "on " + " ".join(out.rpartition("\non ")[2].split())


def _wall_h(line: str) -> float:
    return float(re.search(r"about ([\d.e+-]+) h of wall time", line).group(1))
