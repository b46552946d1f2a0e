"""The device path on the CPU: what a trial does on a GPU must not depend on tensors the
CPU made being used where the model lives, the precision rule must not count emulated bf16, and a
trial's peak memory is its own.

Two stand-ins for CUDA: the `meta` device for single functions (any CPU tensor that reaches the
model unmoved raises, as on a GPU), and tests/fake_cuda.py for a whole trial, which needs real
values: CPU tensors that say they are on cuda:0, and CUDA's "Expected all tensors to be on the
same device" for any op that mixes them with host tensors."""

import json
import math
from collections import Counter

import pytest
import torch

from benchmark import ArchSpec
from benchmark.models import build_model
from benchmark.trial import policy
from benchmark.trial.memory import peak_memory_bytes, reset_peak_memory
from benchmark.trial.quant import QuantConfig, collect_hessians, quantizable

SPEC = {
    "family": "looped",
    "d_model": 32,
    "n_heads": 2,
    "vocab_size": 64,
    "layers": {"begin": 1, "middle": 1, "end": 1},
    "loops": 2,
}


def test_gptq_calibration_batches_from_the_cpu_reach_a_model_on_another_device():
    model = build_model(ArchSpec.from_dict(SPEC)).to("meta").eval()
    calib = [torch.randint(0, 64, (2, 16)) for _ in range(2)]  # the CPU batch builder's
    hessians = collect_hessians(model, quantizable(model), calib)
    assert hessians and all(h.H.device.type == "meta" for h in hessians.values())
    assert all(
        h.rows == 2 * 2 * 16 * (2 if "middle" in name else 1) for name, h in hessians.items()
    )


def test_the_same_calibration_on_the_cpu_is_unchanged():
    torch.manual_seed(0)
    model = build_model(ArchSpec.from_dict(SPEC)).eval()
    calib = [torch.randint(0, 64, (2, 16)) for _ in range(2)]
    from benchmark.trial.quant import quantize

    qmodel, report = quantize(model, QuantConfig(bits=4, method="gptq", group_size=16), calib)
    assert report.calib_rows and all(r > 0 for r in report.calib_rows.values())
    changed = [
        n
        for n, p in quantizable(qmodel).items()
        if not torch.equal(p.weight, quantizable(model)[n].weight)
    ]
    assert changed  # INT4 moved the weights


