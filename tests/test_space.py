"""The search-space language: loading, domains, conditions, the define-by-run function, the grid,
and every space in the repository planning within tolerance at its own budget and at 2M."""

import json
import math
import pickle
import statistics
from dataclasses import asdict, fields
from pathlib import Path

import optuna
import pytest

from benchmark import ArchSpec, count_params
from benchmark.arch.spec import SPEC_KEYS
from benchmark.recipe import TrainConfig, TrainConfigError
from benchmark.space import SpaceError, load_space
from benchmark.space.budget import solve_budget
from benchmark.space.candidates import choose, define_by_run, grid, resolve
from benchmark.space.domains import Choice, Fixed, FloatRange, IntRange
from benchmark.space.expr import ExprError, parse_condition
from benchmark.space.plan import make_plan, plan_points
from benchmark.space.source import Override
from benchmark.space.yamlsafe import YamlError, load_yaml

ROOT = Path(__file__).resolve().parent.parent
# every shipped space, papers/ and ablations/ too (claims/ holds claims files, not spaces)
SPACES = sorted(
    p for p in (ROOT / "search_spaces").rglob("*.yaml") if "claims" not in p.parent.parts
)
optuna.logging.set_verbosity(optuna.logging.WARNING)

SPEC_EXAMPLE = """\
name: hyperloop-vs-looped
description: one line shown in plans and leaderboards
budget: 113M
count: total
tolerance: 0.5%
solve: d_model
base: {n_heads: 8}
axes:
  family: [looped, hyperloop]
  layers.middle: {int: [2, 6]}
  hyper.streams: {choice: [2, 4, 8], when: "family == 'hyperloop'"}
  ffn.dh_ratio: {float: [0.1, 0.9]}
  shape.d_model_per_layer: {logfloat: [57, 250]}
training: { tokens: 20x, seq_len: 256, batch_size: 16, lr: 6e-4, schedule: cosine, warmup: 0.05 }
objectives: [val_loss:min, params:min]
trials: 32
"""


