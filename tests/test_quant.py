"""Post-training quantisation on real tensors: the grid, GPTQ against round-to-nearest on the
objective GPTQ minimises, loop-aware Hessians, exact sizes in bytes, and the Hyperloop paper's
claim on a trained model (INT8 ~ lossless; INT4 round-to-nearest worse than GPTQ)."""

import math

import pytest
import torch

from benchmark import ArchSpec, build_model
from benchmark.trial.policy import ExecPolicy
from benchmark.trial.quant import (
    BITS,
    QuantConfig,
    _stacks,
    calibrate,
    collect_hessians,
    gptq,
    model_bytes,
    quantizable,
    quantize,
    rtn,
)
from benchmark.trial.step import TrainStep, lm_loss


def gaussian(rows, cols, seed=0):
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))


def rel_err(w, q):
    return ((w - q).norm() / w.norm()).item()


def output_err(w, q, X):
    """The layer-output error GPTQ minimises: ||X W^T - X Q^T||^2 (GPTQ eq. 1)."""
    return ((X @ (w - q).T) ** 2).sum().item()


def correlated_inputs(n=512, d=96, seed=1):
    """Activations with correlated features and a few outlier channels, as in trained LMs."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g) @ torch.randn(d, d, generator=g)
    X[:, :4] *= 10
    return X


# ---- the grid -----------------------------------------------------------------------------------


def test_int8_reconstructs_weights_closely_and_int4_does_not():
    w = gaussian(64, 128)
    e8 = rel_err(w, rtn(w, QuantConfig(bits=8, method="rtn", group_size=32)))
    e4 = rel_err(w, rtn(w, QuantConfig(bits=4, method="rtn", group_size=32)))
    assert e8 < 0.01
    assert 0.05 < e4 < 0.2
    assert e4 > 10 * e8  # 16x finer grid: ~16x smaller error


@pytest.mark.parametrize("symmetric", [False, True])
def test_smaller_groups_quantise_more_accurately(symmetric):
    w = gaussian(64, 128)
    errs = [
        rel_err(w, rtn(w, QuantConfig(bits=4, method="rtn", group_size=g, symmetric=symmetric)))
        for g in (8, 32, 128)
    ]
    assert errs[0] < errs[1] < errs[2]


def test_each_group_uses_at_most_2_to_the_bits_levels():
    w = gaussian(16, 64)
    for bits in (4, 8):
        q = rtn(w, QuantConfig(bits=bits, method="rtn", group_size=16))
        for s in range(0, 64, 16):
            for row in q[:, s : s + 16]:
                assert len(row.unique()) <= 2**bits


def test_a_ragged_last_group_is_quantised_on_its_own():
    """100 input columns in groups of 32: the last group has 4 columns and its own grid."""
    w = gaussian(8, 100)
    w[:, 96:] *= 100  # were the last columns in another group, they would ruin its grid
    cfg = QuantConfig(bits=4, method="rtn", group_size=32)
    q = rtn(w, cfg)
    assert torch.equal(q[:, :96], rtn(w[:, :96], cfg))
    assert torch.equal(q[:, 96:], rtn(w[:, 96:], cfg))


def test_config_is_validated():
    with pytest.raises(ValueError, match="bits: 3 is not one of 4, 8"):
        QuantConfig(bits=3)
    with pytest.raises(ValueError, match="method: 'awq' is not one of rtn, gptq"):
        QuantConfig(method="awq")
    with pytest.raises(ValueError, match="group_size"):
        QuantConfig(group_size=0)


# ---- GPTQ ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_has_lower_layer_output_error_than_rtn(bits, act_order):
    X, w = correlated_inputs(), gaussian(48, 96, seed=2)
    cfg = QuantConfig(bits=bits, group_size=32, act_order=act_order, block_size=64)
    H = 2 * X.T @ X / X.shape[0]
    e_gptq, e_rtn = output_err(w, gptq(w, H, cfg), X), output_err(w, rtn(w, cfg), X)
    assert e_gptq < 0.7 * e_rtn, (e_gptq, e_rtn)


def test_gptq_with_an_identity_hessian_is_round_to_nearest():
    """With uncorrelated inputs of equal scale there is no error to compensate: GPTQ is RTN."""
    w = gaussian(24, 80)
    cfg = QuantConfig(bits=4, group_size=32)
    assert torch.equal(gptq(w, torch.eye(80), cfg), rtn(w, cfg))


def test_lazy_batch_updates_are_a_reordering_of_the_same_arithmetic():
    """GPTQ §4 Step 2: updating the later columns once per block gives the column-by-column
    result (a float rounding could flip a rare entry, hence the tolerance of 1%)."""
    X, w = correlated_inputs(), gaussian(48, 96, seed=2)
    H = 2 * X.T @ X / X.shape[0]
    for act_order in (False, True):
        one = gptq(w, H, QuantConfig(bits=4, group_size=16, block_size=16, act_order=act_order))
        lazy = gptq(w, H, QuantConfig(bits=4, group_size=16, block_size=96, act_order=act_order))
        assert (one != lazy).float().mean() < 0.01


@pytest.mark.parametrize("act_order", [False, True])
def test_layers_stacked_are_quantised_as_each_alone(act_order):
    """quantize runs GPTQ on a stack of same-shape layers at once: each layer's result is the
    one it gets alone (its own Hessian, its own dead inputs and column order), bit for bit on a
    CPU (a GPU's batched factorisations may round differently in the last bits)."""
    Xs = [correlated_inputs(seed=s) for s in range(3)]
    Xs[1][:, 7] = 0  # one layer with a dead input
    Hs = torch.stack([2 * X.T @ X / X.shape[0] for X in Xs])
    ws = torch.stack([gaussian(48, 96, seed=s) for s in range(3)])
    cfg = QuantConfig(bits=4, group_size=32, act_order=act_order, block_size=64)
    together = gptq(ws, Hs, cfg)
    for w, H, q in zip(ws, Hs, together):
        assert torch.equal(q, gptq(w, H, cfg))
    assert torch.equal(rtn(ws, cfg)[2], rtn(ws[2], cfg))


@pytest.mark.parametrize("act_order", [False, True])
def test_quantize_writes_each_layer_its_own_result_across_stacks(monkeypatch, act_order):
    """Stacks of 3 or fewer layers: every layer's weight is GPTQ of its own weight and Hessian."""
    monkeypatch.setattr("benchmark.trial.quant.STACK_ELEMENTS", 3 * (88 * 32 + 32 * 32))
    m = tiny("hyperloop", loops=2)
    hessians = calibrate(m, [tokens(), tokens(seed=1)])
    cfg = QuantConfig(bits=4, group_size=16, act_order=act_order, symmetric=act_order)
    q, _ = quantize(m, cfg, hessians=hessians)
    for name, proj in quantizable(q).items():
        assert torch.equal(proj.weight, gptq(quantizable(m)[name].weight, hessians[name].H, cfg)), (
            name
        )


def test_stacks_group_layers_by_shape_within_a_size_limit(monkeypatch):
    m = tiny("transformer")  # 4 layers: q, k, v, o (32, 32); w1, w3 (88, 32); w2 (32, 88)
    stacks = _stacks(quantizable(m))
    assert sorted(map(len, stacks)) == [4, 8, 16]
    assert all(len({tuple(quantizable(m)[n].weight.shape) for n in s}) == 1 for s in stacks)
    # At 5 (32, 32) layers' weights and Hessians a stack: q, k, v, o (16) go 5, 5, 5, 1; w1 and w3
    # (8 of (88, 32), 3,840 elements each) 2 at a time; w2 (32, 88), 10,560 alone, one at a time.
    monkeypatch.setattr("benchmark.trial.quant.STACK_ELEMENTS", 5 * (32 * 32 + 32 * 32))
    assert sorted(map(len, _stacks(quantizable(m)))) == [1] * 5 + [2] * 4 + [5] * 3


def test_gptq_output_stays_on_the_group_grids():
    X, w = correlated_inputs(d=64), gaussian(8, 64, seed=3)
    q = gptq(w, 2 * X.T @ X / X.shape[0], QuantConfig(bits=4, group_size=16))
    for s in range(0, 64, 16):
        for row in q[:, s : s + 16]:
            assert len(row.unique()) <= 16


# ---- models -------------------------------------------------------------------------------------

TINY = {
    "vocab_size": 61,
    "d_model": 32,
    "n_heads": 4,
    "layers": {"begin": 1, "middle": 2, "end": 1},
}


def tiny(family, **over):
    torch.manual_seed(0)
    return build_model(ArchSpec.from_dict({"family": family, **TINY, **over})).eval()


def tokens(batch=2, seq=10, vocab=61, seed=0):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", ["looped", "hyperloop", "depth", "lora-looped"])
def test_a_looped_layer_collects_inputs_from_every_loop(family):
    """Hyperloop §4: the Hessian of a shared layer aggregates its inputs across loops."""
    m = tiny(family, loops=3)
    hs = collect_hessians(m, quantizable(m), [tokens(), tokens(seed=1)])
    rows = 2 * 2 * 10  # two batches of (2, 10) tokens
    assert hs["begin.0.attn.q"].rows == rows
    assert hs["middle.1.ffn.blocks.0.w2"].rows == 3 * rows
    assert hs["end.0.attn.o"].rows == rows
    if family == "depth":
        assert hs["inject"].rows == 3 * rows


def test_quantize_copies_the_model_and_keeps_lora_embeddings_and_norms():
    m = tiny("lora-looped", loops=2, tie_embeddings=False)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    q, report = quantize(m, QuantConfig(bits=4, group_size=16), [tokens()])
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())  # original untouched
    quantised = {f"{name}.weight" for name in quantizable(m)}
    assert "lm_head.weight" not in quantised and "middle.0.attn.q.weight" in quantised
    for k, v in q.state_dict().items():
        assert torch.equal(v, before[k]) != (k in quantised), k
    assert report.calib_rows["middle.0.attn.q"] == 2 * report.calib_rows["begin.0.attn.q"] == 2 * 20


