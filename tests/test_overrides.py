"""`shapebench plan|search --set KEY=VALUE`: any key of a space set over its file and validated as the file
is, with one-line errors that name the flag; the plan and the study's declaration keep the
overrides; and a schedule that cannot fit (warmup longer than the run) is an error at plan time."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest

from benchmark import count_flops
from benchmark.perf import probe
from benchmark.search.command import as_declared, build_search_parser, plan_main
from benchmark.search.command import search_main as main
from benchmark.search.driver import SearchOptions, study_info
from benchmark.search.optuna_study import Sample
from benchmark.space.language import load_space
from benchmark.space.source import Override, apply_overrides, parse_set
from benchmark.store.declaration import read_study_info, write_study_info
from benchmark.store.speeds import Speed

ROOT = Path(__file__).resolve().parent.parent
HYPERLOOP = str(ROOT / "search_spaces" / "papers" / "hyperloop-table1-136m.yaml")
SMALL = [
    "--set",
    "training.seq_len=128",
    "--set",
    "training.batch_size=16",
    "--set",
    "training.warmup=0.05",
]
# 1M tokens at 16 x 128 = 2,048 a step: 489 steps.
TINY = """\
name: tiny-set
budget: 1M
tolerance: 2%
base: {vocab_size: 512, n_heads: 2}
axes: {family: [transformer]}
training: {tokens: 1M, seq_len: 128, batch_size: 16, warmup: 100, schedule: cosine}
"""


@pytest.fixture(autouse=True)
def fixed_machine(monkeypatch):
    monkeypatch.setattr(probe, "probe_speed", lambda spec, cfg: Speed(5e10, 6.0, 0))


@pytest.fixture
def tiny(tmp_path) -> str:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return str(path)


def plan(capsys, *args) -> tuple[list[dict], str]:
    assert plan_main([*args, "--json"]) == 0
    out, err = capsys.readouterr()
    return [json.loads(line) for line in out.splitlines()], err


def error(capsys, *args, run=main) -> str:
    """The one line a refused search prints (exit 2, nothing on stdout, no traceback)."""
    assert run(list(args)) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    return err.rstrip("\n")


def plan_error(capsys, *args) -> str:
    """The one line a refused plan prints."""
    return error(capsys, *args, run=plan_main)


# ---- the commands ---------------------------------------------------------------------


def test_the_papers_warmup_in_a_1m_token_run_is_an_error(capsys):
    """1000 warmup steps of 256 x 2048 tokens in a 1M-token run (2 steps) would never reach the peak."""
    err = plan_error(capsys, HYPERLOOP, "--budget", "600K", "--tokens", "1M")
    assert err.startswith(f"{HYPERLOOP}:")  # the file's `warmup: 1000`
    assert err.endswith(
        ": training.warmup: 1,000 warmup steps do not end before the run's 2 steps: 1M tokens at "
        "524,288 a step (batch_size 256 x seq_len 2048); give warmup as a fraction of the run "
        "(e.g. 0.05), or set a smaller training.batch_size or training.seq_len, or train more tokens"
    )


def test_set_plans_the_paper_space_with_a_sane_schedule(capsys):
    rows, err = plan(capsys, HYPERLOOP, "--budget", "600K", "--tokens", "1M", *SMALL)
    assert len(rows) == 4
    for r in rows:
        assert (r["tokens"], r["steps"], r["warmup_steps"]) == (
            1_000_000,
            489,
            24,
        )  # ceil(1M / 2048), 5%
        assert (
            r["flops_per_token_train"] == count_flops(r["spec"], 128)["train"]
        )  # at the set seq_len
    assert "1M tokens each, 2.048K per step (16 x 128), 489 steps (warmup 24);" in err
    summary = next(line for line in err.splitlines() if "set on the command line" in line)
    assert (
        summary.rstrip().endswith(  # the summary; the data's passes follow it (a line of its own)
            "set on the command line: --set training.seq_len=128 --set training.batch_size=16 "
            "--set training.warmup=0.05 --budget 600K --tokens 1M"
        )
    )


def test_the_table_shows_the_overrides(capsys, tiny):
    assert (
        plan_main([tiny, "--set", "training.warmup=0.1", "--set", "axes.family=[transformer]"]) == 0
    )
    out = " ".join(capsys.readouterr().out.split())  # the rich table wraps the summary
    assert "489 steps (warmup 49)" in out
    assert (
        "set on the command line: --set training.warmup=0.1 --set axes.family=[transformer]" in out
    )  # not markup


# ---- errors: one line, exit 2, naming the --set -------------------------------------------------


@pytest.mark.parametrize(
    "given, message",
    [
        ("training.sq_len=128", "training.sq_len: unknown key (did you mean 'seq_len'?)"),
        ("trainng.seq_len=128", "trainng: unknown key (did you mean 'training'?)"),
        ("training.seq_len=0", "training.seq_len: must be >= 1, got 0"),
        ("training=5", "training: expected a mapping, got 5"),
        ("budget.x=1", "budget: is '1M', not a section: nothing can be set under it"),
        (
            "training.seq_len.x=1",
            "training.seq_len: is 128, not a section: nothing can be set under it",
        ),
        (
            "training.seq_len",
            "expected KEY=VALUE with a dotted KEY, e.g. --set training.seq_len=128",
        ),
        ("=128", "expected KEY=VALUE with a dotted KEY, e.g. --set training.seq_len=128"),
        (
            "training..seq_len=128",
            "expected KEY=VALUE with a dotted KEY, e.g. --set training.seq_len=128",
        ),
        ("training.seq_len=", "training.seq_len: no value after '=' (write null for none)"),
        (
            "axes.family=[transformer",
            "axes.family: the value is not acceptable YAML: YAML syntax: expected ',' or ']', "
            "but got '<stream end>' (at column 13)",
        ),
        (
            "base.vocab_size=!!python/object:os.system",
            "base.vocab_size: the value is not acceptable YAML: YAML tag "
            "!!python/object:os.system is not allowed: a config holds only text, numbers, true/false, null, lists and "
            "mappings (quote a value to make it text) (at column 1)",
        ),
        (
            "axes.family=[&a transformer, *a]",
            "axes.family: the value is not acceptable YAML: anchors and aliases "
            "(*name) are not supported (at column 18)",
        ),
        ("base.n_heds=4", "base.n_heds: unknown key (did you mean 'n_heads'?)"),
    ],
)
def test_a_bad_set_is_one_line_naming_it(capsys, tiny, given, message):
    assert plan_error(capsys, tiny, "--set", given) == f"--set {given}: {message}"


def test_a_bad_set_in_a_list_names_the_item(capsys, tiny):
    err = plan_error(capsys, tiny, "--set", "axes.family=[transformer, lopped]")
    assert err.startswith(
        "--set axes.family=[transformer, lopped]: axes.family[1]: 'lopped' is not one of "
    )
    assert err.endswith("(did you mean 'looped'?)")


def test_an_error_the_set_did_not_touch_stays_in_the_file(capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(TINY.replace("seq_len: 128", "seq_len: 0"))
    assert (
        plan_error(capsys, str(path), "--set", "training.lr=1e-3")
        == f"{path}:6:33: training.seq_len: must be >= 1, got 0"
    )


def test_an_error_on_a_section_the_file_has_is_the_files_not_a_set_inside_it():
    """A set below a section the file writes does not take the section's errors; one below a top
    key the file lacks (a misspelt section) does, and one at or above the error's key always does."""
    from benchmark.space.source import Source
    from benchmark.space.yamlsafe import Document

    doc = Document(
        data={"training": {"lr": 1e-3}}, key_marks={("training",): (6, 1)}, value_marks={}
    )
    src = Source("s.yaml", doc, (parse_set("training.seq_len=128"), parse_set("trainng.lr=1")))
    assert src.given(("training",)) is None
    assert src.given(("trainng",)).given == "--set trainng.lr=1"
    assert src.given(("training", "seq_len")).given == "--set training.seq_len=128"
    assert src.error(("training",), "bad").file == "s.yaml"