def write(tmp_path, text, name="space.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_spec_example_loads(tmp_path):
    s = load_space(write(tmp_path, SPEC_EXAMPLE))
    assert (s.name, s.budget, s.count, s.tolerance, s.solve, s.trials) == (
        "hyperloop-vs-looped",
        113_000_000,
        "total",
        pytest.approx(0.005),
        "d_model",
        32,
    )
    assert s.base == {"n_heads": 8}
    assert [a.key for a in s.axes] == [
        "family",
        "layers.middle",
        "hyper.streams",
        "ffn.dh_ratio",
        "shape.d_model_per_layer",
    ]
    assert s.axes[0].domain == Choice(values=("looped", "hyperloop"))
    assert s.axes[1].domain == IntRange(lo=2, hi=6)
    assert s.axes[2].when.text == "family == 'hyperloop'"
    assert s.axes[3].domain == FloatRange(lo=0.1, hi=0.9)
    assert s.axes[4].domain == FloatRange(lo=57.0, hi=250.0, log=True)
    assert s.training["lr"] == 6e-4 and s.training["tokens"] == "20x"
    assert s.objectives == (("val_loss", "min"), ("params", "min"))


def test_a_loss_at_a_loop_count_is_an_objective(tmp_path):
    """AbbIE's loss at r = 4 test-time iterations (store.metrics.LOOP_COUNTS) is searchable."""
    text = SPEC_EXAMPLE.replace("[val_loss:min, params:min]", "[val_loss_r4:min, params:min]")
    assert load_space(write(tmp_path, text)).objectives == (
        ("val_loss_r4", "min"),
        ("params", "min"),
    )
    with pytest.raises(
        SpaceError, match=r"space.yaml:15:13: objectives: 'val_loss_r3' is not one of val_loss, "
    ):
        load_space(write(tmp_path, text.replace("val_loss_r4:min", "val_loss_r3:min")))


def test_defaults_and_fixed_values(tmp_path):
    text = (
        "axes:\n  shape.layers: 6\n  loops: {value: 2}\n  ffn.ratio: {float: [2, 4], log: true}\n"
    )
    s = load_space(write(tmp_path, text))
    assert s.name == "space" and s.budget is None and s.tolerance == 0.005 and s.trials == 16
    assert s.axes[0].domain == Fixed(value=6) and s.axes[1].domain == Fixed(value=2)
    assert s.axes[2].domain.log
    assert s.training == {} and s.training_value("seq_len") == 256
    assert s.tokens_for({"total": 1000, "non_embedding": 600}) == 20_000


def test_training_is_checked_by_the_harness_config(tmp_path):
    """`training:` is handed to the trial harness, so TrainConfig itself checks it: its fields are
    the allow-list, its defaults the planning defaults, and every repository space's section is
    one it accepts. The section is kept as written (`tokens: 2M`, `eval_tokens: 1K`)."""
    s = load_space(write(tmp_path, "training: {tokens: 2M, eval_tokens: 1K}\n"))
    assert s.training == {"tokens": "2M", "eval_tokens": "1K"}
    assert {f.name: s.training_value(f.name) for f in fields(TrainConfig)} == {
        **asdict(TrainConfig()),
        "tokens": "2M",
        "eval_tokens": "1K",
    }
    for path in SPACES:
        TrainConfig.from_dict(load_space(path).training)


@pytest.mark.parametrize(
    "key, bad, reason",
    [
        ("lr", 0, "must be > 0, got 0"),
        ("seq_len", 0, "must be >= 1, got 0"),
        ("decay", 2, "must be in [0, 1], got 2"),
        ("grad_clip", -1, "must be >= 0, got -1"),
        ("schedule", "cosin", "'cosin' is not one of cosine, wsd (did you mean 'cosine'?)"),
        ("compile", "often", "expected true or false, got 'often'"),
        ("eval_tokens", "lots", "expected an amount like 113M, 1.2B or 500K, got 'lots'"),
        ("tokens", "20y", "expected 20x (tokens per parameter) or an amount like 5M, got '20y'"),
    ],
)
def test_training_errors_are_trainconfigs_own_located_in_the_file(key, bad, reason, tmp_path):
    with pytest.raises(TrainConfigError) as direct:
        TrainConfig(**{key: bad})
    path = write(tmp_path, f"budget: 2M\ntraining:\n  {key}: {bad}\n")
    with pytest.raises(SpaceError) as e:
        load_space(path)
    assert direct.value.reason == reason
    assert str(e.value) == f"{path}:3:{len(key) + 5}: training.{key}: {reason}"


@pytest.mark.parametrize("key", [k for k, rule in SPEC_KEYS.items() if rule.choices])
def test_every_enumerated_spec_key_is_an_axis_over_its_own_choices(key, tmp_path):
    """The space reads allowed values off ArchSpec's fields: a value added there is an axis value here."""
    choices = SPEC_KEYS[key].choices
    assert load_space(write(tmp_path, f"axes:\n  {key}: {json.dumps(list(choices))}\n")).axes[
        0
    ].domain == Choice(values=choices)
    with pytest.raises(SpaceError) as e:
        load_space(write(tmp_path, f"axes:\n  {key}: [{choices[0]}x]\n"))
    assert (
        e.value.reason
        == f"'{choices[0]}x' is not one of {', '.join(choices)} (did you mean '{choices[0]}'?)"
    )


@pytest.mark.parametrize(
    "key",
    [
        k
        for k, rule in SPEC_KEYS.items()
        if rule.kind == "int" and rule.at_least is not None and k != "d_model"
    ],
)
def test_every_bounded_spec_key_is_checked_by_its_own_rule(key, tmp_path):
    lo = SPEC_KEYS[key].at_least
    with pytest.raises(SpaceError) as e:
        load_space(write(tmp_path, f"axes:\n  {key}: [{lo - 1}]\n"))
    assert e.value.reason == f"must be >= {lo}, got {lo - 1}"


def test_yaml_positions_and_safety(tmp_path):
    doc = load_yaml(write(tmp_path, "a: 1\nb:\n  c: [1, {d: x}]\n  lr: 6e-4\n"))
    assert doc.data == {"a": 1, "b": {"c": [1, {"d": "x"}], "lr": 0.0006}}
    assert doc.key_marks[("b", "c")] == (3, 3) and doc.value_marks[("b", "c", 1, "d")] == (3, 14)
    for text, message in [
        (
            "a: !!python/name:os.system x\n",
            "1:4: a: YAML tag !!python/name:os.system is not allowed",
        ),
        ("a: 1\na: 2\n", "2:1: a: duplicate key (first given at line 1)"),
        ("a: &x 1\nb: *x\n", "2:4: anchors and aliases (*name) are not supported"),
        ("<<: {a: 1}\n", "1:1: merge keys (<<) are not supported"),
    ]:
        with pytest.raises(YamlError) as e:
            load_yaml(write(tmp_path, text))
        assert str(e.value).startswith(message)


@pytest.mark.parametrize(
    "text, names, value",
    [
        ("family == 'hyperloop' and loops > 2", {"family", "loops"}, True),
        ("not (loops >= 4) or false", {"loops"}, True),
        ("family not in ['looped', 'transformer']", {"family"}, True),
        ("hyper.streams in [2, 4] and ffn.K == null", {"hyper.streams", "ffn.K"}, True),
        ("ffn.K > 1", {"ffn.K"}, False),  # null (unset) is never ordered
        ('1 < 2 and 2.5e0 >= loops or family == "x"', {"loops", "family"}, False),
    ],
)
def test_conditions(text, names, value):
    env = {"family": "hyperloop", "loops": 3, "hyper.streams": 4, "ffn.K": None}
    c = parse_condition(text)
    assert set(c.names) == names and c(env.get) is value


@pytest.mark.parametrize(
    "text, reason, offset",
    [
        ("family ==", "expected a value, found the end", 9),
        ("loops > > 2", "expected a value, found '>'", 8),
        ("family == 'x", "unterminated string", 10),
        ("(loops", "expected ')', found the end", 6),
        ("a b", "unexpected 'b'", 2),
        ("a @ b", "unexpected character '@'", 2),
    ],
)
def test_condition_errors(text, reason, offset):
    with pytest.raises(ExprError) as e:
        parse_condition(text)
    assert (e.value.reason, e.value.offset) == (reason, offset)


def test_condition_type_errors_surface_at_run_time():
    with pytest.raises(ExprError, match="cannot compare 'hyperloop' > 2"):
        parse_condition("family > 2")({"family": "hyperloop"}.get)


def test_a_false_condition_means_the_axis_is_not_suggested(tmp_path):
    """FixedTrial raises if asked for a parameter it was not given: a looped candidate must never
    ask for hyper.streams."""
    s = load_space(write(tmp_path, SPEC_EXAMPLE))
    sample = define_by_run(s)
    cfg = sample(
        optuna.trial.FixedTrial(
            {
                "family": "looped",
                "layers.middle": 3,
                "ffn.dh_ratio": 0.4,
                "shape.d_model_per_layer": 100.0,
            }
        )
    )
    assert "hyper.streams" not in cfg and cfg["family"] == "looped"
    cfg = sample(
        optuna.trial.FixedTrial(
            {
                "family": "hyperloop",
                "layers.middle": 3,
                "hyper.streams": 8,
                "ffn.dh_ratio": 0.4,
                "shape.d_model_per_layer": 100.0,
            }
        )
    )
    assert cfg["spec"]["hyper"]["streams"] == 8 and cfg["hyper.streams"] == 8


def test_conditions_read_base_keys_presets_and_defaults(tmp_path):
    s = load_space(
        write(
            tmp_path,
            """\
budget: 20M
base: {family: hyperloop}
axes:
  loops: {choice: [2, 5], when: "hyper.every == 'loop' and layers.middle == 4"}   # from the preset
  ffn.K: {choice: [2, 4], when: "ffn.kind == 'hourglass'"}                          # default swiglu
  lora_rank: {choice: [4], when: "loops > 4"}
""",
        )
    )
    points = grid(s, limit=10)
    assert points == [{"loops": 2}, {"loops": 5, "lora_rank": 4}]


def test_grid_enumerates_conditional_points_in_file_order(tmp_path):
    s = load_space(
        write(
            tmp_path,
            """\
budget: 20M
axes:
  family: [transformer, hyperloop, mhc]
  hyper.streams: {choice: [2, 4], when: "family in ['hyperloop', 'mhc']"}
  layers.n: {int: [4, 8], step: 4, when: "family != 'hyperloop'"}
""",
        )
    )
    points = grid(s, limit=100)
    assert len(points) == 2 + 2 + 4
    assert points[0] == {"family": "transformer", "layers.n": 4}
    assert points[2] == {"family": "hyperloop", "hyper.streams": 2}
    assert grid(s, limit=7) is None
    assert (
        grid(load_space(write(tmp_path, SPEC_EXAMPLE)), limit=1000) is None
    )  # float axes: sampled


def test_variants_and_anchor(tmp_path):
    """Hourglass Table 1 in miniature: d_model solved once for the conventional anchor, then held."""
    s = load_space(
        write(
            tmp_path,
            """\
budget: 113M
count: non_embedding
tolerance: 1%
solve: ffn
anchor: {ffn: {ratio: 4}}
base: {n_heads: 12, layers: {n: 12}}
variants:
  conventional: {ffn: {kind: swiglu}}
  K8: {ffn: {kind: hourglass, K: 8}}
""",
        )
    )
    cands = [resolve(s, v) for v in grid(s, limit=10)]
    assert [c.values["variant"] for c in cands] == ["conventional", "K8"]
    assert [c.spec.d_model for c in cands] == [768, 768]  # the paper's fixed d_model
    assert (cands[0].spec.ffn.d_ff, cands[1].spec.ffn.d_h) == (3062, 383)  # the paper: 3072 and 384
    assert all(abs(c.distance) < 0.001 for c in cands)


def test_shape_axes(tmp_path):
    s = load_space(
        write(
            tmp_path,
            """\
budget: 50M
base: {family: hyperloop}
axes:
  shape.layers: [10]
  shape.middle_frac: [0.6]
  shape.unrolled_layers: [22]
  shape.head_dim: 64
""",
        )
    )
    c = resolve(s, grid(s, limit=1)[0])
    assert c.spec.structure() == "2L→6L(×3)→2L" and c.spec.unrolled_layers() == 22
    assert c.spec.head_dim * c.spec.n_heads == c.spec.d_model


def test_width_depth_ratio_picks_the_nearest_layer_count(tmp_path):
    base = {"n_heads": 12, "ffn": {"kind": "hourglass", "K": 4, "dh_ratio": 0.4}}
    s = load_space(
        write(
            tmp_path,
            f"budget: 113M\ncount: non_embedding\nbase: {json.dumps(base)}\naxes:\n"
            "  shape.d_model_per_layer: [110]\n  shape.head_dim: 64\n",
        )
    )
    c = resolve(s, grid(s, limit=1)[0])
    layers = c.spec.layers.unique

    def ratio_at(n):
        spec = solve_budget(
            {**base, "layers": {"n": n}}, budget=113_000_000, count="non_embedding", head_dim=64
        ).spec
        return spec.d_model / n

    assert (
        ratio_at(layers) == c.spec.d_model / layers and 95 < ratio_at(layers) < 125
    )  # Fig. 4: K = 4 best near 110
    for n in (layers - 1, layers + 1):
        assert abs(math.log(ratio_at(layers) / 110)) <= abs(math.log(ratio_at(n) / 110))


def test_define_by_run_under_tpe_only_yields_valid_specs_within_budget():
    """200 TPE trials over the default space: every returned spec validates, its parameters are
    what count_params says, it is within tolerance, and the dict is plain JSON (what Ray Tune's
    OptunaSearch merges into a trial's config)."""
    space = load_space(ROOT / "search_spaces" / "default.yaml")
    sample = define_by_run(space)
    configs = []

    def objective(trial):
        configs.append(sample(trial))
        return configs[-1]["params_non_embedding"] / 1e8 + abs(configs[-1]["budget_distance"])

    optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0)).optimize(
        objective, n_trials=200
    )
    assert len(configs) == 200 and len({c["family"] for c in configs}) == 9
    for c in configs:
        spec = ArchSpec.from_dict(c["spec"])
        assert count_params(spec)["total"] == c["params_total"]
        assert abs(c["budget_distance"]) <= space.tolerance
        assert all(isinstance(k, str) for k in c)
    json.dumps(configs)