def test_one_calibration_serves_every_bit_width():
    """run.quantized_columns calibrates once for INT8 and INT4: the same weights as each width
    collecting its own Hessians, and the model keeps its training mode."""
    m = tiny("hyperloop", loops=2).train()
    hessians = calibrate(m, [tokens(), tokens(seed=1)])
    assert m.training
    for bits in BITS:
        cfg = QuantConfig(bits=bits, group_size=16)
        own, _ = quantize(m, cfg, [tokens(), tokens(seed=1)])
        shared, report = quantize(m, cfg, hessians=hessians)
        assert all(
            torch.equal(a, b)
            for a, b in zip(own.state_dict().values(), shared.state_dict().values())
        )
        assert report.calib_rows["middle.0.attn.q"] == 2 * 2 * 2 * 10


def test_gptq_needs_calibration_data():
    with pytest.raises(ValueError, match="GPTQ needs calibration batches"):
        quantize(tiny("looped"), QuantConfig(method="gptq"))
    with pytest.raises(ValueError, match="no calibration inputs reached begin.0.attn.q"):
        quantize(tiny("looped"), QuantConfig(method="gptq"), calib=[])


def test_sizes_in_bytes_are_exact():
    """One layer, d 8, d_ff 12, vocab 16, tied: 696 parameters, 152 of them unquantised (embedding
    128, three norms 8 each). Per (out, in) weight at group size 8: out*in*bits/8 packed bytes, one
    2-byte scale per row and group, plus (asymmetric) a bits-wide zero point per row and group."""
    m = build_model(
        {"vocab_size": 16, "d_model": 8, "n_heads": 2, "layers": {"n": 1}, "ffn": {"d_ff": 12}}
    )
    assert model_bytes(m) == 2 * 696
    # q, k, v, o (8, 8): 32 + 16 + 4;  w1, w3 (12, 8): 48 + 24 + 6;  w2 (8, 12): 48 + 32 + 8
    int4 = 4 * 52 + 2 * 78 + 88
    assert model_bytes(m, QuantConfig(bits=4, group_size=8)) == int4 + 2 * 152 == 756
    # symmetric INT8: no zero points;  q, k, v, o: 64 + 16;  w1, w3: 96 + 24;  w2: 96 + 32
    int8 = 4 * 80 + 2 * 120 + 128
    assert (
        model_bytes(m, QuantConfig(bits=8, group_size=8, symmetric=True)) == int8 + 2 * 152 == 992
    )
    untied = build_model(
        {
            "vocab_size": 16,
            "d_model": 8,
            "n_heads": 2,
            "layers": {"n": 1},
            "ffn": {"d_ff": 12},
            "tie_embeddings": False,
        }
    )
    assert (
        model_bytes(untied, QuantConfig(bits=4, group_size=8)) == 756 + 2 * 16 * 8
    )  # head in 16 bits
    _, report = quantize(m, QuantConfig(bits=4, method="rtn", group_size=8))
    assert (report.bytes, report.bytes_bf16) == (756, 1392)


