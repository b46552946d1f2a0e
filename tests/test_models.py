"""Model zoo behaviour on real tensors: equivalences between each variant at its simplest
setting and its baseline, Sinkhorn, loop overrides, tracing, and that every family learns."""

import pytest
import torch
import torch.nn.functional as F

from benchmark import FAMILIES, ArchSpec, build_model
from benchmark.models.hyper import normed_linear, sinkhorn
from benchmark.models.layers import RMSNorm

TINY = {"vocab_size": 97, "d_model": 32, "n_heads": 4}
LAYERS = {"begin": 1, "middle": 2, "end": 1}


def tiny(family: str, **over) -> ArchSpec:
    raw = {"family": family, **TINY, **over}
    if family != "transformer" and family not in ("mhc", "hc") and "layers" not in over:
        raw["layers"] = LAYERS
    return ArchSpec.from_dict(raw)


def tokens(batch=2, seq=12, vocab=97, seed=0):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def same_weights(dst, src):
    """Load src's parameters into dst wherever the names and shapes agree; return dst."""
    own = dst.state_dict()
    own.update({k: v for k, v in src.state_dict().items() if k in own and own[k].shape == v.shape})
    dst.load_state_dict(own)
    return dst


def build(spec, seed=0):
    torch.manual_seed(seed)
    return build_model(spec).eval()


ONE_STREAM = {"streams": 1, "mixing": "identity", "loop_embedding": False}


def test_hyperloop_with_one_stream_identity_mixing_and_delta_read_is_looped():
    """y' = y + (F(y) - y) = F(y): the looped model, at the trained and other loop counts."""
    looped = build(tiny("looped", loops=3))
    hyper = tiny("hyperloop", loops=3, hyper={**ONE_STREAM, "read": "delta"})
    hl = same_weights(build(hyper, seed=1), looped)
    x = tokens()
    torch.testing.assert_close(hl(x), looped(x), rtol=0, atol=1e-5)
    torch.testing.assert_close(hl(x, loops=5), looped(x, loops=5), rtol=0, atol=1e-5)


def test_hyperloop_with_one_stream_identity_mixing_and_block_read_is_abbie_d():
    """Hyperloop eq. 3 read literally (F the whole middle block) with one stream, H_res = I and
    H_pre = H_post = 1 is y' = y + F(y): AbbIE-D's eq. 4 from the first iteration."""
    abbie = build(tiny("abbie-d", loops=3))
    hyper = tiny("hyperloop", loops=3, hyper=ONE_STREAM)
    assert hyper.hyper.read == "block"  # the preset's default
    hl = same_weights(build(hyper, seed=1), abbie)
    x = tokens()
    torch.testing.assert_close(hl(x), abbie(x), rtol=0, atol=1e-5)
    torch.testing.assert_close(hl(x, loops=5), abbie(x, loops=5), rtol=0, atol=1e-5)


def test_hyperloop_default_is_not_looped():
    """The equivalence above is not vacuous: the paper's preset computes something else."""
    looped = build(tiny("looped", loops=3))
    hl = same_weights(build(tiny("hyperloop", loops=3), seed=1), looped)
    assert (hl(tokens()) - looped(tokens())).abs().max() > 1e-3


@pytest.mark.parametrize(
    "family, over", [("abbie-c", {}), ("looped", {}), ("abbie-d", {"loop_residual_from": 1})]
)
def test_one_iteration_is_the_transformer_with_the_same_layers(family, over):
    """AbbIE §2.1: r = 1 is the standard Transformer (also at test time via loops=1); for AbbIE-D
    only when its inter-iteration residual starts at the second iteration."""
    std = build(tiny("transformer", layers={"n": 4}))
    rec = build(tiny(family, **over), seed=1)
    # the recurrent model's begin/middle/end are the Transformer's layers 0 / 1-2 / 3
    mapping = {
        "begin.0": "begin.0",
        "middle.0": "begin.1",
        "middle.1": "begin.2",
        "end.0": "begin.3",
    }
    state = rec.state_dict()
    for k in state:
        src = k
        for a, b in mapping.items():
            if k.startswith(a + "."):
                src = b + k[len(a) :]
        state[k] = std.state_dict()[src]
    rec.load_state_dict(state)
    torch.testing.assert_close(rec(tokens(), loops=1), std(tokens()), rtol=0, atol=0)