def test_sampled_plans_are_reproducible_per_seed():
    space = load_space(ROOT / "search_spaces" / "default.yaml")
    a, sampled = plan_points(space, seed=3)
    assert sampled and len(a) == space.trials
    assert plan_points(space, seed=3)[0] == a
    assert plan_points(space, seed=4)[0] != a


def test_choose_walks_axes_in_order():
    space = load_space(ROOT / "search_spaces" / "papers" / "hyperloop-table5-placement.yaml")
    asked = []
    values = choose(space, lambda axis: asked.append(axis.key) or axis.domain.grid()[0])
    assert asked == ["shape.head_dim", "hyper.every", "hyper.loop_embedding"]
    assert values == {"shape.head_dim": 64, "hyper.every": "layer", "hyper.loop_embedding": False}


def test_every_repository_space_plans_within_tolerance_at_its_budget_and_at_2m():
    distances = []
    for path in SPACES:
        space = load_space(path)
        assert space.description, path.name
        for budget in (
            None,
            "2M",
        ):  # at 2M a paper's warmup in steps outlasts the run: as a fraction
            small = [
                Override("budget", budget, "--budget 2M"),
                Override("training.warmup", 0.05, "--set training.warmup=0.05"),
            ]
            plan = make_plan(load_space(path, small) if budget else space)
            assert plan.candidates, path.name
            for c in plan.candidates:
                # solve: none matches the anchor alone; each candidate's count is its own (test_one_shape.py)
                matched = c.anchor if space.solve == "none" else c
                assert abs(matched.distance) <= space.tolerance, (path.name, budget, c.values)
                distances.append(abs(matched.distance))
    assert len(SPACES) >= 21
    assert statistics.median(distances) <= 0.0005


