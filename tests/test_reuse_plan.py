"""`shapebench plan --reuse-runs FOLDER` (search/reuse_plan.py): which of a plan's runs other
studies measured, by the keys the search takes them by: a candidate's tuning runs counted, its
final seeds at each setting its tuning can choose, the match at this machine's hardware."""

import json
import re

import pytest
import tiny_search

from benchmark.data import cached_identity, prepare
from benchmark.perf import probe
from benchmark.search import reuse, reuse_plan, trainable
from benchmark.search.command import plan_main
from benchmark.search.driver import SearchOptions, trial_context
from benchmark.search.preflight import data_config
from benchmark.space import make_plan
from benchmark.space.language import load_space
from benchmark.space.plan import TRIAL_REST_S
from benchmark.space.tuning import Tune
from benchmark.store import hardware, machine
from benchmark.store.results import write_row
from benchmark.store.speeds import Speed

SPACE = tiny_search.space(
    "reuse-plan",
    ["family: [{families}]"],
    "quantize: {{group_size: 16, calib_sequences: 4}}",
    "objectives: [val_loss:min]",
    "trials: 3",
    "seeds: 2",
    "{tune}",
)
TUNE = "pruner: none\ntune: {grid: {lr: [1e-3, 3e-3]}, seeds: [100], metric: val_loss}"
POLICY = {"compile": False, "precision": "fp32"}  # --no-compile --precision fp32


@pytest.fixture(autouse=True)
def fixed_machine(monkeypatch):
    monkeypatch.setattr(probe, "probe_speed", lambda spec, cfg: Speed(5e10, TRIAL_REST_S, 0))


def _space(tmp_path, families="transformer, looped, hyperloop", tune=TUNE):
    path = tmp_path / "space.yaml"
    path.write_text(SPACE.format(families=families, tune=tune))
    return path


def _flags(corpus):
    """The corpus as the plan's flags, its token cache the fixture's own."""
    return [*tiny_search.cli(corpus), "--cache", str(corpus / "cache")]


def _search(space_path, corpus, results, name):
    """What a search of the space by the command line would have: its trials' context, its
    candidates' trial configs and its prepared data."""
    space = load_space(space_path)
    data = data_config(
        str(corpus / "text.txt"), tiny_search.TOKENIZER, space, str(corpus / "cache")
    )
    ctx = trial_context(space, SearchOptions(name=name, results_dir=results, data=data), POLICY)
    return ctx, [c.config() for c in make_plan(space).candidates], prepare(data)


def _measured(study_dir, ctx, config, data, hw, runs):
    """Rows of runs a study measured, (setting, seed) each, keyed as the search keys a run."""
    for setting, seed in runs:
        cfg = ctx.train_config(seed, setting, config["budget"])
        values = reuse.planned(config["spec"], cfg, ctx.quantize_config(), data, hw)
        trial_id = f"t{config['family']}-{json.dumps(setting)}-{seed}".replace('"', "")
        row = {**values, "study": study_dir.name, "trial_id": trial_id, "status": "ok"}
        write_row(study_dir, {**row, "seed": seed})


@pytest.fixture
def studies(corpus, tmp_path):
    """Two studies' runs of the tuned space's candidates at one torch thread a trial (the plan's
    --cpus-per-trial 1): the transformer's every tuning run and both final seeds at lr 3e-3; the
    looped model's tuning run at 1e-3, seed 0 at 3e-3 and seed 1 at 1e-3 (in another study), and
    seed 0 at 1e-2, which its tuning cannot choose; the hyperloop's tuning run at 1e-3 on two
    threads, another machine's run."""
    results = tmp_path / "results"
    ctx, (transformer, looped, hyperloop), data = _search(_space(tmp_path), corpus, results, "x")
    one, lo, hi = reuse_plan.trial_hardware(1, None)[0], {"lr": 1e-3}, {"lr": 3e-3}
    ref, other = results / "ref", results / "other"
    _measured(ref, ctx, transformer, data, one, [(lo, 100), (hi, 100), (hi, 0), (hi, 1)])
    _measured(ref, ctx, looped, data, one, [(lo, 100), (hi, 0), ({"lr": 1e-2}, 0)])
    _measured(other, ctx, looped, data, one, [(lo, 1)])
    _measured(ref, ctx, hyperloop, data, machine(2), [(lo, 100)])
    return results, one