def test_set_fills_a_section_written_empty(capsys, tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text(TINY + "quantize:\n")
    rows, _ = plan(capsys, str(path), "--set", "quantize.group_size=64")
    assert rows


def test_a_flag_that_sets_a_key_is_named_like_a_set(capsys, tiny):
    """--tokens is `--set training.tokens=..`: less than one step is its error, not the file's."""
    assert plan_error(capsys, tiny, "--tokens", "1K") == (
        "--tokens 1K: training.tokens: less than one step: 1K tokens at 2,048 a step (batch_size 16 x seq_len 128); "
        "set a smaller training.batch_size or training.seq_len, or train more tokens"
    )


def test_set_is_refused_with_spec(capsys, tmp_path):
    assert (
        error(capsys, "--spec", str(tmp_path / "arch.yaml"), "--set", "training.seq_len=64")
        == "shapebench search: --set sets a key of a search space, not of --spec (edit the spec file)"
    )


# ---- the schedule: what fits and what does not ------------------------------------------------------


@pytest.mark.parametrize("warmup, fits", [(488, True), (489, False), (0.99, True)])
def test_a_cosine_warmup_must_end_before_the_run(capsys, tiny, warmup, fits):
    args = [tiny, "--json", "--set", f"training.warmup={warmup}"]
    if fits:
        rows, _ = plan(capsys, *args[:1], *args[2:])
        assert rows[0]["steps"] == 489 and rows[0]["warmup_steps"] == (
            warmup if warmup >= 1 else 484
        )
    else:
        assert plan_error(capsys, *args).startswith(
            f"--set training.warmup={warmup}: training.warmup: 489 warmup steps "
            "do not end before the run's 489 steps: 1M tokens at 2,048 a step "
        )


@pytest.mark.parametrize("warmup, fits", [(391, True), (392, False)])
def test_a_wsd_warmup_must_end_before_its_decay(capsys, tiny, warmup, fits):
    """489 steps, the last round(0.2 x 489) = 98 of them the decay: warmup can take 391."""
    args = [tiny, "--set", "training.schedule=wsd", "--set", f"training.warmup={warmup}"]
    if fits:
        assert plan(capsys, *args)[0][0]["warmup_steps"] == warmup
    else:
        assert plan_error(capsys, *args) == (
            f"--set training.warmup={warmup}: training.warmup: {warmup} warmup steps run into the last 98 steps of "
            "decay (decay: 0.2) of the run's 489 steps: 1M tokens at 2,048 a step (batch_size 16 x seq_len 128); "
            "give warmup as a fraction of the run (e.g. 0.05), or set a smaller training.batch_size or "
            "training.seq_len, or train more tokens"
        )


def test_tokens_per_parameter_name_the_candidate_whose_run_is_too_short(capsys, tmp_path):
    """20 tokens a parameter: the 200K rung of a ladder has too few steps for 1000 warmup steps, the
    1M rung has enough; the error names the rung's candidate and its steps."""
    path = tmp_path / "ladder.yaml"
    path.write_text(
        TINY.replace("budget: 1M", "budget: [200K, 1M]")
        .replace("tokens: 1M", "tokens: 20x")
        .replace("seq_len: 128", "seq_len: 256")
        .replace("warmup: 100", "warmup: 1000")
    )
    rows, _ = plan(capsys, str(path), "--set", "training.warmup=0.05")
    small = rows[0]
    assert small["budget"] == 200_000 and small["steps"] == math.ceil(
        20 * small["params_total"] / 4096
    )
    err = plan_error(capsys, str(path))
    assert err == (
        f"{path}:6:63: training.warmup: 1,000 warmup steps do not end before the run's {small['steps']} "
        f"steps: candidate 0 (transformer, budget 200K) trains {small['tokens'] / 1e6:.4g}M tokens = 20x "
        f"its {small['params_total'] / 1e3:.4g}K total parameters at 4,096 a step (batch_size 16 x "
        "seq_len 256); give warmup as a fraction of the run (e.g. 0.05), or set a smaller "
        "training.batch_size or training.seq_len, or train more tokens"
    )


def test_a_search_refuses_the_schedule_before_it_trains(capsys, tiny, tmp_path):
    results = tmp_path / "results"
    err = error(capsys, tiny, "--results", str(results), "--yes", "--set", "training.warmup=600")
    assert err.startswith(
        "--set training.warmup=600: training.warmup: 600 warmup steps do not end before"
    )
    assert not results.exists()


def test_a_sampled_trial_whose_schedule_cannot_fit_is_infeasible(tiny):
    space = load_space(tiny, [parse_set("training.warmup=489")])
    trial = optuna.create_study().ask()
    config = Sample(space)(trial)
    assert config["optuna_trial"] == 0 and config["infeasible"].startswith(
        "--set training.warmup=489: training.warmup: 489 warmup steps do not end before the run's 489 steps"
    )


def test_a_per_loop_objective_needs_candidates_that_evaluate_that_loop_count(capsys, tiny):
    """val_loss_r4 is null for a Transformer (no eval_loops): every trial would fail in Optuna, so the
    plan refuses it at the objective's key; AbbIE-D evaluates r = 1, 2, 4, 8 and plans."""
    r4 = ["--set", "objectives=[val_loss_r4:min]"]
    assert plan_error(capsys, tiny, *r4) == (
        "--set objectives=[val_loss_r4:min]: objectives[0]: val_loss_r4 is the loss at 4 loops, which candidate 0 "
        "(transformer) does not evaluate (its eval_loops: none); give the family eval_loops with 4, or keep this "
        "objective to families that evaluate it (abbie-c, abbie-d, depth)"
    )
    rows, _ = plan(capsys, tiny, *r4, "--set", "axes.family=[abbie-d]")
    assert [r["family"] for r in rows] == ["abbie-d"]
    space = load_space(tiny, [parse_set("objectives=[val_loss_r4:min]")])
    config = Sample(space)(optuna.create_study().ask())
    assert "val_loss_r4 is the loss at 4 loops, which trial 0 (transformer)" in config["infeasible"]


# ---- the document: any key, as the file spells it ------------------------------------------------------


@pytest.mark.parametrize(
    "data, key, value, result",
    [
        (
            {"base": {"ffn": {"ratio": 2.75}}},
            "base.ffn.kind",
            "hourglass",
            {"base": {"ffn": {"ratio": 2.75, "kind": "hourglass"}}},
        ),  # nested, followed
        (
            {"base": {"ffn.ratio": 2}},
            "base.ffn.ratio",
            3,
            {"base": {"ffn.ratio": 3}},
        ),  # one dotted key, replaced
        (
            {"axes": {"family": ["transformer"]}},
            "axes.shape.head_dim",
            [32, 64],
            {"axes": {"family": ["transformer"], "shape.head_dim": [32, 64]}},
        ),  # new: one dotted key
        (
            {"base": {"ffn.kind": "swiglu", "ffn.ratio": 2, "d_model": 64}},
            "base.ffn",
            {"ratio": 3},
            {"base": {"ffn": {"ratio": 3}, "d_model": 64}},
        ),  # a section replaced whole
        (
            {"axes": {"shape.head_dim": {"choice": [32]}}},
            "axes.shape.head_dim.when",
            "family == 'looped'",
            {"axes": {"shape.head_dim": {"choice": [32], "when": "family == 'looped'"}}},
        ),
        (
            {"budget": "1M"},
            "quantize.group_size",
            64,
            {"budget": "1M", "quantize": {"group_size": 64}},
        ),
    ],
)
def test_overrides_follow_the_document(data, key, value, result):
    before = json.dumps(data)
    assert apply_overrides(data, [Override(key, value, f"--set {key}=..")]) == result
    assert json.dumps(data) == before  # the document read from the file is left as it was


def test_a_new_top_level_section_is_validated_by_its_own_rules(capsys, tiny):
    space = load_space(tiny, [parse_set("quantize.group_size=64")])
    assert space.quantize == {"group_size": 64}
    assert (
        plan_error(capsys, tiny, "--set", "quantize.group_sise=64")
        == "--set quantize.group_sise=64: quantize.group_sise: unknown key (did you mean 'group_size'?)"
    )


def test_the_flags_are_short_for_a_set_and_win_over_one(capsys, tiny):
    flag, _ = plan(
        capsys,
        tiny,
        "--budget",
        "2M",
        "--tokens",
        "20x",
        "--trials",
        "3",
        "--count",
        "non_embedding",
    )
    sets, _ = plan(
        capsys,
        tiny,
        "--set",
        "budget=2M",
        "--set",
        "training.tokens=20x",
        "--set",
        "trials=3",
        "--set",
        "count=non_embedding",
    )
    both, _ = plan(
        capsys,
        tiny,
        "--set",
        "budget=500K",
        "--budget",
        "2M",
        "--tokens",
        "20x",
        "--count",
        "non_embedding",
    )
    assert (
        flag == sets == both
        and flag[0]["budget"] == 2_000_000
        and flag[0]["count"] == "non_embedding"
    )


# ---- the declaration: a study says how it was run, and resumes so ---------------------------------------


def _args(*argv):
    return build_search_parser().parse_args(list(argv))


def test_the_declaration_keeps_the_overrides_and_they_rebuild_the_space(tiny, tmp_path):
    args = _args(
        tiny,
        "--set",
        "training.seq_len=64",
        "--set",
        "axes.family=[transformer, looped]",
        "--budget",
        "2M",
    )
    from benchmark.search.command import overrides

    space = load_space(tiny, overrides(args))
    data = SimpleNamespace(dataset_id="d", tokenizer=SimpleNamespace(tokenizer_id="t"))
    info = study_info(space, SearchOptions(name="tiny-set", results_dir=tmp_path), "tpe", data)
    assert info["overrides"] == [
        "--set training.seq_len=64",
        "--set axes.family=[transformer, looped]",
        "--budget 2M",
    ]
    assert info["training"]["seq_len"] == 64 and info["budget"] == 2_000_000
    write_study_info(tmp_path / "tiny-set", info)
    recorded = read_study_info(tmp_path / "tiny-set")["overrides"]
    again = load_space(
        tiny,
        [parse_set(t.removeprefix("--set ")) for t in recorded if t.startswith("--set ")]
        + overrides(_args(tiny, "--budget", "2M")),
    )
    assert again == space and again.overrides == space.overrides

    # --resume with no --set sets the recorded ones again; different ones are refused
    resumed = as_declared(
        load_space(tiny, overrides(_args(tiny, "--budget", "2M"))),
        _args(tiny, "--budget", "2M"),
        tmp_path / "tiny-set",
    )
    assert resumed == space and resumed.overrides == space.overrides
    other = _args(tiny, "--set", "training.seq_len=32")
    with pytest.raises(ValueError) as e:
        as_declared(load_space(tiny, overrides(other)), other, tmp_path / "tiny-set")
    assert str(e.value) == (
        "--resume: this study was run with --set training.seq_len=64 --set "
        "axes.family=[transformer, looped]; resume it with the same --set, or none to set them "
        "again (or start a new study with --name)"
    )


def test_the_resume_command_a_stopped_search_prints_resumes_the_same_study(tiny, tmp_path):
    """The line a halted search prints (a full disk, Ray gone) gives again what the declaration
    does not set back: the flags short for a --set, --seeds, the data and the precision."""
    import shlex

    from benchmark.search.command import _resume_command, overrides
    from benchmark.search.optuna_study import check_declared

    argv = [
        tiny,
        "--set",
        "training.seq_len=64",
        "--budget",
        "2M",
        "--tokens",
        "0.5M",
        "--seeds",
        "2",
        "--data",
        "embedded:wiki",
        "--precision",
        "fp32",
        "--name",
        "tiny-set",
        "--results",
        str(tmp_path),
        "--reuse-runs",
        "results/reference-3",
    ]
    args = _args(*argv)
    space = load_space(tiny, overrides(args))
    data = SimpleNamespace(dataset_id="d", tokenizer=SimpleNamespace(tokenizer_id="t"))
    info = study_info(
        space, SearchOptions(name="tiny-set", results_dir=tmp_path, seeds=2), "tpe", data
    )
    write_study_info(tmp_path / "tiny-set", info)
    line = _resume_command(args, "tiny-set")
    assert line == (
        f"shapebench search {tiny} --name tiny-set --results {tmp_path} --budget 2M --tokens 0.5M "
        "--seeds 2 --data embedded:wiki --precision fp32 --reuse-runs results/reference-3 --resume"
    )
    again = _args(*shlex.split(line)[2:])
    resumed = as_declared(load_space(tiny, overrides(again)), again, tmp_path / "tiny-set")
    assert resumed == space and (again.seeds, again.data, again.precision, again.reuse_runs) == (
        2,
        "embedded:wiki",
        "fp32",
        ["results/reference-3"],
    )
    check_declared(
        resumed, again.seeds, read_study_info(tmp_path / "tiny-set"), "s/_study.json", "tiny-set"
    )


def test_resuming_with_other_sets_is_one_line(capsys, tiny, tmp_path):
    write_study_info(
        tmp_path / "tiny-set", {"space": "tiny-set", "overrides": ["--set training.seq_len=64"]}
    )
    assert error(
        capsys, tiny, "--results", str(tmp_path), "--resume", "--set", "training.seq_len=32"
    ) == (
        "shapebench search: --resume: this study was run with --set training.seq_len=64; resume it with the same --set, "
        "or none to set them again (or start a new study with --name)"
    )


@pytest.mark.parametrize(
    "training, per",
    [({"tokens": "20x"}, "non_embedding"), ({"tokens": "20x", "tokens_per": "total"}, "total")],
)
def test_a_trial_trains_the_tokens_its_plan_says(training, per):
    """Per-parameter tokens multiply the budget's count unless `tokens_per` names another rule, in
    the plan and in the trial alike (the trial once forced the budget's count over the space's)."""
    from benchmark.data import DataConfig
    from benchmark.search.context import TrialContext
    from benchmark.space.language import SearchSpace

    space = SearchSpace(name="t", budget=1_000_000, count="non_embedding", training=training)
    params = {"total": 1_500_000, "non_embedding": 1_000_000, "non_embedding_head": 1_200_000}
    ctx = TrialContext(
        study="t",
        study_dir="/tmp/t",
        data=DataConfig(),
        training=space.training,
        count=space.count,
        objectives=("val_loss",),
    )
    assert space.tokens_for(params) == ctx.train_config(0).total_tokens(params) == 20 * params[per]


def test_pruner_none_trains_every_trial_to_its_end(tiny):
    """ASHA cuts a weak candidate at its first seed, which leaves a study of claims without pairs:
    `pruner: none` (here through --set) turns it off, the study records it, and a study may resume
    with another pruner (trials cut before stay cut)."""
    from benchmark.search import driver
    from benchmark.search.optuna_study import check_declared, declaration

    asha, none = load_space(tiny), load_space(tiny, [parse_set("pruner=none")])
    opts = SearchOptions(name="tiny-set")
    assert (asha.pruner, none.pruner) == ("asha", "none")
    assert driver._asha(asha, opts, ["val_loss"]) and not driver._asha(none, opts, ["val_loss"])
    assert driver._context(none, opts, ["val_loss"], None, asha=False).training["eval_every"] == 0
    assert declaration(none)["pruner"] == "none"
    check_declared(
        none, 1, declaration(asha), "s/_study.json", "s"
    )  # no error: not what defines the experiment
    with pytest.raises(Exception, match=r"pruner: 'asa' is not one of asha, none"):
        load_space(tiny, [parse_set("pruner=asa")])


@pytest.mark.parametrize(
    "flags,expected", [([], "fp32"), (["--precision", "bf16"], "bf16"), (["--no-compile"], "fp32")]
)
def test_a_space_s_training_precision_reaches_the_trial_unless_a_flag_overrides_it(
    tiny, flags, expected
):
    """`--set training.precision=fp32` (or the space's own `training:`) is what each trial trains
    in; only a `--precision` given on the command line overrides it (seen: the flag's default,
    `auto`, always overrode it, and a study asked for in fp32 trained in bf16)."""
    from benchmark.search.command import _policy, overrides
    from benchmark.search.context import TrialContext

    args = _args(tiny, "--set", "training.precision=fp32", *flags)
    space = load_space(tiny, overrides(args))
    ctx = TrialContext(
        study="s",
        study_dir="/tmp/s",
        data=None,
        training=space.trial_training,
        count="total",
        objectives=("val_loss",),
        policy=_policy(args),
    )
    cfg = ctx.train_config(seed=0)
    assert cfg.precision == expected
    assert cfg.compile == ("--no-compile" not in flags)