def test_paper_spaces_recover_the_papers_shapes():
    hourglass = make_plan(load_space(ROOT / "search_spaces/papers/hourglass-table2-k-by-l.yaml"))
    assert [c.spec.d_model for c in hourglass.candidates] == [
        768,
        1176,
        1488,
        1032,
        1368,
    ]  # Table 2
    hyperloop = make_plan(load_space(ROOT / "search_spaces/papers/hyperloop-table1-136m.yaml"))
    by_family = {c.spec.family: c.spec for c in hyperloop.candidates}
    assert (by_family["hyperloop"].d_model, by_family["hyperloop"].n_heads) == (1024, 16)  # App. A
    assert (
        by_family["hyperloop"].structure() == "2L→4L(×3)→2L"
        and by_family["transformer"].layers.unique == 16
    )


def test_paper_spaces_count_and_quantise_as_their_papers_do():
    """Hyperloop counts non-embedding + the untied head (App. A) and quantises with GPTQ group 128
    on 1024 calibration sequences (§4); HC counts every parameter (Table 7); the shape paper
    non-embedding (§4.1); AbbIE states no rule (non-embedding; tied, so no head)."""
    from benchmark.recipe import QuantizeConfig

    papers = {
        p.name: load_space(p) for p in sorted((ROOT / "search_spaces" / "papers").glob("*.yaml"))
    }
    rule = {
        "hyperloop": "non_embedding_head",
        "hc": "total",
        "hourglass": "non_embedding",
        "abbie": "non_embedding",
    }
    assert {name: s.count for name, s in papers.items()} == {
        name: rule[name.split("-")[0]] for name in papers
    }
    for name, s in papers.items():
        hyperloop = name.startswith("hyperloop")
        assert s.quantize == ({"group_size": 128, "calib_sequences": 1024} if hyperloop else {}), (
            name
        )
        assert s.training_value("tokens_per") == s.count, (
            name
        )  # "Nx" tokens per the counted parameters
    assert QuantizeConfig.from_dict(
        papers["hyperloop-table1-136m.yaml"].quantize
    ) == QuantizeConfig(calib_sequences=1024)
    looped = next(
        c
        for c in make_plan(papers["hyperloop-table1-136m.yaml"]).candidates
        if c.spec.family == "looped"
    )
    p = (
        looped.solution.params
    )  # the paper's model (d_model 1024, 2L -> 4L (x3) -> 2L) over 8192 tokens
    assert (
        looped.spec.d_model == 1024 and p["non_embedding_head"] == p["non_embedding"] + 8192 * 1024
    )
    assert abs(p["non_embedding_head"] / 111.2e6 - 1) <= 0.005