@pytest.mark.parametrize(
    "capability, native", [((7, 0), False), ((7, 5), False), ((8, 0), True), ((9, 0), True)]
)
def test_bf16_autocast_only_where_the_gpu_has_bf16_tensor_cores(monkeypatch, capability, native):
    """V100 (7.0) and T4 (7.5) emulate bf16: `auto` keeps fp32 (with TF32 where it exists) there."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # counts emulation
    cuda = torch.device("cuda")
    assert policy.bf16_supported(cuda) is native
    dtype = policy.ExecPolicy(precision="auto").autocast_dtype(cuda)
    assert dtype == (torch.bfloat16 if native else None)
    assert policy.precision_name(dtype, cuda) == ("bf16" if native else "fp32+tf32")
    assert policy.precision_name(None, torch.device("cpu")) == "fp32"


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
    from benchmark.trial.policy import ExecPolicy
    from benchmark.trial.step import TrainStep

    torch.manual_seed(0)
    x = torch.randint(0, 64, (8, 17))
    after = []
    for k in (1, 4):
        torch.manual_seed(1)
        model = build_model(ArchSpec.from_dict(SPEC))
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        fn = TrainStep(
            model, opt, ExecPolicy(precision="fp32", compile=False), torch.device("cpu"), clip=1.0
        )
        micro = [(c[:, :-1], c[:, 1:]) for c in x.chunk(k)]
        loss = fn.accumulate(micro)
        after.append((loss.item(), [p.detach().clone() for p in model.parameters()]))
    (loss1, p1), (loss4, p4) = after
    assert loss4 == pytest.approx(loss1, rel=1e-6)
    assert max((a - b).abs().max().item() for a, b in zip(p1, p4)) < 1e-6
    torch.manual_seed(1)
    before = [p.detach() for p in build_model(ArchSpec.from_dict(SPEC)).parameters()]
    assert (
        max((a - b).abs().max().item() for a, b in zip(p1, before)) > 1e-3
    )  # the step moved the weights


def test_tokens_per_step_counts_the_micro_batches():
    from benchmark.recipe import TrainConfig

    cfg = TrainConfig(tokens="1M", seq_len=2048, batch_size=16, grad_accum=16)
    assert cfg.tokens_per_step == 524_288  # Hyperloop App. A: 256 x 2048 tokens per batch
    assert cfg.steps({"total": 1}) == 2  # ceil(1M / 524,288)


def test_rope_tables_are_made_once_per_length_and_device():
    from benchmark.models.layers import Rotary

    rope = Rotary(16, 10_000.0)
    cos, sin = rope(32, torch.device("cpu"))
    again = rope(32, torch.device("cpu"))
    assert again[0] is cos and again[1] is sin  # reused, not recomputed
    assert torch.equal(cos, rope.compute(32, torch.device("cpu"))[0])
    assert rope(48, torch.device("cpu"))[0].shape == (48, 16)  # another length, its own table
    with torch.inference_mode():  # never cached from there
        assert rope(64, torch.device("cpu"))[0] is not rope(64, torch.device("cpu"))[0]


# ---- a whole trial on a CUDA device that is the CPU (tests/fake_cuda.py) -------------------------

# fp32 streams: under bf16 on a GPU `auto` stores them in bf16 (hyper.stream_dtype), and this test
# checks that the device alone changes no number.
HYPERLOOP = {
    "family": "hyperloop",
    "d_model": 32,
    "n_heads": 2,
    "vocab_size": 300,
    "hyper": {"streams": 2, "stream_dtype": "fp32"},
    "layers": {"begin": 1, "middle": 1, "end": 1},
    "loops": 2,
    "eval_loops": [1, 2],
}


def test_the_fake_cuda_device_refuses_what_a_gpu_refuses(monkeypatch):
    """The stand-in the whole-trial test relies on: tensors say cuda:0; host tensors of one or more
    dimensions, and host 0-dim tensors in ops outside TensorIterator, are refused next to them;
    host reads are recorded; a module and its deep copy stay on the device."""
    import copy

    from fake_cuda import MIXED, fake_cuda

    with fake_cuda(monkeypatch) as gpu:
        x, host = torch.ones(3, device="cuda"), torch.ones(3)
        assert x.device == torch.device("cuda", 0) and x.is_cuda and host.device.type == "cpu"
        assert (x + torch.tensor(2.0)).device.type == "cuda"  # a host scalar is fine
        assert x[torch.tensor([0, 2])].device.type == "cuda"  # so are host indices
        for mixed in (
            lambda: x + host,
            lambda: torch.stack([x[0], torch.tensor(1.0)]),
            lambda: host.add_(x),
        ):
            with pytest.raises(RuntimeError, match=MIXED):
                mixed()
        with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor to numpy"):
            x.numpy()
        assert x.sum().item() == 3.0 and [s.what for s in gpu.syncs] == ["item"]
        lin = torch.nn.Linear(3, 2).to("cuda")
        twin = copy.deepcopy(lin)
        assert {p.device.type for p in [*lin.parameters(), *twin.parameters()]} == {"cuda"}
        assert lin(x).device.type == "cuda" and lin.weight.cpu().device.type == "cpu"
        with pytest.raises(RuntimeError, match=MIXED):
            lin(host)


def test_a_whole_trial_and_its_checkpoint_on_a_gpu_run_where_each_tensor_lives(
    corpus, tmp_path, monkeypatch
):
    """Training steps, periodic and final evaluation, the analyses, INT8/INT4 GPTQ and INT4 RTN
    with their evaluations, the checkpoint saved and loaded back onto the device, and lm-eval's
    loglikelihood and greedy generation on it, with the model on a fake CUDA device (tests/
    fake_cuda.py: CPU tensors marked as on cuda:0, any op mixing them with host tensors raises
    CUDA's "Expected all tensors to be on the same device"). The trial picks the device itself
    (`device: auto`) and takes the GPU branches: the compute-capability rule (7.0: fp32 with TF32),
    the TF32 flags, fused AdamW, pinned non-blocking batch copies, gradient accumulation, the loss
    read every SYNC_EVERY_CUDA steps, torch.cuda.synchronize before the timers, the peak from
    CUDA's allocator counters; lm-eval scores under bf16 autocast on the device. Where the host
    waits for the device is checked too (the fake records every read).

    Not covered here, and why:
      * torch.compile on CUDA (compile: false, as in every trial test): inductor would emit Triton
        kernels, which need a GPU.
      * bf16 autocast in *training* on the device: bf16 matmuls on a CPU without AMX run several
        times slower and would take this test past its budget; training's autocast is lm_loss's,
        the function the bf16 lm-eval scoring here and every evaluation run through.
      * real asynchrony: the fake device runs each op at once, so a missing synchronize before a
        timer, or a non_blocking copy from memory reused too early, cannot show; the test checks
        where the code syncs and that uploads are pinned and non-blocking instead.
      * CUDA's kernels and numerics: autocast("cuda") runs as CPU autocast of its dtype (the two
        cast nearly the same ops), TF32 is a flag the CPU ignores, and the peak counts only the
        tensors Python sees (not autograd's saved activations).
      * placement inside one op's C++ (the fake checks each Python-visible torch call's inputs),
        and more than one GPU (cuda:0 only).
    """
    from fake_cuda import fake_cuda
    from lm_eval.api.instance import Instance

    from benchmark.data import DataConfig, prepare
    from benchmark.lmeval import ShapebenchLM
    from benchmark.recipe import TrainConfig
    from benchmark.trial import training
    from benchmark.trial.run import run_trial

    data = prepare(
        DataConfig(
            source=str(corpus / "text.txt"), tokenizer="bpe:300", cache_dir=str(tmp_path / "cache")
        )
    )
    steps = 20
    cfg = TrainConfig(
        tokens=steps * 4 * 32,
        seq_len=32,
        batch_size=2,
        grad_accum=2,
        lr=3e-3,
        eval_every=18,
        eval_tokens=512,
        compile=False,
    )  # precision and device: auto
    with fake_cuda(monkeypatch, capability=(7, 0)) as gpu:  # a V100: auto is fp32 with TF32
        row = run_trial(HYPERLOOP, cfg, data=data, checkpoint_dir=tmp_path / "ck")
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        lm = ShapebenchLM(checkpoint=tmp_path / "ck", batch_size=2, precision="bf16")
        assert next(lm.model.parameters()).device == torch.device("cuda", 0)
        asks = [
            Instance(request_type="loglikelihood", doc={}, arguments=a, idx=0)
            for a in (("the cat sat on", " the mat"), ("a dog ran", " under the log and then"))
        ]
        scores = lm.loglikelihood(asks)
        greedy = lm.generate_until(
            [
                Instance(
                    request_type="generate_until",
                    doc={},
                    idx=0,
                    arguments=("the cat", {"until": ["."], "max_gen_toks": 4}),
                )
            ]
        )
    assert row["status"] == "ok", row["error"]
    for col in (
        "val_loss",
        "val_ppl",
        "val_ppl_int8",
        "val_ppl_int4",
        "val_ppl_int4_rtn",
        "stream_cosine",
    ):
        assert math.isfinite(row[col]), col
    assert row["precision"] == "fp32+tf32" and "Fake GPU (CPU)" in row["hardware"]
    assert len(json.loads(row["evals"])) == 1 and set(json.loads(row["val_ppl_by_loops"])) == {
        "1",
        "2",
    }
    # The GPU branches ran: fused AdamW, pinned non-blocking uploads, the allocator's peak (the
    # CPU path would report the process's resident high-water mark, hundreds of MB).
    assert gpu.calls["get_device_capability"] >= 1
    assert gpu.ops["_fused_adamw_"] == 2 * steps  # one call per parameter group
    batches = [u for u in gpu.uploads if u.where.endswith(" to_device")]
    assert len(batches) == 2 * 2 * steps and all(
        u.pinned and u.non_blocking for u in batches
    )  # x, y per micro-batch
    assert gpu.calls["reset_peak_memory_stats"] == 1 and gpu.calls["max_memory_allocated"] == 1
    assert (
        3 * 4 * row["params_total"] <= row["peak_mem_bytes"] < 2**25
    )  # weights + Adam's two moments
    # The host waits for the GPU only where the training loop means it to: the losses are read
    # at steps 1, 17 (16 pending), 18 (an evaluation follows) and 20, and once before the timers
    # are read (`_time`).
    in_training = Counter(
        s.where.split()[1]
        for s in gpu.syncs
        if s.where.startswith(("trial/training.py", "trial/step.py"))
    )
    assert in_training == {"_read_losses": 4, "_time": 1}, in_training
    assert training.SYNC_EVERY_CUDA == 16
    # One read per evaluation (in training, final, 2 loop counts, 3 quantised models), per batch of
    # lm-eval requests and per generated token.
    reads = Counter(s.where.split()[1] for s in gpu.syncs)
    assert (
        reads["source_losses"] == 7
        and reads["_loglikelihood_tokens"] == 1
        and 1 <= reads["greedy"] <= 4
    ), reads
    assert all(math.isfinite(lp) and lp < 0 for lp, _ in scores) and isinstance(greedy[0], str)
    host = ShapebenchLM(checkpoint=tmp_path / "ck", batch_size=2, device="cpu", precision="bf16")
    assert host.loglikelihood(asks) == scores  # the device changes no number
    assert (
        host.generate_until(
            [
                Instance(
                    request_type="generate_until",
                    doc={},
                    idx=0,
                    arguments=("the cat", {"until": ["."], "max_gen_toks": 4}),
                )
            ]
        )
        == greedy
    )


def test_compiled_code_is_cached_under_the_cache_folder_unless_the_user_chose_one(
    monkeypatch, tmp_path
):
    """Inductor's and AOTAutograd's caches follow TORCHINDUCTOR_CACHE_DIR; a trial points it into
    shapebench's cache folder (which survives reboots, unlike /tmp) and keeps a user's choice."""
    import os

    from torch._inductor.runtime.cache_dir_utils import cache_dir

    from benchmark.data import cache_root

    monkeypatch.setenv("SHAPEBENCH_CACHE", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    policy.prepare_device(torch.device("cpu"))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cache_root() / "inductor") == cache_dir()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    policy.prepare_device(torch.device("cpu"))
    assert cache_dir() == str(tmp_path / "mine")