def test_the_plan_says_which_runs_are_measured_and_at_which_setting(
    corpus, tmp_path, studies, capsys
):
    results, one = studies
    argv = [str(tmp_path / "space.yaml"), *_flags(corpus), "--reuse-runs", str(results)]
    assert plan_main([*argv, "--cpus-per-trial", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # a console wraps lines at its width
    lines = re.split(r" (?=candidate \d \()", out[out.index("candidate 0 (") :])
    assert lines == [
        "candidate 0 (transformer): tuning runs 2 of 2 measured, in ref; final seeds 0-1 measured "
        "at lr 0.003 in ref: taken if tuning chooses lr 0.003",
        "candidate 1 (looped): tuning runs 1 of 2 measured, in ref; final seed 1 (of 0-1) "
        "measured at lr 0.001 in other: taken if tuning chooses lr 0.001; final seed 0 (of 0-1) "
        "measured at lr 0.003 in ref: taken if tuning chooses lr 0.003",
        "candidate 2 (hyperloop): tuning runs 0 of 2 measured; final seeds 0-1: none measured at "
        "a setting tuning can choose",
    ]
    assert f"1 torch thread ({one}); a cluster's workers may differ; final seeds" in out


def test_with_json_each_record_holds_what_was_measured(corpus, tmp_path, studies, capsys):
    results, one = studies
    argv = [str(tmp_path / "space.yaml"), *_flags(corpus), "--reuse-runs", str(results), "--json"]
    assert plan_main([*argv, "--cpus-per-trial", "1"]) == 0
    out, err = capsys.readouterr()
    records = [json.loads(line) for line in out.splitlines()]  # stdout stays JSON
    assert [r["reuse"]["tuning"]["runs"] for r in records] == [2, 2, 2]
    assert records[1]["reuse"] == {
        "hardware": one,
        "tuning": {
            "runs": 2,
            "measured": [{"setting": {"lr": 0.001}, "seed": 100, "study": "ref"}],
        },
        "final": {
            "seeds": [0, 1],
            "measured": [
                {"setting": {"lr": 0.001}, "seed": 1, "study": "other"},
                {"setting": {"lr": 0.003}, "seed": 0, "study": "ref"},
            ],
        },
    }
    assert [m["seed"] for m in records[0]["reuse"]["final"]["measured"]] == [0, 1]
    assert records[2]["reuse"]["final"]["measured"] == []
    assert "--reuse-runs: the runs other studies measured" in err and "candidate 0 (" not in err


def test_a_run_trained_as_the_search_trains_it_is_found(corpus, tmp_path, capsys):
    """No `tune:`: the runs' settings are known. A run trained through the search's own path
    (trainable.attempts, one torch thread as --cpus-per-trial 1 gives a trial) writes the row the
    plan finds."""
    import torch

    path = _space(tmp_path, families="transformer", tune="")
    results = tmp_path / "results"
    ctx, (config,), data = _search(path, corpus, results, "ref")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the trainable sets a trial's
    hardware.cache_clear()
    try:
        row = trainable.attempts({**config, "optuna_trial": 0}, ctx, "t0000-s0", 0, data, None)
    finally:
        torch.set_num_threads(threads)
        hardware.cache_clear()
    assert row["status"] == "ok" and row["hardware"] == reuse_plan.trial_hardware(1, None)[0]
    argv = [str(path), *_flags(corpus), "--reuse-runs", str(results), "--cpus-per-trial", "1"]
    assert plan_main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.endswith("candidate 0 (transformer): 1 of 2 runs measured (seed 0 in ref)")
    assert "final seeds train at the setting" not in out  # no tuning: nothing to choose


def test_the_tokenizer_and_corpus_are_read_as_prepare_names_them(corpus):
    data = tiny_search.data(corpus)
    prepared = prepare(data)
    dataset_id, tokenizer = cached_identity(data)
    assert (dataset_id, tokenizer.tokenizer_id) == (
        prepared.dataset_id,
        prepared.tokenizer.tokenizer_id,
    )


def test_a_tuning_that_extends_can_choose_past_the_grid():
    tune = Tune(
        grid=(("lr", (3e-3, 9e-3)), ("warmup", (0.05,))),
        seeds=(100,),
        extend=(("lr", (1e-3, 2.7e-2)),),
    )
    assert reuse_plan.choosable(tune) == [
        {"lr": lr, "warmup": 0.05} for lr in (0.001, 0.003, 0.009, 0.027)
    ]
    runs = [
        {"setting": {"lr": 0.009, "warmup": 0.05}, "seed": s, "study": st}
        for s, st in ((0, "a"), (1, "a"), (3, "b"))
    ]
    line = reuse_plan.describe(
        {"tuning": {"runs": 2, "measured": []}, "final": {"seeds": [0, 1, 2, 3], "measured": runs}}
    )
    assert line == (
        "tuning runs 0 of 2 measured; final seeds 0-1, 3 (of 0-3) measured at lr 0.009, warmup "
        "0.05 (seeds 0-1 in a, seed 3 in b): taken if tuning chooses lr 0.009, warmup 0.05"
    )


def test_flags_without_a_study_or_without_reuse_runs_are_one_line(corpus, tmp_path, capsys):
    space = str(_space(tmp_path))
    (tmp_path / "typo").mkdir()
    assert plan_main([space, "--reuse-runs", str(tmp_path / "typo")]) == 2
    assert capsys.readouterr().err == (
        f"shapebench plan: --reuse-runs {tmp_path / 'typo'}: no study there "
        "(no trials/ folder in it or in its folders)\n"
    )
    assert plan_main([space, "--cpus-per-trial", "1", "--concurrency", "2"]) == 2
    assert capsys.readouterr().err == (
        "shapebench plan: --cpus-per-trial, --concurrency set the torch threads --reuse-runs "
        "matches runs at: give it too\n"
    )


def test_a_corpus_whose_tokenizer_is_not_trained_yet_keys_no_run(corpus, tmp_path, capsys):
    results = tmp_path / "results"
    write_row(results / "ref", {"study": "ref", "trial_id": "t0000", "status": "ok"})
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "text.txt").write_text((corpus / "text.txt").read_text())
    flags = [*tiny_search.cli(fresh), "--cache", str(fresh / "cache")]
    argv = [str(_space(tmp_path)), *flags, "--reuse-runs", str(results), "--json"]
    assert plan_main(argv) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line)["reuse"] for line in out.splitlines()] == [None, None, None]
    assert reuse_plan.UNTOKENISED in err
    assert not (fresh / "cache" / "tokenizers").exists()  # nothing trained for a plan


def test_the_plan_and_the_search_share_the_flag():
    """The same flag and help, repeatable."""
    from benchmark.search.command import build_plan_parser, build_search_parser

    for parser in (build_plan_parser(), build_search_parser()):
        args = parser.parse_args(["--reuse-runs", "a", "--reuse-runs", "b"])
        assert args.reuse_runs == ["a", "b"]
    plan = {a.dest: a.help for a in build_plan_parser()._actions}
    search = {a.dest: a.help for a in build_search_parser()._actions}
    assert plan["reuse_runs"] == search["reuse_runs"] and "a plan says" in plan["reuse_runs"]
