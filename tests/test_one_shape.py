"""`solve: none`: every candidate keeps the anchor's whole shape (d_model, heads, FFN width) and its
own parameter count, the budget and its tolerance sizing the anchor alone (Hyperloop §4.2, Table 1:
a Transformer at the Hyperloop's width with twice its parameters); and `shapebench plan
--claims`, which follows a plan's candidates with each claim's arms and what they differ in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmark import count_params
from benchmark.leaderboard.claims import arms
from benchmark.perf import probe
from benchmark.search.command import plan_main
from benchmark.search.command import search_main as main
from benchmark.space import SpaceError, load_space
from benchmark.space.plan import TRIAL_REST_S, make_plan
from benchmark.store.speeds import Speed

ROOT = Path(__file__).resolve().parent.parent
TWICE = str(ROOT / "search_spaces" / "reference-2" / "twice.yaml")
CLAIMS_2 = str(ROOT / "search_spaces" / "claims" / "reference-2.yaml")
TWICE_3 = str(ROOT / "search_spaces" / "reference-3" / "twice.yaml")
CLAIMS_3 = str(ROOT / "search_spaces" / "claims" / "reference-3.yaml")

ONE_SHAPE = """\
name: one-shape
budget: 1.08M
count: non_embedding_head
controlled: true
solve: none
anchor: {family: hyperloop, ffn: {ratio: 2.75}}
base: {vocab_size: 2048, tie_embeddings: false, layers: {begin: 1, middle: 2, end: 1}}
axes:
  family: [hyperloop, transformer]
  shape.head_dim: 32
  shape.unrolled_layers: 6
training: {tokens: 1.5M, seq_len: 128, batch_size: 32, warmup: 0.05}
"""


@pytest.fixture(autouse=True)
def fixed_machine(monkeypatch):
    monkeypatch.setattr(
        probe, "probe_speed", lambda spec, cfg: Speed(5e10, TRIAL_REST_S, 0)
    )  # no probe trains


def write(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(SpaceError) as e:
        make_plan(load_space(write(tmp_path, text)))
    return str(e.value)


def test_every_candidate_keeps_the_anchors_shape_and_its_own_count(tmp_path):
    """Hyperloop App. A's shape in miniature: d_model 128, 4 heads of 32, d_ff 2.75 x 128 = 352 for
    both; the anchor (the Hyperloop) lands 0.12% under 1.08M, the Transformer's six unique layers
    make it 1.361x the Hyperloop's non-embedding + head count (the paper: 238.0M / 135.7M)."""
    plan = make_plan(load_space(write(tmp_path, ONE_SHAPE)))
    shapes = [
        (
            c.spec.family,
            c.spec.structure(),
            c.spec.d_model,
            c.spec.n_heads,
            c.spec.head_dim,
            c.spec.ffn.d_ff,
        )
        for c in plan.candidates
    ]
    assert shapes == [
        ("hyperloop", "1L→2L(×2)→1L", 128, 4, 32, 352),
        ("transformer", "6L", 128, 4, 32, 352),
    ]
    own = [c.solution.params["non_embedding_head"] for c in plan.candidates]
    assert own == [1_078_686, 1_468_032]
    assert all(c.solution.params == count_params(c.spec) for c in plan.candidates)
    assert {c.anchor.params["non_embedding_head"] for c in plan.candidates} == {
        1_078_686
    }  # the anchor is the Hyperloop
    assert [round(c.anchor_ratio, 4) for c in plan.candidates] == [1.0, 1.3609]
    assert plan.candidates[0].anchor.distance == pytest.approx(
        -0.00122, abs=1e-5
    )  # within the 0.5% tolerance
    assert plan.candidates[1].distance == pytest.approx(
        0.3593, abs=1e-4
    )  # its own: no budget matched