@pytest.mark.parametrize("first", [0, 1])
def test_abbie_d_adds_the_inter_iteration_residual(first):
    """eq. 4, h_{k+1} = B(h_k) + h_k for k >= loop_residual_from (the preset: 0, as written)."""
    c = build(tiny("abbie-c"))
    d = same_weights(build(tiny("abbie-d", loop_residual_from=first), seed=1), c)
    x = tokens()
    assert (c(x) - d(x)).abs().max() > 1e-4
    emb = d.tok_emb(x)
    rope = d.rotary(x.shape[1], x.device)
    h0 = d.begin[0](emb, rope)
    h1 = d.middle[1](d.middle[0](h0, rope, 0), rope, 0) + (h0 if first == 0 else 0)
    h2 = d.middle[1](d.middle[0](h1, rope, 1), rope, 1) + h1
    torch.testing.assert_close(d(x), d._logits(d.end[0](h2, rope)), rtol=0, atol=1e-6)


def test_abbie_d_preset_follows_eq_4_from_the_first_iteration():
    assert ArchSpec.from_dict({"family": "abbie-d"}).loop_residual_from == 0
    with pytest.raises(ValueError, match="loop_residual_from"):
        ArchSpec.from_dict({"family": "abbie-c", "loop_residual_from": 1})


@pytest.mark.parametrize("streams", [1, 2, 4])
@pytest.mark.parametrize("every", ["sublayer", "layer"])
def test_static_hyper_connections_at_init_are_pre_norm_residuals(streams, every):
    """HC §2.3 (eq. 14): at initialisation static HC equals the Pre-Norm residual network."""
    std = build(tiny("transformer", layers={"n": 4}))
    hc = build(
        tiny("hc", layers={"n": 4}, hyper={"streams": streams, "every": every, "mixing": "static"}),
        seed=1,
    )
    same_weights(hc, std)
    torch.testing.assert_close(hc(tokens()), std(tokens()), rtol=0, atol=1e-5)


@pytest.mark.parametrize("mixing", ["dynamic", "sinkhorn", "diagonal"])
def test_other_mixings_differ_from_the_residual(mixing):
    std = build(tiny("transformer", layers={"n": 4}))
    hc = same_weights(build(tiny("mhc", layers={"n": 4}, hyper={"mixing": mixing}), seed=1), std)
    with torch.no_grad():  # move the dynamic parts off their initial zeros
        for p in hc.hyper.parameters():
            p.add_(0.3 * torch.randn_like(p))
    assert (hc(tokens()) - std(tokens())).abs().max() > 1e-4


def test_dynamic_hc_checkpoints_of_the_transposed_weight_layout_load():
    """ZhuGate once stored W as (d, n + 2); such a checkpoint loads into the (n + 2, d)
    layout as the same model."""
    hc = build(tiny("hc", layers={"n": 2}, hyper={"streams": 2, "mixing": "dynamic"}), seed=1)
    with torch.no_grad():
        for p in hc.hyper.parameters():
            p.add_(0.3 * torch.randn_like(p))
    old = {
        k: (v.t() if k.startswith("hyper.") and k.endswith(".weight") else v)
        for k, v in hc.state_dict().items()
    }
    assert old["hyper.0.weight"].shape == (32, 4)
    fresh = build(tiny("hc", layers={"n": 2}, hyper={"streams": 2, "mixing": "dynamic"}), seed=2)
    fresh.load_state_dict(old)
    torch.testing.assert_close(fresh(tokens()), hc(tokens()), rtol=0, atol=0)