def test_resolve_points_errors_at_the_axis(tmp_path):
    s = load_space(
        write(tmp_path, "budget: 20M\naxes:\n  family: [hyperloop]\n  hyper.every: [5]\n")
    )
    with pytest.raises(SpaceError) as e:
        resolve(s, {"family": "hyperloop", "hyper.every": 5})
    assert str(e.value) == (
        f"{tmp_path / 'space.yaml'}:4:16: axes.hyper.every: the loop embedding is added at "
        "loop-level connections; needs every: loop, got 5 (candidate: family=hyperloop, "
        "hyper.every=5)"
    )


def test_conditions_pickle_as_their_text():
    cond = parse_condition("family in ['hyperloop', 'mhc'] and not (loops < 2)")
    back = pickle.loads(pickle.dumps(cond))
    assert back == cond and back.names == cond.names
    for family, loops in (("hyperloop", 3), ("mhc", 1), ("looped", 3)):
        get = {"family": family, "loops": loops}.get
        assert back(get) == cond(get)


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.stem)
def test_ray_tune_can_checkpoint_the_searcher_of_every_space(path, tmp_path):
    """Ray Tune pickles the Optuna searcher (and with it the space) at every experiment checkpoint;
    a space with a `when` condition used to crash the search there ("Can't pickle local object
    '_Parser.compare.<locals>.<lambda>'"). The restored searcher samples the same candidate."""
    from ray.tune.search.optuna import OptunaSearch

    from benchmark.search.optuna_study import Sample as _Sample

    space = load_space(path)
    searcher = OptunaSearch(
        space=_Sample(space),
        metric="val_loss",
        mode="min",
        sampler=optuna.samplers.RandomSampler(seed=0),
    )
    searcher.save(str(tmp_path / "searcher.pkl"))
    restored = pickle.loads(pickle.dumps(_Sample(space)))
    first, again = (
        fn(optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1)).ask())
        for fn in (_Sample(space), restored)
    )
    assert first == again


