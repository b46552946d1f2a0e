"""Hyper-connections (Zhu et al.) against the public reference implementation at matched weights:
lucidrains' `hyper-connections` package (`HyperConnections`, its Algorithm 2 of HC App. J).

Its parameters map one to one onto our ZhuGate: static_alpha = [A_m | A_r], dynamic_alpha_fn =
[W_m | W_r] (ours stores its transpose, the rows of W), dynamic_beta_fn = W_β, and the two scales s_α, s_β. Its streams are laid out as
(batch x streams, ..., d). Its gate norm is x / ||x|| sqrt(d) (eps 1e-12 on the norm), ours RMSNorm
with eps 1e-5: the test sets our epsilon to 0 so that the norms are the same function.

mHC's Sinkhorn-Knopp (mHC eq. 9) against the same package's `sinkhorn_knopps`, its mHC module's
H_res constraint. Its gates themselves are not the paper's (each stream's own features give that
stream's row, where mHC eq. 7 projects the flattened n x C streams), so only the projection onto
doubly stochastic matrices is compared.
"""

import pytest
import torch

from benchmark.models.hyper import ZhuGate, hyper_connect, sinkhorn

hc_ref = pytest.importorskip("hyper_connections")  # pinned in the dev extra; CI has it

D, B, T = 16, 2, 5


def branch_fn():
    """A sublayer stand-in: a fixed nonlinear map d -> d."""
    g = torch.Generator().manual_seed(7)
    w1 = torch.randn(D, 2 * D, generator=g, dtype=torch.float64) / D**0.5
    w2 = torch.randn(2 * D, D, generator=g, dtype=torch.float64) / D**0.5
    return lambda x: torch.tanh(x @ w1) @ w2


def pair(n: int, index: int, dynamic: bool, tanh: bool, perturb: bool):
    """(ours, theirs) with the same weights; `perturb` moves every parameter off its initial value."""
    ref = hc_ref.HyperConnections(n, dim=D, layer_index=index, tanh=tanh).double()
    ours = ZhuGate(D, n, index, dynamic=dynamic, tanh=tanh).double()
    if dynamic:
        ours.eps = 0.0
    if perturb:
        g = torch.Generator().manual_seed(index + 10 * n)
        with torch.no_grad():
            for name, p in ref.named_parameters():
                if name != "norm.gamma":  # our gate norm has no gain (HC App. B: |θ_norm| = 0)
                    p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            if not dynamic:  # static HC: the reference's dynamic parts must be exactly zero
                ref.dynamic_alpha_fn.zero_()
                ref.dynamic_beta_fn.zero_()
    with torch.no_grad():
        ours.static_am.copy_(ref.static_alpha[:, 0])
        ours.static_ar.copy_(ref.static_alpha[:, 1:])
        ours.static_beta.copy_(ref.static_beta)
        if dynamic:
            ours.weight[0].copy_(ref.dynamic_beta_fn)
            ours.weight[1:].copy_(ref.dynamic_alpha_fn.t())
            ours.scale.copy_(torch.stack([ref.dynamic_alpha_scale, ref.dynamic_beta_scale]))
    return ours, ref


def run_both(ours, ref, n: int):
    Y = torch.randn(B, T, n, D, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    Y_ours, Y_ref = Y.clone().requires_grad_(), Y.clone().requires_grad_()
    f = branch_fn()
    out_ours = hyper_connect(ours, Y_ours, f)  # (B, T, n, D)
    flat = Y_ref.permute(0, 2, 1, 3).reshape(B * n, T, D)  # '(b s) t d'
    branch_in, add_residual = ref(flat)
    out_ref = add_residual(f(branch_in)).reshape(B, n, T, D).permute(0, 2, 1, 3)
    return (Y_ours, out_ours), (Y_ref, out_ref)


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("index", [0, 3])
def test_fresh_initialisation_is_the_reference_one(n, index):
    """HC eq. 14 (A_m = e_(k mod n), A_r = I, B = 1, W = 0, s = 0.01) as the reference builds it
    for layer_index k."""
    fresh, ref = (
        ZhuGate(D, n, index, dynamic=True),
        hc_ref.HyperConnections(n, dim=D, layer_index=index),
    )
    torch.testing.assert_close(fresh.static_am, ref.static_alpha[:, 0], rtol=0, atol=0)
    torch.testing.assert_close(fresh.static_ar, ref.static_alpha[:, 1:], rtol=0, atol=0)
    torch.testing.assert_close(fresh.static_beta, ref.static_beta, rtol=0, atol=0)
    assert (
        not fresh.weight.any() and not ref.dynamic_alpha_fn.any() and not ref.dynamic_beta_fn.any()
    )
    torch.testing.assert_close(
        fresh.scale, torch.stack([ref.dynamic_alpha_scale, ref.dynamic_beta_scale])
    )


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("mixing", ["static", "dynamic", "dynamic w/o tanh"])
def test_one_connection_matches_the_reference_with_gradients(n, mixing):
    """Outputs, input gradients and every parameter gradient agree at matched (perturbed) weights."""
    dynamic, tanh = mixing != "static", mixing != "dynamic w/o tanh"
    ours, ref = pair(n, index=1, dynamic=dynamic, tanh=tanh, perturb=True)
    (Y_o, out_o), (Y_r, out_r) = run_both(ours, ref, n)
    torch.testing.assert_close(out_o, out_r, rtol=0, atol=1e-12)
    assert (out_o - Y_o).abs().max() > 1e-2  # the connection did something
    w = torch.randn(out_o.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (out_o * w).sum().backward()
    (out_r * w).sum().backward()
    torch.testing.assert_close(Y_o.grad, Y_r.grad, rtol=0, atol=1e-12)
    grads = {
        "static_am": ref.static_alpha.grad[:, 0],
        "static_ar": ref.static_alpha.grad[:, 1:],
        "static_beta": ref.static_beta.grad,
    }
    if dynamic:
        grads["weight"] = torch.cat([ref.dynamic_beta_fn.grad[None], ref.dynamic_alpha_fn.grad.t()])
        grads["scale"] = torch.stack([ref.dynamic_alpha_scale.grad, ref.dynamic_beta_scale.grad])
    for name, expected in grads.items():
        torch.testing.assert_close(getattr(ours, name).grad, expected, rtol=0, atol=1e-12, msg=name)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("iters", [1, 3, 20])
def test_sinkhorn_matches_the_reference_with_gradients(n, iters):
    """Same iterates and the same gradients as the reference's sinkhorn_knopps (column then row
    normalisation, `iters` times, after exp), from logits spread over ±3 (float32, as both run)."""
    from hyper_connections.manifold_constrained_hyper_connections import sinkhorn_knopps

    logits = 3 * torch.randn(B, T, n, n, generator=torch.Generator().manual_seed(n * iters))
    ours_in, ref_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    ours, ref = sinkhorn(ours_in, iters), sinkhorn_knopps(ref_in, iters)
    torch.testing.assert_close(ours, ref, rtol=0, atol=2e-6)
    assert (ours - torch.softmax(logits, -2)).abs().max() > 1e-2  # the row normalisations acted
    w = torch.randn(ours.shape, generator=torch.Generator().manual_seed(1))
    (ours * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(ours_in.grad, ref_in.grad, rtol=0, atol=1e-5)