def test_dynamic_hc_without_tanh_is_the_same_model_with_the_dynamic_part_unsquashed():
    """HC Tables 1-2, "W/O tanh": same parameters, same function at init (W = 0), and once W moves,
    each gate's dynamic part is s * norm(H) W where DHC has s * tanh(norm(H) W)."""
    spec = {"layers": {"n": 2}, "hyper": {"streams": 2, "mixing": "dynamic"}}
    dhc = build(tiny("hc", **spec))
    raw = same_weights(
        build(tiny("hc", **{**spec, "hyper": {**spec["hyper"], "tanh": False}}), seed=1), dhc
    )
    assert sum(p.numel() for p in raw.parameters()) == sum(p.numel() for p in dhc.parameters())
    torch.testing.assert_close(raw(tokens()), dhc(tokens()), rtol=0, atol=0)
    with torch.no_grad():
        for p in dhc.hyper.parameters():
            p.add_(0.3 * torch.randn_like(p))
    same_weights(raw, dhc)
    Y = torch.randn(3, 5, 2, 32)
    for g_tanh, g_raw in zip(dhc.hyper, raw.hyper):
        pre = F.rms_norm(Y, (Y.shape[-1],), eps=g_tanh.eps) @ g_tanh.weight.t()
        am, beta, ar = g_raw(Y)
        torch.testing.assert_close(beta, g_raw.scale[1] * pre[..., 0] + g_raw.static_beta)
        torch.testing.assert_close(
            g_tanh(Y)[1], g_tanh.scale[1] * torch.tanh(pre[..., 0]) + g_tanh.static_beta
        )
    assert (raw(tokens()) - dhc(tokens())).abs().max() > 1e-4


def test_hourglass_with_K1_is_a_swiglu_ffn_of_width_dh():
    swi = build(tiny("transformer", ffn={"kind": "swiglu", "d_ff": 24}))
    hg = build(tiny("transformer", ffn={"kind": "hourglass", "K": 1, "d_h": 24}), seed=1)
    assert sum(p.numel() for p in hg.parameters()) == sum(p.numel() for p in swi.parameters())
    same_weights(hg, swi)
    torch.testing.assert_close(hg(tokens()), swi(tokens()), rtol=0, atol=0)


def test_hourglass_sub_blocks_are_residual():
    """eq. 3: h_{i+1} = h_i + MLP_i(h_i), each sub-block with its own norm."""
    m = build(tiny("transformer", ffn={"kind": "hourglass", "K": 3, "d_h": 8}))
    ffn = m.begin[0].ffn
    x = torch.randn(2, 5, 32)
    h = x
    for blk in ffn.blocks:
        h = h + blk.w2(F.silu(blk.w1(blk.norm(h))) * blk.w3(blk.norm(h)))
    torch.testing.assert_close(ffn(x), h)
    assert len({id(b.norm) for b in ffn.blocks}) == 3


@pytest.mark.parametrize("n", [4, 8])
def test_sinkhorn_is_doubly_stochastic(n):
    """mHC's setting: 20 iterations, logits of unit scale (gate logits sit near their bias)."""
    logits = torch.randn(256, n, n, generator=torch.Generator().manual_seed(n))
    m = sinkhorn(logits, 20)
    assert m.dtype == torch.float32 and (m >= 0).all()
    assert (m.sum(-1) - 1).abs().max() < 1e-3
    assert (m.sum(-2) - 1).abs().max() < 1e-3


def test_sinkhorn_matches_the_log_space_iteration_and_stays_finite():
    """The linear-space normalisations are the log-space Sinkhorn's iterates, exponentiated (the
    form lucidrains' and mhc-lite's mHC use), and logits far apart give no NaN or infinity."""
    logits = 2 * torch.randn(64, 4, 4, generator=torch.Generator().manual_seed(0))
    z = logits.clone()
    for _ in range(20):
        z = z - torch.logsumexp(z, dim=-2, keepdim=True)
        z = z - torch.logsumexp(z, dim=-1, keepdim=True)
    assert (sinkhorn(logits, 20) - z.exp()).abs().max() < 1e-6
    assert (
        sinkhorn(logits, 1) - (logits.softmax(-2) / logits.softmax(-2).sum(-1, keepdim=True))
    ).abs().max() < 1e-6
    far = torch.tensor([[0.0, -200.0], [-200.0, 0.0]])
    extreme = sinkhorn(torch.stack([far, 300 * torch.eye(2), -far]), 20)
    assert torch.isfinite(extreme).all()
    assert torch.allclose(extreme[0], torch.eye(2)) and torch.allclose(extreme[2], 1 - torch.eye(2))


