"""The hyper-connection Triton kernels (benchmark/models/kernels/hc.py) against models/hyper.py's
PyTorch path, forward and gradients, run on the CPU by Triton's interpreter; and that a CPU
model never takes the Triton path.

The interpreter must be on before triton itself is imported (triton 3.9 decorates its own
library, tl.sum and the like, when triton.language is imported, reading TRITON_INTERPRET then),
and the rest of the suite must run without it: so test_kernels_under_the_interpreter runs this
file again in a subprocess with TRITON_INTERPRET=1, where the `kernel` tests run. On a machine
with a GPU that triton compiles for, the `kernel` tests also run in the suite itself, compiled, on
CUDA tensors.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from benchmark import ArchSpec, build_model  # noqa: E402
from benchmark.models import hyper, kernels  # noqa: E402
from benchmark.models.kernels import hc  # noqa: E402
from benchmark.models.kernels import sinkhorn as sk  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
interpreted = pytest.mark.skipif(
    not INTERPRETED, reason="runs in test_kernels_under_the_interpreter's subprocess"
)
ON_GPU = not INTERPRETED and torch.cuda.is_available() and kernels.available()
kernel = pytest.mark.skipif(
    not (INTERPRETED or ON_GPU),
    reason="runs in test_kernels_under_the_interpreter's subprocess, or here on a GPU",
)
DEVICE = torch.device("cuda" if ON_GPU else "cpu")


def test_kernels_under_the_interpreter():
    if INTERPRETED:
        pytest.skip("this is the subprocess")
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "interpreted or matches_pytorch",
            str(Path(__file__).resolve()),
        ],
        cwd=root,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " skipped" not in run.stdout.splitlines()[-1], run.stdout[
        -2000:
    ]  # every kernel test ran


@interpreted
def test_kernels_are_interpreted():
    assert type(hc._read_fwd).__name__ == "InterpretedFunction"


TINY = {"vocab_size": 61, "d_model": 16, "n_heads": 2}
# fp32 sums in another order; bf16 outputs: one bf16 rounding of the same fp32 value (2^-8 relative)
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=8e-3, atol=8e-3)}
# Compiled for a GPU, tl.dot multiplies fp32 in tf32 (mHC §4.3.1 computes phi in tf32; 10-bit
# mantissas, 2^-11 relative per product): the normed projection and what reads it are held to that.
DOT_TOL = dict(rtol=5e-3, atol=5e-3) if ON_GPU else TOL[torch.float32]


def rand(*shape, seed=0, dtype=torch.float32):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)
    return x.requires_grad_()


def grads(fn, inputs, seed=9):
    """fn(*inputs) and the gradients of <fn(*inputs), a fixed random tensor> to every input."""
    out = fn(*inputs)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.device)
    gs = torch.autograd.grad((out.float() * probe).sum(), inputs)
    return out, gs


def check(fused, plain, inputs, dtype=torch.float32, tol=None):
    (a, ga), (b, gb) = grads(fused, inputs), grads(plain, inputs)
    assert a.dtype == b.dtype
    torch.testing.assert_close(a.float(), b.float(), **(tol or TOL[dtype]))
    for x, y in zip(ga, gb):
        assert x.dtype == y.dtype
        torch.testing.assert_close(x.float(), y.float(), **(tol or TOL[dtype]))


@kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [3, 4])
def test_read_matches_pytorch(n, dtype):
    Y, pre = rand(2, 3, n, 20, dtype=dtype), rand(2, 3, n, seed=1)

    def plain(Y, pre):
        return (pre.unsqueeze(-1) * Y).sum(-2)

    check(hc.read, plain, (Y, pre), dtype)
    # the read sums bf16 streams in fp32 and returns fp32 (u is the span's fp32 residual)
    assert hc.read(Y, pre).dtype == torch.float32 and hyper.weigh(pre, Y).dtype == torch.float32


def _write_inputs(kind: str, n: int, dtype):
    Y, out, post = rand(2, 3, n, 20, dtype=dtype), rand(2, 3, 20, seed=1), rand(2, 3, n, seed=2)
    res = {
        "none": None,
        "diagonal": rand(2, 3, n, seed=3),
        "full": rand(2, 3, n, n, seed=3),
        "static": rand(n, n, seed=3),
    }[kind]  # static: HC's one matrix for every token
    return Y, out, post, res


@kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["none", "diagonal", "full", "static"])
def test_write_matches_pytorch(kind, dtype):
    n = 3
    Y, out, post, res = _write_inputs(kind, n, dtype)
    gate = hyper.Connection()
    gate.stream_dtype = "bf16" if dtype == torch.bfloat16 else "fp32"
    inputs = (Y, out, post) if res is None else (Y, out, post, res)

    def plain(Y, out, post, res=None):
        return gate.write(Y, out, post, res)

    def fused(Y, out, post, res=None):
        return hc.write(Y, out, post, res, dtype)

    check(fused, plain, inputs, dtype)
    assert fused(*inputs).dtype == dtype


@kernel
@pytest.mark.parametrize("n", [3, 4])
def test_sinkhorn_matches_pytorch(n):
    # logits off the uniform point, so that the iterates (and their gradients) differ per step
    logits = (3 * rand(5, n, n).detach()).requires_grad_()
    check(
        lambda x: sk.sinkhorn(x, 4, hyper.SINKHORN_FLOOR), lambda x: hyper.sinkhorn(x, 4), (logits,)
    )
    m = sk.sinkhorn(logits.detach(), 20, hyper.SINKHORN_FLOOR)
    torch.testing.assert_close(m.sum(-1), torch.ones(5, n, device=m.device), atol=1e-5, rtol=0)


@kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "rows,K,N", [(37, 40, 5), (20, 48, 24)]
)  # HC's (n + 2) per stream; mHC's 2n + n²
def test_normed_linear_matches_pytorch(rows, K, N, dtype):
    x, w = rand(rows, K, dtype=dtype), rand(N, K, seed=1)
    # against bf16 x cast to fp32: the kernel projects in fp32 (tf32 on a GPU), where PyTorch
    # under autocast projects in bf16
    check(
        lambda x, w: hc.normed_linear(x, w, 1e-5),
        lambda x, w: hyper.normed_linear(x.float(), w, 1e-5),
        (x, w),
        dtype,
        tol=DOT_TOL if dtype == torch.float32 else None,
    )


@kernel
@pytest.mark.parametrize("family", ["mhc", "hc", "hyperloop"])
def test_model_through_the_kernels_matches_pytorch(family, monkeypatch):
    """The whole hyper path of a tiny model (gates, Sinkhorn, reads, writes) on the kernels: the
    same loss and parameter gradients as on the PyTorch path."""
    layers = (
        {"layers": {"begin": 0, "middle": 1, "end": 0}, "loops": 2}
        if family == "hyperloop"
        else {"layers": 1}
    )
    spec = ArchSpec.from_dict({"family": family, **TINY, **layers, "hyper": {"sinkhorn_iters": 2}})
    torch.manual_seed(0)
    model = build_model(spec)
    with (
        torch.no_grad()
    ):  # gates away from their zero initialisation, so that every path carries gradient
        for gate in model.hyper:
            for p in gate.parameters():
                p.add_(0.1 * torch.randn(p.shape))
    model.to(DEVICE)
    idx = torch.randint(
        0, TINY["vocab_size"], (1, 3), generator=torch.Generator().manual_seed(1)
    ).to(DEVICE)

    def loss_and_grads():
        model.zero_grad()
        loss = model(idx).logsumexp(-1).mean()
        loss.backward()
        return loss.detach(), {
            k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None
        }

    monkeypatch.setattr(hyper, "fused", lambda t: False)
    plain_loss, plain = loss_and_grads()
    monkeypatch.setattr(hyper, "fused", lambda t: True)
    fused_loss, fused = loss_and_grads()
    torch.testing.assert_close(fused_loss, plain_loss, **DOT_TOL)
    assert plain.keys() == fused.keys()
    for k in plain:
        torch.testing.assert_close(
            fused[k], plain[k], **(DOT_TOL if ON_GPU else dict(rtol=1e-4, atol=1e-5)), msg=k
        )


def test_cpu_tensors_never_take_the_triton_path(monkeypatch):
    """Outside the interpreter's tests, a CPU model runs the PyTorch code: every kernel entry
    raises here, and a forward and backward of each hyper family still runs."""

    def refuse(*args, **kwargs):
        raise AssertionError("a Triton kernel was called on CPU tensors")

    for module, name in ((hc, "read"), (hc, "write"), (sk, "sinkhorn"), (hc, "normed_linear")):
        monkeypatch.setattr(module, name, refuse)
    for family in ("mhc", "hc", "hyperloop"):
        layers = (
            {"layers": {"begin": 1, "middle": 1, "end": 1}}
            if family == "hyperloop"
            else {"layers": 1}
        )
        model = build_model(ArchSpec.from_dict({"family": family, **TINY, **layers}))
        model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()


def test_cuda_tensors_take_the_kernels_only_when_asked(monkeypatch):
    """On a GPU the PyTorch path (compiled) is the default: the kernels ran slower there; a
    user asks for them with SHAPEBENCH_HC_KERNELS=triton, and a misspelt value is refused."""

    class Cuda:
        is_cuda = True

    monkeypatch.setattr(kernels, "available", lambda: True)
    monkeypatch.delenv(kernels.ENV, raising=False)
    assert not hyper.fused(Cuda())
    monkeypatch.setenv(kernels.ENV, "triton")
    assert hyper.fused(Cuda())
    assert not hyper.fused(torch.zeros(1))  # a CPU tensor never
    monkeypatch.setenv(kernels.ENV, "torch")
    assert not hyper.fused(Cuda())
    monkeypatch.setenv(kernels.ENV, "trition")
    with pytest.raises(
        ValueError, match="SHAPEBENCH_HC_KERNELS='trition': expected triton or torch"
    ):
        hyper.fused(Cuda())


def test_stream_dtype_resolution():
    """`auto` is bf16 streams only under bf16 autocast on CUDA; the row records what was used."""
    assert hyper.resolve_stream_dtype("auto", "cuda", torch.bfloat16) == torch.bfloat16
    assert hyper.resolve_stream_dtype("auto", "cuda", None) == torch.float32
    assert hyper.resolve_stream_dtype("auto", "cpu", torch.bfloat16) == torch.float32
    assert hyper.resolve_stream_dtype("bf16", "cpu", None) == torch.bfloat16
    mhc = ArchSpec.from_dict({"family": "mhc"})
    assert mhc.hyper.stream_dtype == "auto"
    assert hyper.stream_record(mhc.hyper, "cuda", "bf16") == {"stream_dtype": "bf16"}
    assert hyper.stream_record(mhc.hyper, "cuda", "fp32+tf32") == {"stream_dtype": "fp32"}
    assert hyper.stream_record(mhc.hyper, "cpu", "bf16") == {"stream_dtype": "fp32"}
    assert hyper.stream_record(None, "cuda", "bf16") == {}
    with pytest.raises(ValueError, match="stream_dtype"):
        ArchSpec.from_dict({"family": "mhc", "hyper": {"stream_dtype": "fp16"}})


def test_bf16_streams_on_cpu_store_bf16_and_train():
    """stream_dtype: bf16 on the PyTorch path (on a CPU, where `auto` keeps fp32): streams stored
    in bf16 after the first write, and the loss close to the fp32 streams' at initialisation."""
    losses = {}
    for setting in ("fp32", "bf16"):
        spec = ArchSpec.from_dict(
            {"family": "mhc", **TINY, "layers": 1, "hyper": {"stream_dtype": setting}}
        )
        torch.manual_seed(0)
        model = build_model(spec)
        trace = []
        with torch.autocast("cpu", dtype=torch.bfloat16):  # as a bf16 trial runs
            logits = model(torch.arange(6).reshape(1, 6), trace=trace)
        streams = [x for name, x in trace if name.startswith("hyper.")]
        assert streams[-1].dtype == (torch.bfloat16 if setting == "bf16" else torch.float32)
        losses[setting] = logits.float().logsumexp(-1).mean()
        losses[setting].backward()
    torch.testing.assert_close(losses["bf16"], losses["fp32"], rtol=2e-3, atol=2e-3)