# ---- budget ladders ------------------------------------------------------------------------------

LADDER = """\
name: ladder
budget: [2M, 0.5M, 1M]
base: {vocab_size: 8192, layers: {begin: 1, middle: 2, end: 1}}
axes:
  family: [transformer, hyperloop]
  shape.head_dim: 32
  shape.unrolled_layers: 6
objectives: [val_loss:min, params:min]
trials: 6
"""


def test_a_ladder_solves_every_candidate_at_every_budget(tmp_path):
    from benchmark.space.plan import make_plan, warnings

    path = tmp_path / "ladder.yaml"
    path.write_text(LADDER)
    space = load_space(path)
    assert space.ladder == (500_000, 1_000_000, 2_000_000) and space.budget == 2_000_000
    assert space.axes[0].key == "budget"
    plan = make_plan(space)
    assert not plan.sampled
    got = sorted((c.solution.budget, c.spec.family) for c in plan.candidates)
    assert got == sorted((b, f) for b in space.ladder for f in ("transformer", "hyperloop"))
    for c in plan.candidates:  # each within tolerance of its own rung, so params spans 4x
        assert abs(c.solution.params["total"] - c.solution.budget) <= 0.005 * c.solution.budget
    assert warnings(space) == []  # params varies along a ladder: a real objective


def test_a_sampled_ladder_starts_with_each_rung_once_and_budget_overrides_make_ladders(tmp_path):
    from benchmark.space.plan import first_points, make_plan, warnings

    path = tmp_path / "ladder.yaml"
    path.write_text(LADDER.replace("trials: 6", "trials: 4"))  # 6 points > 4 trials: sampled
    space = load_space(path)
    assert first_points(space) == [
        {"budget": 500_000},
        {"budget": 1_000_000},
        {"budget": 2_000_000},
    ]
    plan = make_plan(space)
    assert plan.sampled and [c.solution.budget for c in plan.candidates[:3]] == list(space.ladder)
    one = load_space(path, [Override(key="budget", value="1M", given="--budget 1M")])
    assert (one.budget, one.ladder, [a.key for a in one.axes][:1]) == (1_000_000, (), ["family"])
    assert "constant by construction" in warnings(one)[0]
    two = load_space(path, [Override(key="budget", value="4M,1M", given="--budget 4M,1M")])
    assert two.ladder == (1_000_000, 4_000_000) and two.axes[0].key == "budget"


def test_a_ladder_with_a_repeated_rung_is_an_error_on_its_line(tmp_path):
    path = tmp_path / "ladder.yaml"
    path.write_text(LADDER.replace("[2M, 0.5M, 1M]", "[1M, 1M]"))
    with pytest.raises(SpaceError, match=r"ladder\.yaml:2:\d+: budget: a budget is listed twice"):
        load_space(path)