def test_gates_divide_by_the_norm_after_projecting():
    """normed_linear, the gates' RMSNorm moved after their projection (mHC §4.3.1), is RMSNorm
    then the projection, computed in float32 also under bf16 autocast (mHC eq. 14-15), for
    float32 and bf16 streams alike: bf16's rounding (0.4% here) stays out of the gates."""
    g = torch.Generator().manual_seed(0)
    x, w = 3 * torch.randn(5, 7, 64, generator=g), torch.randn(24, 64, generator=g)
    exact = F.linear(RMSNorm(64, affine=False)(x), w)
    torch.testing.assert_close(normed_linear(x, w, 1e-5), exact)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = normed_linear(x, w, 1e-5)
        rounded = F.linear(RMSNorm(64, affine=False)(x), w)  # what autocast alone would give
        from_bf16 = normed_linear(x.bfloat16(), w, 1e-5)  # bf16 streams
    assert low.dtype == from_bf16.dtype == torch.float32
    torch.testing.assert_close(low, exact, rtol=1e-5, atol=1e-5)
    assert (rounded.float() - exact).abs().max() > 1e-2  # bf16 is far coarser than this
    torch.testing.assert_close(
        from_bf16, normed_linear(x.bfloat16().float(), w, 1e-5), rtol=1e-5, atol=1e-5
    )


def test_mhc_gates_give_doubly_stochastic_h_res():
    m = build(tiny("mhc", layers={"n": 2}))
    with torch.no_grad():
        for p in m.hyper.parameters():
            p.add_(0.05 * torch.randn_like(p))
    Y = torch.randn(3, 7, 4, 32)
    for gate in m.hyper:
        _, _, res = gate(Y)
        assert res.shape == (3, 7, 4, 4)
        assert (res.sum(-1) - 1).abs().max() < 1e-3 and (res.sum(-2) - 1).abs().max() < 1e-3


def test_sinkhorn_runs_in_float32_under_autocast():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        m = sinkhorn(torch.randn(4, 4, dtype=torch.bfloat16), 20)
    assert m.dtype == torch.float32


def test_lora_starts_as_the_shared_layer_and_then_differs_per_loop():
    looped = build(tiny("looped"))
    lora = same_weights(build(tiny("lora-looped", lora_rank=4), seed=1), looped)
    torch.testing.assert_close(lora(tokens()), looped(tokens()), rtol=0, atol=0)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    assert (lora(tokens()) - looped(tokens())).abs().max() > 1e-4


def test_depth_evaluates_from_the_same_initial_state_on_every_device():
    """The eval-mode h_0 is the CPU generator's draw (seed 0), whatever the model's device."""
    m = build(tiny("depth"))
    e = torch.zeros(3, 12, 32)
    from benchmark.models.lm import DEPTH_STATE_STD

    expected = torch.randn(12, 32, generator=torch.Generator().manual_seed(0)) * DEPTH_STATE_STD
    torch.testing.assert_close(m._depth_state(e), expected.expand(3, 12, 32), rtol=0, atol=0)


def test_depth_is_deterministic_in_eval_and_sees_its_input():
    m = build(tiny("depth"))
    x = tokens()
    torch.testing.assert_close(m(x), m(x), rtol=0, atol=0)
    assert (m(x) - m(tokens(seed=1))).abs().max() > 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_loops_override_changes_compute_for_looped_models(family):
    spec = tiny(family)
    m = build(spec)
    x = tokens()
    base = m(x)
    assert base.shape == (2, 12, 97) and torch.isfinite(base).all()
    if spec.looped:
        assert (m(x, loops=spec.loops + 2) - base).abs().max() > 1e-6


