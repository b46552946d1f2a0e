"""Representation analyses on real tensors: names and shapes per family, exact values where the
model makes them exact (an identity middle block; the lens at the last layer is the model's own
loss; the early merge at a loop's end is the hyper-connection's output)."""

import math

import pytest
import torch
import torch.nn.functional as F

from benchmark import FAMILIES, ArchSpec, build_model
from benchmark.models.hyper import DIAGONAL_BIAS_INIT
from benchmark.trial.analysis import (
    cross_loop_similarity,
    fixed_point_distances,
    layer_states,
    logit_lens,
)

TINY = {"vocab_size": 61, "d_model": 32, "n_heads": 4}
SPLIT = {"begin": 1, "middle": 2, "end": 1}
LOOPED = [f for f in FAMILIES if f not in ("transformer", "mhc", "hc")]


def tiny(family, seed=0, **over):
    raw = {"family": family, **TINY, **over}
    if family in LOOPED and "layers" not in over:
        raw["layers"] = SPLIT
    torch.manual_seed(seed)
    return build_model(ArchSpec.from_dict(raw)).eval()


def tokens(batch=2, seq=10, seed=0):
    return torch.randint(
        0, TINY["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(seed)
    )


def identity_middle(m):
    """Zero the projections that write into the residual stream: every middle layer is h -> h."""
    with torch.no_grad():
        for block in m.middle:
            block.attn.o.weight.zero_()
            for mlp in block.ffn.blocks:
                mlp.w2.weight.zero_()
    return m


def expected_names(spec):
    if spec.hyper is not None and not spec.looped:
        return [f"hyper.{j}" for j in range(spec.layers.unique)]
    s = spec.layers
    middle = (
        [f"middle.{loop}.{i}" for loop in range(spec.loops) for i in range(s.middle)]
        if spec.looped
        else []
    )
    return [f"begin.{i}" for i in range(s.begin)] + middle + [f"end.{i}" for i in range(s.end)]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_effective_layer_is_named_and_shaped(family):
    m, x = tiny(family), tokens()
    names = expected_names(m.spec)
    for outer in (False, True):
        states = layer_states(m, x, outer=outer)
        assert [n for n, _ in states] == names
        assert all(s.shape == (2, 10, 32) for _, s in states)
    sim = cross_loop_similarity(m, x)
    assert list(sim.names) == names and sim.matrix.shape == (len(names), len(names))
    torch.testing.assert_close(sim.matrix, sim.matrix.T)
    torch.testing.assert_close(sim.matrix.diagonal(), torch.ones(len(names)))
    lens = logit_lens(m, x, tokens(seed=1))
    assert list(lens.names) == names
    assert lens.cross_entropy.shape == lens.entropy.shape == lens.accuracy.shape == (len(names),)
    assert (lens.entropy <= math.log(TINY["vocab_size"]) + 1e-5).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_lens_at_the_last_layer_is_the_models_own_loss(family):
    m, x, y = tiny(family), tokens(), tokens(seed=1)
    lens = logit_lens(m, x, y)
    with torch.no_grad():
        logits = m(x)
    torch.testing.assert_close(
        lens.cross_entropy[-1], F.cross_entropy(logits.flatten(0, 1), y.flatten())
    )
    assert lens.accuracy[-1] == (logits.argmax(-1) == y).float().mean()


def test_the_early_merge_at_a_loops_end_is_the_hyper_connection_output():
    """Hyperloop footnote 5: merging after a loop's last layer gives the streams the model has."""
    m, x = tiny("hyperloop", loops=3), tokens()
    trace = []
    with torch.no_grad():
        m(x, trace=trace)
    outer = dict(layer_states(m, x, outer=True))
    inner = dict(layer_states(m, x))
    for loop in range(3):
        streams = dict(trace)[f"hyper.{2 * loop + 1}"]  # (B, T, n, d)
        torch.testing.assert_close(outer[f"middle.{loop}.1"], streams.mean(dim=-2))
        # inside the loop the inner stream is not the merged one
        assert (inner[f"middle.{loop}.1"] - outer[f"middle.{loop}.1"]).abs().max() > 1e-3


@pytest.mark.parametrize("family", ["looped", "abbie-c", "hyperloop", "lora-looped"])
def test_an_identity_middle_block_repeats_itself_across_loops(family):
    m, x = tiny(family, loops=3), tokens()
    before = cross_loop_similarity(m, x).cross_loop
    sim = cross_loop_similarity(identity_middle(m), x)
    assert before < 0.999  # not vacuous
    assert sim.cross_loop == pytest.approx(1.0, abs=1e-6)
    middle = [i for i, n in enumerate(sim.names) if n.startswith("middle.")]
    torch.testing.assert_close(sim.matrix[middle][:, middle], torch.ones(len(middle), len(middle)))


@pytest.mark.parametrize("family", ["looped", "abbie-c", "lora-looped"])
def test_an_identity_middle_block_is_a_fixed_point_from_the_start(family):
    d = fixed_point_distances(identity_middle(tiny(family)), tokens(), max_loops=6)
    assert d.shape == (2, 6)
    torch.testing.assert_close(d, torch.zeros(2, 6))


@pytest.mark.parametrize("first, first_distance", [(0, 1.0), (1, 0.0)])
def test_abbie_d_doubles_an_identity_block(first, first_distance):
    """AbbIE eq. 4: h_{k+1} = B(h_k) + h_k = 2 h_k, distance 1, from iteration loop_residual_from;
    before it h_1 = B(h_0) = h_0, distance 0."""
    m = identity_middle(tiny("abbie-d", loop_residual_from=first))
    d = fixed_point_distances(m, tokens(), max_loops=5)
    torch.testing.assert_close(d, torch.tensor([[first_distance, 1, 1, 1, 1]] * 2))


def test_hyperloop_at_initialisation_shrinks_identity_streams_by_its_diagonal_gate():
    """Read as a delta, an identity block adds nothing; gates start input-independent with
    H_res = σ(3) I, so Y_k = σ(3)^k Y_0 and every distance is 1 - σ(3)."""
    m = identity_middle(tiny("hyperloop", loops=3, hyper={"read": "delta"}))
    d = fixed_point_distances(m, tokens(), max_loops=8)
    gap = 1 - torch.sigmoid(torch.tensor(DIAGONAL_BIAS_INIT["delta"]))
    torch.testing.assert_close(d, gap.expand(2, 8))


@pytest.mark.parametrize(
    "family", ["looped", "abbie-c", "abbie-d", "depth", "hyperloop", "lora-looped"]
)
def test_fixed_point_distances_run_past_the_trained_loops(family):
    d = fixed_point_distances(tiny(family), tokens(), max_loops=12)
    assert d.shape == (2, 12) and torch.isfinite(d).all() and (d > 0).all()


def test_models_without_loops_have_no_cross_loop_similarity_or_iterations():
    m = tiny("transformer")
    assert cross_loop_similarity(m, tokens()).cross_loop is None
    with pytest.raises(ValueError, match="transformer: no looped middle block"):
        fixed_point_distances(m, tokens())


def test_analyses_keep_the_models_mode():
    m = tiny("depth").train()
    fixed_point_distances(m, tokens(), max_loops=2)
    logit_lens(m, tokens(), tokens(seed=1))
    assert m.training
