"""One trial: a candidate trained, evaluated and quantised. Other packages import from here; the
modules behind it, lowest first:

    policy        the execution policy: device, precision (bf16 where it helps), the matmul probe
    compilation   the regions torch.compile compiles, and its caches
    step          the loss and the training step, the same on CPU and CUDA
    curve         the training curve a trial keeps
    watchdog      a run that makes no step ended, to run again from its saved state
    runstate      a run's whole state part-way, saved and continued from
    evaluate      held-out loss, per source and per loop count
    training      the training loop
    analysis      mechanism diagnostics (streams, loops, logit lens)
    quant         GPTQ and round-to-nearest quantisation
    checkpoint    the trained model and its tokenizer on disk
    run           one trial end to end: a results row
    distributed   a trial of several workers (Ray Train)

The names load on first use (PEP 562), so that importing one module costs only that module: the
search driver reads distributed.py's names without importing torch.
"""

from benchmark.lazy import lazy_face

_EXPORTS = {
    "ExecPolicy": "policy",
    "autocast": "policy",
    "default_device": "policy",
    "matmul_peak": "policy",
    "prepare_device": "policy",
    "TrainStep": "step",
    "lm_loss": "step",
    "QuantConfig": "quant",
    "quantize": "quant",
    "TOKENIZER": "checkpoint",
    "CheckpointError": "checkpoint",
    "load_checkpoint": "checkpoint",
    "run_trial": "run",
    "Workers": "distributed",
    "lost_worker": "distributed",
    "release_workers": "distributed",
    "run_distributed": "distributed",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