def test_the_plan_prints_each_count_over_the_anchors(tmp_path, capsys):
    path = str(write(tmp_path, ONE_SHAPE))
    assert plan_main([path]) == 0
    out = capsys.readouterr().out
    assert "× anchor" in out and "Δ budget" not in out
    assert "│   1.000× │" in out and "│   1.361× │" in out and "1,468,032" in out
    assert (
        "solve: none: the anchor -0.122% from the budget, every candidate at its shape with its own count, "
        "1.000-1.361× the anchor's"
    ) in " ".join(out.split())
    assert plan_main([path, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [round(r["anchor_ratio"], 3) for r in rows] == [1.0, 1.361]
    assert rows[1]["params_non_embedding_head"] == 1_468_032


def test_the_reference_space_is_the_hyperloop_of_the_other_claims():
    """search_spaces/reference-2/twice.yaml: its Hyperloop is ref2-hyperloop's at 250K (d_ff 146)."""
    plan = make_plan(load_space(TWICE))
    assert [
        (
            c.spec.family,
            c.spec.d_model,
            c.spec.n_heads,
            c.spec.ffn.d_ff,
            c.solution.params["non_embedding_head"],
        )
        for c in plan.candidates
    ] == [("hyperloop", 64, 2, 146, 250_078), ("transformer", 64, 2, 146, 332_864)]


@pytest.mark.parametrize(
    "change, where, message",
    [
        (
            "anchor: {family: hyperloop, ffn: {ratio: 2.75}}\n",
            "solve",
            (
                "none keeps every candidate at the anchor's "
                "shape (d_model, heads, FFN width) with its own parameter count; it needs an `anchor:`"
            ),
        ),
        (
            "  shape.unrolled_layers: 6\n",
            "axes.n_heads",
            (
                "n_heads is held from the anchor (solve: none: every "
                "candidate keeps the anchor's d_model, heads and FFN width); set the shape in `anchor:`"
            ),
        ),
        ("base: {", "base.ffn.d_ff", "ffn.d_ff is held from the anchor"),
    ],
)
def test_what_the_anchor_holds_is_refused_elsewhere_with_its_place(
    tmp_path, change, where, message
):
    text = {
        "solve": ONE_SHAPE.replace(change, ""),
        "axes.n_heads": ONE_SHAPE.replace(change, change + "  n_heads: [4]\n"),
        "base.ffn.d_ff": ONE_SHAPE.replace(change, "base: {ffn: {d_ff: 300}, "),
    }[where]
    with pytest.raises(SpaceError) as e:
        load_space(write(tmp_path, text))
    assert f": {where}: {message}" in str(e.value)
    assert str(e.value).startswith(f"{tmp_path / 'space.yaml'}:")


def test_another_ffn_than_the_anchors_is_a_located_error(tmp_path):
    text = ONE_SHAPE.replace(
        "  shape.head_dim: 32\n", "  shape.head_dim: 32\n  ffn.kind: [swiglu, hourglass]\n"
    )
    message = error_of(tmp_path, text)
    assert (
        ": axes.ffn.kind: solve: none keeps the anchor's FFN (swiglu, ffn.d_ff 352) for every candidate; "
        "this one's is hourglass" in message
    )


def test_a_budget_the_anchors_shape_cannot_meet_says_what_it_sizes(tmp_path):
    """At 2M, d_model in steps of 32 with d_ff 2.75 x d_model gives 1.60M or 2.22M: the budget sizes
    the anchor alone, and the message names the locks."""
    message = error_of(tmp_path, ONE_SHAPE.replace("budget: 1.08M", "budget: 2M"))
    assert ": budget: " in message and "(+11.01%), outside tolerance 0.5%" in message
    assert (
        "under solve: none the budget and its tolerance size the anchor alone (every candidate keeps its "
        "shape with its own count), held at shape.head_dim 32 exactly (d_model in steps of 32) and ffn.ratio "
        "2.75 exactly: give the budget the anchor's size at the shape wanted"
    ) in message


def test_one_shape_arms_differ_in_the_family_alone_and_d_model_would_be_a_confound():
    declared = {"solve": "none", "anchor": {"family": "hyperloop"}}
    assert arms.solved(declared) == set()
    loop = {
        "family": "hyperloop",
        "d_model": 128,
        "n_heads": 4,
        "ffn.d_ff": 301,
        "structure": "1L→2L(×2)→1L",
    }
    flat = {
        "family": "transformer",
        "d_model": 128,
        "n_heads": 4,
        "ffn.d_ff": 301,
        "structure": "6L",
    }
    filters = {"a": {"family": ("hyperloop",)}, "b": {"family": ("transformer",)}}
    assert arms.compare({"a": [loop], "b": [flat]}, filters, declared).label == "controlled"
    wider = {**flat, "d_model": 192, "n_heads": 6}
    assert (
        arms.compare({"a": [loop], "b": [wider]}, filters, declared).label
        == "confounded: d_model, n_heads"
    )


# ---- shapebench plan SPACE --claims FILE -------------------------------------------------------------


def test_the_plan_lists_the_claims_arms_and_what_differs(capsys):
    assert plan_main([TWICE, "--claims", CLAIMS_2]) == 0
    out = capsys.readouterr().out
    table = out.index("│ transformer │")
    claim = out.index(
        "### Hyperloop beats a Transformer of the same unrolled depth with about twice its parameters"
    )
    assert table < claim  # after the candidates
    # 20 tokens per each model's own count: the Transformer trains 1.33x the Hyperloop's tokens,
    # which the claim's token rule (the default, `same`: Hyperloop §4.1) does not allow
    assert (
        "`ref2-twice` — **confounded: tokens**; differ in: family, layers.begin, layers.middle, "
        "layers.end, loops, injection, structure, hyper, tokens; token rule: same"
    ) in out
    assert (
        "| hyperloop | hyperloop | 64 | 2 | 32 | swiglu 1×146 (2.281) | 1L→2L(×2)→1L | 4× diagonal / "
        "loop + loop emb. | False | 250,078 | 5,001,560 |"
    ) in out
    assert (
        "| transformer | transformer | 64 | 2 | 32 | swiglu 1×146 (2.281) | 6L | none | False | 332,864 "
        "| 6,657,280 |"
    ) in out
    assert out.count("### ") == 1  # only the claims on this space's study
    # the third pass: every arm 20 x the budget (tokens_per: budget), the same 5,000,000 tokens
    assert plan_main([TWICE_3, "--claims", CLAIMS_3]) == 0
    out = capsys.readouterr().out
    assert (
        "`ref3-twice` — **controlled**; differ in: family, layers.begin, layers.middle, layers.end, "
        "loops, injection, structure, hyper; token rule: same"
    ) in out
    assert out.count("| False | 250,078 | 5,000,000 |") == 1
    assert out.count("| False | 332,864 | 5,000,000 |") == 1
    # and at the paper's structure (3 loops): the Transformer has 2x the unique layers, as the
    # paper's, and 1.66x the count (the paper's 1.75x)
    assert (
        plan_main([str(Path(TWICE_3).with_name("twice-3-loops.yaml")), "--claims", CLAIMS_3]) == 0
    )
    out = capsys.readouterr().out
    assert "`ref3-twice-3-loops` — **controlled**" in out and out.count("### ") == 1
    assert "| 1L→2L(×3)→1L | 4× diagonal / loop + loop emb. | False | 250,157 | 5,000,000 |" in out
    assert "| swiglu 1×142 (2.219) | 8L | none | False | 415,808 | 5,000,000 |" in out


CONFOUNDED = """\
name: mixed
budget: 1M
count: non_embedding_head
base: {vocab_size: 2048, tie_embeddings: false, layers: {begin: 1, middle: 2, end: 1}}
variants:
  narrow: {family: looped, ffn: {ratio: 2}}
  wide: {family: hyperloop, ffn: {ratio: 3}}
axes:
  shape.head_dim: 32
training: {tokens: 1.5M, seq_len: 128, batch_size: 32, warmup: 0.05}
"""
CLAIMS = """\
claims:
  - claim: Hyperloop beats Looped
    source: {paper: Hyperloop Transformers, where: "§4.2, Table 1"}
    study: mixed
    metric: val_loss
    order: [hyperloop, looped]
    groups:
      hyperloop: {family: hyperloop}
      looped: {family: looped}
"""


def test_a_confounded_claim_names_the_keys_its_groups_do_not_account_for(tmp_path, capsys):
    """The families come with different FFN ratios (2 and 3) and, uncontrolled, head_dim 32 is a
    preference the solver moves: the claim tests the family, so the ratio and the head width are
    confounds; d_model and the FFN width follow the budget (solve: d_model)."""
    space, claims = write(tmp_path, CONFOUNDED), write(tmp_path, CLAIMS, "claims.yaml")
    assert plan_main([str(space), "--claims", str(claims)]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("`mixed` — "))
    assert line == (
        "`mixed` — **confounded: head_dim, ffn.width_ratio**; differ in: family, d_model, head_dim, "
        "ffn.d_ff, injection, ffn.width, ffn.width_ratio, hyper; token rule: same"
    )


def test_the_plans_claims_flag_fails_plainly(tmp_path, capsys):
    space = str(write(tmp_path, CONFOUNDED))
    assert plan_main([space, "--claims", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: cannot be read" in capsys.readouterr().err
    other = write(tmp_path, CLAIMS.replace("study: mixed", "study: elsewhere"), "other.yaml")
    assert plan_main([space, "--claims", str(other)]) == 0
    assert "note: no claim of " in capsys.readouterr().err
    assert main([space, "--claims", str(other)]) == 2
    assert (
        "shapebench search: --claims applies only to a plan (shapebench board --claims"
        in capsys.readouterr().err
    )