def test_trace_records_every_unrolled_layer():
    m = build(tiny("hyperloop", loops=3))
    trace = []
    m(tokens(), trace=trace)
    names = [n for n, _ in trace]
    assert names[0] == "begin.0" and names[-1] == "end.0"
    assert [n for n in names if n.startswith("hyper")] == ["hyper.1", "hyper.3", "hyper.5"]
    assert dict(trace)["hyper.1"].shape == (2, 12, 4, 32)  # (B, T, n, d)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_overfits_one_batch(family):
    """Loss falls by at least half in 100 steps on one fixed batch (CPU)."""
    torch.manual_seed(0)
    m = build_model(tiny(family)).train()
    x = tokens(batch=4, seq=16, seed=3)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    losses = []
    for _ in range(100):
        loss = F.cross_entropy(m(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])


def test_same_seed_same_model():
    a, b = build(tiny("hyperloop"), seed=7), build(tiny("hyperloop"), seed=7)
    for (n1, p1), (n2, p2) in zip(a.named_parameters(), b.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)


def test_weight_decay_spares_static_hyper_connection_parameters_and_loop_embeddings():
    """HC §4: "The static component ... does not utilize weight decay, whereas the dynamic
    component does"; biases, gating scalars, norms and loop embeddings are not decayed either."""
    from benchmark.recipe import TrainConfig
    from benchmark.trial.training import make_optimizer

    for family in ("hc", "hyperloop", "mhc"):
        m = build(tiny(family))
        decay_group, other = make_optimizer(m, TrainConfig()).param_groups
        assert decay_group["weight_decay"] == 0.1 and other["weight_decay"] == 0.0
        decayed = {id(p) for p in decay_group["params"]}
        names = {n for n, p in m.named_parameters() if id(p) in decayed}
        hyper = {n for n in dict(m.named_parameters()) if n.startswith("hyper.")}
        assert {n for n in hyper if n in names} == {n for n in hyper if n.endswith(".weight")}
        assert "loop_emb" not in names and "tok_emb.weight" in names
        assert not any("norm" in n for n in names)
    static = {
        n
        for n, _ in build(tiny("hc", hyper={"mixing": "static"})).named_parameters()
        if n.startswith("hyper.")
    }
    assert static and all(
        n.split(".")[-1] in ("static_beta", "static_am", "static_ar") for n in static
    )


@pytest.mark.parametrize("n", [1, 4])
def test_hc_scales_the_output_projections_init_by_sqrt_n(n):
    """HC §4: the std of the output modules (attention output, FFN second linear) is scaled by
    sqrt(n); the input projections are not."""
    torch.manual_seed(0)
    big = {"d_model": 256, "n_heads": 4, "layers": {"n": 4}}
    hc = build(ArchSpec.from_dict({"family": "hc", **big, "hyper": {"streams": n}}))
    std = build(ArchSpec.from_dict({**big}))
    for a, b in (
        (hc.begin[0].attn.o, std.begin[0].attn.o),
        (hc.begin[0].ffn.blocks[0].w2, std.begin[0].ffn.blocks[0].w2),
    ):
        assert a.weight.std().item() == pytest.approx(b.weight.std().item() / n**0.5, rel=0.02)
    assert hc.begin[0].attn.q.weight.std().item() == pytest.approx(0.02, rel=0.02)


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_home_initialisation_reads_a_mean_and_writes_a_mean_of_one(n):
    """At initialisation H_pre sums to 1 and H_post averages 1 (the streams' mean follows the
    plain model), with the home stream k mod n read and written twice as strongly."""
    from benchmark.models.hyper import SigmoidGate

    for index in range(3):
        pre, post, _ = SigmoidGate(8, n, "diagonal", index=index)(torch.randn(2, 3, n, 8))
        assert pre.sum(-1).sub(1).abs().max() < 1e-6 and post.mean(-1).sub(1).abs().max() < 1e-6
        if n > 1:
            home = index % n
            others = [i for i in range(n) if i != home]
            torch.testing.assert_close(pre[..., home], 2 * pre[..., others[0]])
            torch.testing.assert_close(post[..., home], 2 * post[..., others[-1]])


