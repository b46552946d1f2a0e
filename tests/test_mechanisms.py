"""Each family's mechanism acts at its real setting: tests that fail on a collapsed model.

The equivalence tests (test_models.py) show that every variant reduces to its baseline at its
simplest setting; they passed while Hyperloop's and mHC's n streams stayed exact copies for ever.
Here every family in the registry has checks that its defining part does something once trained
for a few dozen steps at a tiny size: streams separate, H_res and loop embeddings move, stream
counts and mixings change the loss, adapters move, recurrence variants differ, Depth's initial
state matters. A family added to `benchmark.FAMILIES` without an entry in MECHANISMS fails
`test_every_family_has_mechanism_checks`. The checks that detect a collapse (COLLAPSE_DETECTORS)
are also run on the collapsed model (`hyper.init: symmetric`, the initialisation before the fix)
and must fail there.

Measured on the collapsed code (before `hyper.init`): streams of hyperloop and mhc 0.0 apart
after 40 steps; hyperloop with identity and sinkhorn mixing at losses 0.061082 vs 0.061083.
"""

import functools
import json

import pytest
import torch
import torch.nn.functional as F

from benchmark import FAMILIES, ArchSpec, build_model
from benchmark.models.hyper import res_matrix
from benchmark.recipe import TrainConfig
from benchmark.trial.analysis import hyper_diagnostics
from benchmark.trial.training import make_optimizer

TINY = {"vocab_size": 97, "d_model": 32, "n_heads": 4}
SPLIT = {"layers": {"begin": 1, "middle": 2, "end": 1}}
FLAT = {"layers": {"n": 4}}
STEPS = 40
MIN_STREAM_DISTANCE = 0.01  # measured: >= 0.06 for every family; 0.0 (hc: 6e-7) when collapsed
MIN_LOSS_GAP = 0.01  # relative; measured >= 4%; collapsed: 0.6% (streams), 2e-5 (mixings)


def spec(family: str, hyper: dict | None = None, **over) -> ArchSpec:
    raw = {
        "family": family,
        **TINY,
        **(FLAT if family in ("transformer", "mhc", "hc") else SPLIT),
        **over,
    }
    if hyper:
        raw["hyper"] = hyper
    return ArchSpec.from_dict(raw)


def batch(seed: int = 3) -> torch.Tensor:
    return torch.randint(0, 97, (8, 33), generator=torch.Generator().manual_seed(seed))


