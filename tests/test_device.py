"""The device path on the CPU (issue 17): what a trial does on a GPU must not depend on tensors the
CPU made being used where the model lives, the precision rule must not count emulated bf16, and a
trial's peak memory is its own.

The model is put on the `meta` device to stand in for CUDA: any CPU tensor that reaches it
unmoved raises, as it would on a GPU ("Expected all tensors to be on the same device")."""

import pytest
import torch

from benchmark import ArchSpec
from benchmark.models import build_model
from benchmark.trial import step
from benchmark.trial.quant import QuantConfig, collect_hessians, quantizable
from benchmark.trial.training import peak_memory_bytes, reset_peak_memory

SPEC = {"family": "looped", "d_model": 32, "n_heads": 2, "vocab_size": 64,
        "layers": {"begin": 1, "middle": 1, "end": 1}, "loops": 2}


def test_gptq_calibration_batches_from_the_cpu_reach_a_model_on_another_device():
    model = build_model(ArchSpec.from_dict(SPEC)).to("meta").eval()
    calib = [torch.randint(0, 64, (2, 16)) for _ in range(2)]           # the CPU batch builder's
    hessians = collect_hessians(model, quantizable(model), calib)
    assert hessians and all(h.H.device.type == "meta" for h in hessians.values())
    assert all(h.rows == 2 * 2 * 16 * (2 if "middle" in name else 1) for name, h in hessians.items())


def test_the_same_calibration_on_the_cpu_is_unchanged():
    torch.manual_seed(0)
    model = build_model(ArchSpec.from_dict(SPEC)).eval()
    calib = [torch.randint(0, 64, (2, 16)) for _ in range(2)]
    from benchmark.trial.quant import quantize

    qmodel, report = quantize(model, QuantConfig(bits=4, method="gptq", group_size=16), calib)
    assert report.calib_rows and all(r > 0 for r in report.calib_rows.values())
    changed = [n for n, p in quantizable(qmodel).items() if not torch.equal(p.weight, quantizable(model)[n].weight)]
    assert changed  # INT4 moved the weights


@pytest.mark.parametrize("capability, native", [((7, 0), False), ((7, 5), False), ((8, 0), True), ((9, 0), True)])
def test_bf16_autocast_only_where_the_gpu_has_bf16_tensor_cores(monkeypatch, capability, native):
    """V100 (7.0) and T4 (7.5) emulate bf16: `auto` keeps fp32 (with TF32 where it exists) there."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # counts emulation
    cuda = torch.device("cuda")
    assert step.bf16_supported(cuda) is native
    dtype = step.ExecPolicy(precision="auto").autocast_dtype(cuda)
    assert dtype == (torch.bfloat16 if native else None)
    assert step.precision_name(dtype, cuda) == ("bf16" if native else "fp32+tf32")
    assert step.precision_name(None, torch.device("cpu")) == "fp32"


def test_a_trials_peak_memory_is_its_own():
    """A reused worker: the peak of an earlier, larger trial must not be reported again."""
    reset_peak_memory(torch.device("cpu"))
    big = torch.ones(64 * 2**20 // 4 * 4)  # 256 MB, touched
    big += 1
    first = peak_memory_bytes(torch.device("cpu"))
    del big
    reset_peak_memory(torch.device("cpu"))
    second = peak_memory_bytes(torch.device("cpu"))
    assert first - second > 200 * 2**20


def test_k_micro_batches_give_the_update_of_one_batch_k_times_larger():
    """Gradient accumulation (training.grad_accum): the same gradient, so the same update, to
    float tolerance. Plain SGD makes the update the gradient itself (Adam's first step would hide
    a wrong scale)."""
    from benchmark.trial.step import ExecPolicy, TrainStep

    torch.manual_seed(0)
    x = torch.randint(0, 64, (8, 17))
    after = []
    for k in (1, 4):
        torch.manual_seed(1)
        model = build_model(ArchSpec.from_dict(SPEC))
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        fn = TrainStep(model, opt, ExecPolicy(precision="fp32", compile=False), torch.device("cpu"), clip=1.0)
        micro = [(c[:, :-1], c[:, 1:]) for c in x.chunk(k)]
        loss = fn.accumulate(micro)
        after.append((loss.item(), [p.detach().clone() for p in model.parameters()]))
    (loss1, p1), (loss4, p4) = after
    assert loss4 == pytest.approx(loss1, rel=1e-6)
    assert max((a - b).abs().max().item() for a, b in zip(p1, p4)) < 1e-6
    torch.manual_seed(1)
    before = [p.detach() for p in build_model(ArchSpec.from_dict(SPEC)).parameters()]
    assert max((a - b).abs().max().item() for a, b in zip(p1, before)) > 1e-3  # the step moved the weights


def test_tokens_per_step_counts_the_micro_batches():
    from benchmark.trial.config import TrainConfig

    cfg = TrainConfig(tokens="1M", seq_len=2048, batch_size=16, grad_accum=16)
    assert cfg.tokens_per_step == 524_288  # Hyperloop App. A: 256 x 2048 tokens per batch
    assert cfg.steps({"total": 1}) == 2    # ceil(1M / 524,288)


def test_rope_tables_are_made_once_per_length_and_device():
    from benchmark.models.layers import Rotary

    rope = Rotary(16, 10_000.0)
    cos, sin = rope(32, torch.device("cpu"))
    again = rope(32, torch.device("cpu"))
    assert again[0] is cos and again[1] is sin                      # reused, not recomputed
    assert torch.equal(cos, rope.compute(32, torch.device("cpu"))[0])
    assert rope(48, torch.device("cpu"))[0].shape == (48, 16)        # another length, its own table
    with torch.inference_mode():                                       # never cached from there
        assert rope(64, torch.device("cpu"))[0] is not rope(64, torch.device("cpu"))[0]