def test_read_block_needs_whole_layer_spans():
    with pytest.raises(ValueError, match="hyper.read"):
        ArchSpec.from_dict({"family": "mhc", "hyper": {"read": "block"}})
    with pytest.raises(ValueError, match="hyper.init: 'zero' is not one of home, symmetric"):
        ArchSpec.from_dict({"family": "mhc", "hyper": {"init": "zero"}})


@pytest.mark.parametrize("family", ["hyperloop", "mhc", "hc"])
def test_the_streams_stay_float32_under_bf16_autocast(monkeypatch, family):
    """The n streams are the residual stream: under bf16 autocast they are read (u), gated and
    mixed in float32, as the Transformer's residual stays float32. Before, autocast turned the
    (1 x n) @ (n x d) read into a bf16 matmul, so Hyperloop's whole middle block (the block read)
    ran with a bf16 residual (seen on an H100 as bf16 input reaching RMSNorm's float32 weight)."""
    import benchmark.models.lm as lm
    from benchmark.models.hyper import hyper_connect

    seen = []

    def spy(gate, Y, span, extra=None):
        def reading(u):
            seen.append(("u", u.dtype))
            return span(u)

        out = hyper_connect(gate, Y, reading, extra)
        seen.append(("out", out.dtype))
        return out

    monkeypatch.setattr(lm, "hyper_connect", spy)
    model = build(tiny(family))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens())
    assert seen and {dtype for _, dtype in seen} == {torch.float32}
    assert torch.isfinite(logits.float()).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_keeps_its_residual_stream_float32_under_bf16_autocast(family):
    """Every norm of every family (each block's pre-norms and the final norm, all of them norms of
    the residual stream or of the hyper-connections' read u) receives float32 under bf16 autocast,
    as the Transformer's do: a family whose stream fell to bf16 would train at another precision
    than its baseline, and on a GPU its norms would take their slow unfused path. Depth's
    injection h = B(W [e; h]) is a linear layer, which autocast runs in bf16: before, its output
    became the middle and end blocks' residual stream (seen on an H100 as rms_norm's "Mismatch
    dtype between input and weight" warning)."""
    model = build(tiny(family))
    norms = {name: mod for name, mod in model.named_modules() if isinstance(mod, RMSNorm)}
    seen = {}
    for name, mod in norms.items():
        mod.register_forward_pre_hook(
            lambda mod, args, name=name: seen.setdefault(name, set()).add(args[0].dtype)
        )
    for training in (True, False):  # Depth draws its initial state differently in each
        model.train(training)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(tokens())
    assert seen.keys() == norms.keys()  # every norm ran
    assert {name: dtypes for name, dtypes in seen.items() if dtypes != {torch.float32}} == {}


@pytest.mark.parametrize("mixing", ["diagonal", "full"])
def test_the_compiled_write_has_the_true_gradients(mixing):
    """StreamWrite (what compiled code runs for Y' = H_res Y + H_post ⊗ out) writes its gradients
    out by hand: gradcheck proves them against finite differences, and its values equal the eager
    write's."""
    from benchmark.models.hyper import Connection, StreamWrite

    g = torch.Generator().manual_seed(0)
    B, T, n, d = 2, 3, 4, 5
    Y, out, post = (
        torch.randn(*s, generator=g, dtype=torch.float64)
        for s in ((B, T, n, d), (B, T, d), (B, T, n))
    )
    res = torch.randn(
        B, T, n, *((n,) if mixing == "full" else ()), generator=g, dtype=torch.float64
    )
    args = [t.requires_grad_() for t in (Y, out, post, res)]
    assert torch.autograd.gradcheck(StreamWrite.apply, args)
    torch.testing.assert_close(
        StreamWrite.apply(*args), Connection().write(Y, out, post, res), rtol=0, atol=1e-12
    )
