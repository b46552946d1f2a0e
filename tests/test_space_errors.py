"""Every malformed search space exits with code 2 and one line, `path:line:col: key.path: what is
wrong`, with no traceback, nothing run and nothing written. The fixtures are tests/spaces/bad/*.yaml;
each has its exact expected message here, and a fixture without one fails the first test."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmark.search.command import plan_main
from benchmark.store.metrics import SEARCHABLE

ROOT = Path(__file__).resolve().parent.parent
BAD = Path(__file__).resolve().parent / "spaces" / "bad"
FAMILIES = "transformer, looped, hyperloop, mhc, hc, abbie-c, abbie-d, depth, lora-looped"
METRICS = ", ".join(SEARCHABLE)  # the searchable metrics of the registry (store/metrics.py)
NOT_ALLOWED = (
    "is not allowed: a config holds only text, numbers, true/false, null, lists and mappings "
    "(quote a value to make it text)"
)

EXPECTED = {
    "alias.yaml": "alias.yaml:4:9: anchors and aliases (*name) are not supported",
    "bad_budget.yaml": "bad_budget.yaml:2:9: budget: expected an amount like 113M, 1.2B or 500K, got 'lots'",
    "bad_indentation.yaml": "bad_indentation.yaml:5:5: YAML syntax: inconsistent indentation",
    "bad_tolerance.yaml": "bad_tolerance.yaml:3:12: tolerance: must be between 0% and 100% (exclusive), got '150%'",
    "condition_reads_later_axis.yaml": "condition_reads_later_axis.yaml:4:41: axes.hyper.streams.when: reads axis "
    "'family', which is decided at or after this one; declare it above",
    "condition_syntax.yaml": "condition_syntax.yaml:5:41: axes.hyper.streams.when: expected a value, found the end "
    "(at character 10 of the condition)",
    "condition_unknown_name.yaml": "condition_unknown_name.yaml:5:41: axes.hyper.streams.when: unknown name 'famly' "
    "(did you mean 'family'?)",
    "duplicate_key.yaml": "duplicate_key.yaml:6:3: axes.family: duplicate key (first given at line 4)",
    "empty.yaml": "empty.yaml:1:1: the file is empty",
    "float_range_on_int_key.yaml": "float_range_on_int_key.yaml:5:11: axes.ffn.K.float: ffn.K takes whole numbers; "
    "use int: [lo, hi] or choice",
    "impossible_budget.yaml": "impossible_budget.yaml:2:9: budget: at d_model=8 (the smallest valid: a multiple of 2 x "
    "n_heads=4, for an even head_dim) this candidate already has 70,280 parameters; the "
    "smallest feasible budget at tolerance 0.5% is 69,931 (candidate: family=transformer)",
    "invalid_combination.yaml": "invalid_combination.yaml:5:16: axes.hyper.every: every 5 layers does not divide the "
    "4 x 3 unrolled middle layers (candidate: family=hyperloop, hyper.every=5, "
    "hyper.loop_embedding=False)",
    "lo_above_hi.yaml": "lo_above_hi.yaml:5:24: axes.layers.middle.int: lo must be < hi, got [6, 2] (for one value "
    "use `value: 6`)",
    "misspelt_base_value.yaml": "misspelt_base_value.yaml:4:15: base.ffn.kind: 'hourglas' is not one of swiglu, "
    "hourglass (did you mean 'hourglass'?)",
    "misspelt_count.yaml": "misspelt_count.yaml:3:8: count: 'totl' is not one of total, non_embedding, "
    "non_embedding_head (did you mean 'total'?)",
    "misspelt_domain_key.yaml": "misspelt_domain_key.yaml:4:12: axes.family.choise: unknown key "
    "(did you mean 'choice'?)",
    "misspelt_family.yaml": f"misspelt_family.yaml:4:25: axes.family[1]: 'hyperlop' is not one of {FAMILIES} "
    "(did you mean 'hyperloop'?)",
    "misspelt_objective.yaml": f"misspelt_objective.yaml:5:13: objectives: 'val_los' is not one of {METRICS} "
    "(did you mean 'val_loss'?)",
    "misspelt_schedule.yaml": "misspelt_schedule.yaml:6:13: training.schedule: 'cosin' is not one of cosine, wsd "
    "(did you mean 'cosine'?)",
    "misspelt_solve.yaml": "misspelt_solve.yaml:3:8: solve: 'd_ff' is not one of d_model, ffn.d_ff, ffn.d_h, ffn, none "
    "(did you mean 'ffn.d_ff'?)",
    "no_budget.yaml": "no_budget.yaml:1:1: budget: none given: set `budget:` in the file or pass --budget",
    "only_comment.yaml": "only_comment.yaml:1:1: the file is empty",
    "outside_tolerance.yaml": "outside_tolerance.yaml:2:9: budget: the nearest valid ffn.d_h=4 gives 1.996M (-0.18%), "
    "outside tolerance 0.1%: one step of ffn.d_h moves 36.86K parameters here; "
    "widen tolerance",
    "quantize_group_zero.yaml": "quantize_group_zero.yaml:5:24: quantize.group_size: must be >= 1, got 0",
    "quantize_not_a_mapping.yaml": "quantize_not_a_mapping.yaml:5:11: quantize: expected a mapping like "
    "{group_size: 128, calib_sequences: 1024}, got 128",
    "quantize_unknown_key.yaml": "quantize_unknown_key.yaml:7:3: quantize.calib_sequence: unknown key "
    "(did you mean 'calib_sequences'?)",
    "python_tag.yaml": f"python_tag.yaml:3:7: base: YAML tag !!python/object/apply:os.system {NOT_ALLOWED}",
    "section_as_axis.yaml": "section_as_axis.yaml:4:3: axes.ffn: `ffn` is a section; name a key inside it, "
    "e.g. ffn.kind",
    "solved_key_as_axis.yaml": "solved_key_as_axis.yaml:4:3: axes.d_model: d_model is solved to meet the budget "
    "(solve: d_model); it cannot also be an axis",
    "solved_key_in_base.yaml": "solved_key_in_base.yaml:3:8: base.d_model: d_model is solved to meet the budget "
    "(solve: d_model); it cannot also be given",
    "tab_indentation.yaml": "tab_indentation.yaml:3:1: YAML syntax: tabs are not allowed; indent with spaces",
    "top_level_list.yaml": "top_level_list.yaml:1:1: a search space is a mapping (name, budget, base, axes, ...), "
    "got list",
    "unknown_axis_key.yaml": "unknown_axis_key.yaml:5:3: axes.layers.midle: unknown key (did you mean "
    "'layers.middle'?)",
    "unknown_top_key.yaml": "unknown_top_key.yaml:2:1: budgt: unknown key (did you mean 'budget'?)",
    "unknown_training_key.yaml": "unknown_training_key.yaml:5:12: training.tokns: unknown key (did you mean 'tokens'?)",
    "unrolled_mismatch.yaml": "unrolled_mismatch.yaml:5:26: axes.shape.unrolled_layers: 15 unrolled layers is not "
    "begin 2 + middle 4 x loops + end 2 for any whole number of loops (candidate: "
    "family=looped, shape.unrolled_layers=15)",
    "wrong_type_in_choice.yaml": "wrong_type_in_choice.yaml:5:14: axes.loops[1]: expected an integer, got 'three'",
    "wrong_type_trials.yaml": "wrong_type_trials.yaml:5:9: trials: expected a positive integer, got 'many'",
}


def test_every_fixture_has_its_expected_message():
    assert sorted(p.name for p in BAD.glob("*.yaml")) == sorted(EXPECTED)
    assert len(EXPECTED) >= 20


def _listing(directory: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(directory)), p.stat().st_size) for p in directory.rglob("*"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_malformed_space_exits_2_with_one_located_message(name, tmp_path, monkeypatch, capsys):
    shutil.copy(BAD / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    before = _listing(tmp_path)
    assert plan_main([name]) == 2
    out, err = capsys.readouterr()
    assert err == EXPECTED[name] + "\n" and out == ""
    assert _listing(tmp_path) == before


@pytest.mark.parametrize(
    "name", ["python_tag.yaml", "bad_indentation.yaml", "impossible_budget.yaml"]
)
def test_the_real_command_line_fails_cleanly(name, tmp_path):
    """As a user runs it: a separate process, cwd in an empty directory. The python_tag fixture
    would `touch pwned` if any tag could run code."""
    shutil.copy(BAD / name, tmp_path / name)
    before = _listing(tmp_path)
    run = subprocess.run(
        [sys.executable, str(ROOT / "run_search.py"), name, "--plan"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert run.stderr == EXPECTED[name] + "\n" and run.stdout == ""
    assert "Traceback" not in run.stderr
    assert _listing(tmp_path) == before and not (tmp_path / "pwned").exists()