def test_a_space_may_ask_for_seeds_and_the_plan_counts_them(tmp_path):
    from benchmark.space.plan import make_plan, records, summary

    path = tmp_path / "ladder.yaml"
    path.write_text(LADDER + "seeds: 3\n")
    space = load_space(path)
    plan = make_plan(space)
    rows = records(plan, 1e9)
    line = summary(plan, rows)
    assert space.seeds == 3 and "6 (the whole grid) candidates x 3 seeds" in line
    assert f"the trials {sum(r['est_seconds'] for r in rows) * 3 / 3600:.1f} h" in line
    assert "the search around them 15 s (until a search has run here)" in line  # SEARCH_START_S
    path.write_text(LADDER + "seeds: 0\n")
    with pytest.raises(
        SpaceError, match=r"ladder\.yaml:\d+:\d+: seeds: expected a positive integer, got 0"
    ):
        load_space(path)


# ---- controlled: the shape held across a claim's arms --------------------------------------------

CONTROLLED = """\
name: arms
budget: 1M
count: non_embedding_head
controlled: true
solve: ffn
anchor: {family: looped}
base: {vocab_size: 2048, tie_embeddings: false, layers: {begin: 1, middle: 2, end: 1}}
axes:
  family: [looped, hyperloop]
  shape.head_dim: 32
  shape.unrolled_layers: 6
"""


def test_a_controlled_space_holds_d_model_and_heads_and_solves_the_ffn(tmp_path):
    """search_spaces/reference-2/hyperloop.yaml at 1M: both families at d_model 128 with 4 heads of
    exactly 32; Hyperloop's gates come out of its d_ff (301 against Looped's 309)."""
    plan = make_plan(load_space(write(tmp_path, CONTROLLED)))
    shapes = [
        (c.spec.family, c.spec.d_model, c.spec.n_heads, c.spec.head_dim, c.spec.ffn.d_ff)
        for c in plan.candidates
    ]
    assert shapes == [("looped", 128, 4, 32, 309), ("hyperloop", 128, 4, 32, 301)]
    assert all(abs(c.distance) <= 0.005 for c in plan.candidates)


def test_a_controlled_ratio_is_the_trained_ratio_or_a_located_error(tmp_path):
    """Held exactly, d_h/d_model 0.405 at 12 layers leaves d_model alone, in steps of 32, to meet
    1M within 0.5%: no setting does, and the error names the locks to relax (exit 2 from the CLI).
    Without `controlled` the solver moved the ratio to 0.236 (ref-hourglass's K4-L12)."""
    text = (
        "name: hg\nbudget: 1M\ncount: non_embedding\ncontrolled: true\nbase: {vocab_size: 2048, layers: 12}\n"
        "variants:\n  K4: {ffn: {kind: hourglass, K: 4, dh_ratio: 0.405}}\naxes:\n  shape.head_dim: 32\n"
    )
    space = load_space(write(tmp_path, text))
    with pytest.raises(SpaceError) as e:
        make_plan(space)
    message = str(e.value)
    assert message.startswith(f"{tmp_path / 'space.yaml'}:2:9: budget: ")
    assert (
        "shape.head_dim 32 exactly (d_model in steps of 32) and ffn.dh_ratio 0.405 exactly"
        in message
    )
    assert "hold the shape with an anchor and solve: ffn, or widen tolerance" in message
    loose = make_plan(load_space(write(tmp_path, text.replace("controlled: true\n", ""))))
    (c,) = loose.candidates
    assert (c.spec.d_model, c.spec.ffn.d_h) == (110, 26)  # 0.236, the record's model
    wide = make_plan(
        load_space(write(tmp_path, text.replace("budget: 1M", "budget: 1M\ntolerance: 5%")))
    )
    (c,) = wide.candidates
    assert c.spec.head_dim == 32 and c.spec.ffn.d_h == round(
        0.405 * c.spec.d_model
    )  # held where it can be


def test_a_controlled_space_refuses_a_ratio_the_solver_would_drop(tmp_path):
    text = CONTROLLED.replace("base: {", "base: {ffn: {ratio: 3}, ")
    with pytest.raises(
        SpaceError, match=r"base.ffn.ratio: ffn.ratio has no effect when the FFN width is solved"
    ):
        load_space(write(tmp_path, text))


def test_no_head_width_target_gives_one_head():
    """ref-hyperloop at 500K gave the Transformer and Hyperloop one head of 70-74: a head-width
    target now leaves 2 heads or more."""
    raw = {
        "family": "transformer",
        "vocab_size": 2048,
        "tie_embeddings": False,
        "layers": {"begin": 6},
    }
    s = solve_budget(raw, budget=500_000, count="non_embedding_head", head_dim=32)
    assert s.spec.n_heads >= 2 and abs(s.distance) <= 0.005