# ---- the claim, on a trained model ------------------------------------------------------------

VOCAB, SEQ = 256, 64
GRAMMAR = torch.randint(0, VOCAB, (VOCAB, 4), generator=torch.Generator().manual_seed(1234))
NEXT_P = torch.tensor([0.55, 0.25, 0.12, 0.08])


def copy_language(n: int, seed: int) -> torch.Tensor:
    """(n, SEQ + 1) tokens of a synthetic language with long-range structure: the first half walks
    a fixed random grammar (each token has 4 successors; 1.13 nats per token), the second half
    repeats the first. A bigram model's perplexity is ~3.5; below 3 the model copies from half a
    sequence back."""
    g = torch.Generator().manual_seed(seed)
    half = torch.empty(n, (SEQ + 2) // 2, dtype=torch.long)
    half[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
    for t in range(1, half.shape[1]):
        pick = torch.multinomial(NEXT_P.expand(n, 4), 1, generator=g).squeeze(1)
        half[:, t] = GRAMMAR[half[:, t - 1], pick]
    return torch.cat([half, half], dim=1)[:, : SEQ + 1]


def perplexity(model, data: torch.Tensor) -> float:
    with torch.no_grad():
        return math.exp(lm_loss(model.eval(), data[:, :-1], data[:, 1:], None).item())


@pytest.fixture(scope="module")
def trained():
    """A 1-1x2-1 looped model trained 400 steps (batch 16, cosine from 1e-2). One thread: two
    threads thrash on a shared two-core machine (~30x slower measured)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        m = build_model(
            {
                "family": "looped",
                "vocab_size": VOCAB,
                "d_model": 64,
                "n_heads": 4,
                "layers": {"begin": 1, "middle": 1, "end": 1},
                "loops": 2,
            }
        )
        steps, lr = 400, 1e-2
        opt = torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda i: min(1, (i + 1) / 20) * 0.5 * (1 + math.cos(math.pi * i / steps))
        )
        step = TrainStep(m, opt, ExecPolicy(precision="fp32", compile=False), torch.device("cpu"))
        for batch in copy_language(16 * steps, seed=1).split(16):
            step(batch[:, :-1], batch[:, 1:])
            sched.step()
        yield m
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_int8_is_lossless_and_int4_rtn_degrades_more_than_gptq(trained):
    """Hyperloop §4 "Post-training quantization", at small scale. Group size 64 (= d_model): per row for most
    layers, three groups (64, 64, 48) for w2's 176 inputs. 64k held-out tokens, so the ordering
    is the quantisation error's and not sampling noise (with 4k tokens it was not stable)."""
    val, calib = copy_language(1024, seed=2), copy_language(64, seed=3)[:, :-1]
    ppl = {"fp32": perplexity(trained, val)}
    for bits in (8, 4):
        for method in ("rtn", "gptq"):
            q, _ = quantize(trained, QuantConfig(bits=bits, method=method, group_size=64), [calib])
            ppl[f"int{bits}-{method}"] = perplexity(q, val)
    assert ppl["fp32"] < 3.0, ppl  # it learned the copy structure
    for method in ("rtn", "gptq"):
        assert abs(ppl[f"int8-{method}"] / ppl["fp32"] - 1) < 0.01, ppl
    assert ppl["int4-rtn"] > 1.003 * ppl["fp32"], ppl
    assert ppl["int4-rtn"] > ppl["int4-gptq"], ppl