@functools.lru_cache(maxsize=None)
def _trained(key: str):
    s = ArchSpec.from_dict(json.loads(key))
    torch.manual_seed(0)
    m = build_model(s).train()
    initial = {k: v.detach().clone() for k, v in m.state_dict().items()}
    opt = make_optimizer(m, TrainConfig(lr=1e-2))
    x = batch()
    for _ in range(STEPS):
        loss = F.cross_entropy(m(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return m.eval(), initial, loss.item()


def trained(s: ArchSpec):
    """(model after STEPS AdamW steps on one fixed batch, its initial state_dict, final loss)."""
    return _trained(s.to_json())


def loss_gap(a: float, b: float) -> float:
    return abs(a - b) / min(a, b)


# ---- the checks -----------------------------------------------------------------------------


def streams_separate(family: str, init: str = "home") -> None:
    """The n streams after the last connection differ pairwise (HC §3: otherwise n streams are
    one residual stream with scalar gates)."""
    m, _, _ = trained(spec(family, {"init": init}))
    trace = []
    with torch.no_grad():
        m(batch(5)[:, :-1], trace=trace)
    Y = [x for name, x in trace if name.startswith("hyper.")][-1]  # (B, T, n, d)
    n, scale = Y.shape[-2], Y.norm(dim=-1).mean()
    closest = min(
        ((Y[..., i, :] - Y[..., j, :]).norm(dim=-1).mean() / scale).item()
        for i in range(n)
        for j in range(i + 1, n)
    )
    assert closest > MIN_STREAM_DISTANCE, (
        f"{family}: two streams are {closest:.2e} apart (relative)"
    )
    assert hyper_diagnostics(m, batch(5)[:, :-1])["stream_cosine"] < 1 - 1e-5


def h_res_moves(family: str, init: str = "home") -> None:
    """H_res (the stream mixing) has left its initial value."""
    m, initial, _ = trained(spec(family, {"init": init}))
    fresh = build_model(m.spec).eval()
    fresh.load_state_dict(initial)
    Y = torch.randn(
        2, 5, m.spec.hyper.streams, m.spec.d_model, generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        moved = max(
            (res_matrix(g, g(Y)[2]) - res_matrix(f, f(Y)[2])).abs().max().item()
            for g, f in zip(m.hyper, fresh.hyper)
        )
    assert moved > 1e-3, f"{family}: H_res moved by at most {moved:.2e}"


def stream_count_matters(family: str, init: str = "home") -> None:
    """n = 1 and n = 4 train to measurably different losses."""
    one, four = (trained(spec(family, {"streams": n, "init": init}))[2] for n in (1, 4))
    assert loss_gap(one, four) > MIN_LOSS_GAP, (one, four)


def mixing_matters(family: str, init: str = "home") -> None:
    """Identity, diagonal and Sinkhorn H_res train to measurably different losses (Hyperloop
    Table 6 compares exactly these)."""
    losses = {
        mix: trained(spec(family, {"mixing": mix, "init": init}))[2]
        for mix in ("identity", "diagonal", "sinkhorn")
    }
    for a, b in (("identity", "diagonal"), ("identity", "sinkhorn"), ("diagonal", "sinkhorn")):
        assert loss_gap(losses[a], losses[b]) > MIN_LOSS_GAP, losses


def loop_embeddings_move(family: str) -> None:
    """Hyperloop's e_l start at zero; trained, they are non-zero and differ per loop."""
    m, initial, _ = trained(spec(family))
    assert not initial["loop_emb"].any()
    e = m.loop_emb.detach()
    assert e.norm(dim=-1).min() > 1e-3
    assert torch.pdist(e).min() > 1e-3
    assert hyper_diagnostics(m, batch(5)[:, :-1])["loop_emb_norm"] == pytest.approx(
        e.norm(dim=-1).mean().item()
    )


def adapters_move(family: str) -> None:
    """LoRA's B starts at zero; trained, every loop's adapter is non-zero and they differ."""
    m, _, _ = trained(spec(family, lora_rank=4))
    q = m.middle[0].attn.q
    assert q.lora_B.detach().abs().amax(dim=(1, 2)).min() > 1e-3
    x = torch.randn(3, 32)
    with torch.no_grad():
        assert (q(x, 0) - q(x, 1)).abs().max() > 1e-3


def recurrences_differ(family: str) -> None:
    """AbbIE-C (h = B(h)) and AbbIE-D (h = B(h) + h) with the same weights differ at r = 2."""
    torch.manual_seed(0)
    c, d = build_model(spec("abbie-c")).eval(), build_model(spec("abbie-d")).eval()
    d.load_state_dict(c.state_dict())
    x = batch()[:, :-1]
    with torch.no_grad():
        assert (c(x, loops=2) - d(x, loops=2)).abs().max() > 1e-3


def initial_state_matters(family: str) -> None:
    """Depth draws a random initial state h_0 per forward pass in training: different draws give
    different outputs, the same draw the same output."""
    torch.manual_seed(0)
    m = build_model(spec(family)).train()
    x = batch()[:, :-1]

    def run(seed):
        torch.manual_seed(seed)
        with torch.no_grad():
            return m(x)

    assert (run(1) - run(2)).abs().max() > 1e-3
    torch.testing.assert_close(run(1), run(1), rtol=0, atol=0)


def loops_reuse_the_middle_block(family: str) -> None:
    """The trained middle block runs once per loop, and the loop count changes the output."""
    m, _, _ = trained(spec(family))
    calls = []
    handle = m.middle[0].register_forward_hook(lambda *a: calls.append(1))
    x = batch(5)[:, :-1]
    with torch.no_grad():
        out = m(x)
        assert len(calls) == m.spec.loops
        assert (m(x, loops=m.spec.loops + 1) - out).abs().max() > 1e-3
    handle.remove()


def attention_is_causal_and_uses_context(family: str) -> None:
    """Changing the first token changes the last position's logits; changing the last token
    changes none of the earlier positions."""
    m, _, _ = trained(spec(family))
    x = batch(5)[:, :-1]
    first, last = x.clone(), x.clone()
    first[:, 0] = (first[:, 0] + 1) % 97
    last[:, -1] = (last[:, -1] + 1) % 97
    with torch.no_grad():
        base = m(x)
        assert (m(first)[:, -1] - base[:, -1]).abs().max() > 1e-3
        torch.testing.assert_close(m(last)[:, :-1], base[:, :-1], rtol=0, atol=1e-6)


MECHANISMS = {
    "transformer": (attention_is_causal_and_uses_context,),
    "looped": (loops_reuse_the_middle_block,),
    "hyperloop": (
        streams_separate,
        h_res_moves,
        stream_count_matters,
        mixing_matters,
        loop_embeddings_move,
        loops_reuse_the_middle_block,
    ),
    "mhc": (streams_separate, h_res_moves, stream_count_matters, mixing_matters),
    "hc": (streams_separate, h_res_moves),
    "abbie-c": (recurrences_differ, loops_reuse_the_middle_block),
    "abbie-d": (recurrences_differ, loops_reuse_the_middle_block),
    "depth": (initial_state_matters, loops_reuse_the_middle_block),
    "lora-looped": (adapters_move, loops_reuse_the_middle_block),
}
STREAM_FAMILIES = [f for f, checks in MECHANISMS.items() if streams_separate in checks]
# The checks that a collapsed model (`hyper.init: symmetric`, every stream alike) fails. The others
# test what acts even on copies: a diagonal H_res and HC's A_r still move (every stream gets the same
# gradient, not none), and one stream and four copies differ in scale.
COLLAPSE_DETECTORS = [(f, check) for f in STREAM_FAMILIES for check in (streams_separate,)] + [
    ("hyperloop", mixing_matters),
    ("mhc", mixing_matters),  # identical streams: Sinkhorn mixing = I
    ("mhc", h_res_moves),  # a uniform Sinkhorn H_res never moves
]


def test_every_family_has_mechanism_checks():
    assert set(MECHANISMS) == set(FAMILIES)
    assert set(STREAM_FAMILIES) == {f for f in FAMILIES if spec(f).hyper is not None}


@pytest.mark.parametrize(
    "family, check",
    [(f, c) for f, checks in MECHANISMS.items() for c in checks],
    ids=lambda v: v.__name__ if callable(v) else v,
)
def test_mechanism_acts(family, check):
    check(family)


@pytest.mark.parametrize(
    "family, check", COLLAPSE_DETECTORS, ids=lambda v: v.__name__ if callable(v) else v
)
def test_the_check_fails_on_the_collapsed_model(family, check):
    """The same check on the symmetric initialisation (every stream alike): it must fail, or it
    proves nothing."""
    with pytest.raises(AssertionError):
        check(family, init="symmetric")
