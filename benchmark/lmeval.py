"""lm-evaluation-harness adapter: run any lm-eval task on a shapebench checkpoint.

    shapebench tasks TASKS_DIR                      # the offline held-out tasks (optional)
    shapebench lmeval --model shapebench \\
        --model_args checkpoint=PATH[,loops=4,max_length=512] --batch_size 16 --device cpu \\
        --tasks shapebench_cloze,shapebench_choice --include_path TASKS_DIR

lm-eval 0.4.13 discovers models only in its own source tree (no plugin entry points), so
`shapebench lmeval` (or `python -m benchmark.lmeval`) is lm-eval's own command line with this model
registered. In Python, importing this module registers "shapebench"; `simple_evaluate(model=ShapebenchLM(...))`
also works.

Choices that differ from a Hugging Face model:
  * every request starts with <|endoftext|>: each training document follows one, so this is how the
    model has seen a text begin (lm-eval's prefix for empty contexts and rolling windows as well);
  * the context window is the training seq_len (from meta.json): RoPE runs at any length, but the
    model never saw a longer window. Longer inputs keep their last max_length tokens;
  * decoding is greedy only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Registers lm-eval's own models first: it imports them only into an empty model registry.
import lm_eval.models  # noqa: F401
import tokenizers
import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import (
    get_rolling_token_windows,
    make_disjoint_window,
    simple_parse_args_string,
)

from benchmark.data import HF_EOT_CANDIDATES, Tokenizer
from benchmark.models import LanguageModel
from benchmark.trial import (
    TOKENIZER,
    CheckpointError,
    ExecPolicy,
    autocast,
    default_device,
    load_checkpoint,
)

MAX_GEN_TOKS = 256  # lm-eval's default for generate_until


@register_model("shapebench")
class ShapebenchLM(TemplateLM):
    """A shapebench LanguageModel behind lm-eval's LM interface. Give a checkpoint directory, or
    a model and its tokenizer (then max_length, the context window, is required)."""

    def __init__(
        self,
        checkpoint: str | Path | None = None,
        *,
        model: LanguageModel | None = None,
        tokenizer: Tokenizer | None = None,
        max_length: int | None = None,
        loops: int | None = None,
        batch_size: int | str = 16,
        device: str | None = None,
        precision: str = "auto",
    ):
        super().__init__()
        if (checkpoint is None) == (model is None) or (model is not None and tokenizer is None):
            raise ValueError("shapebench: pass checkpoint=PATH, or both model and tokenizer")
        if checkpoint is not None:
            model, meta = load_checkpoint(checkpoint)
            tokenizer = checkpoint_tokenizer(checkpoint, meta)
            max_length = max_length or training_seq_len(checkpoint, meta)
        if not max_length:
            raise ValueError(
                "shapebench: max_length (the model's context window) is required with a model"
            )
        self._device = torch.device(device) if device else default_device()
        self.model = model.to(self._device).eval()
        # Scored under the autocast validation uses (trial/step.py): the same numbers on a GPU.
        self._dtype = ExecPolicy(precision=precision, compile=False).autocast_dtype(self._device)
        self.tokenizer = tokenizer
        self.max_length = int(max_length)
        self.loops = loops  # None: the training loop count
        self.batch_size = positive_int(batch_size, "batch_size")
        self.checkpoint = None if checkpoint is None else str(checkpoint)

    @classmethod
    def create_from_arg_obj(
        cls, arg_dict: dict[str, Any], additional_config: dict | None = None
    ) -> ShapebenchLM:
        """As lm-eval's, except that --model_args win over the command line's own settings (its
        default batch_size=1 would otherwise clash with batch_size=16 in --model_args)."""
        extra = {
            k: v
            for k, v in (additional_config or {}).items()
            if v is not None and k not in arg_dict
        }
        return cls(**arg_dict, **extra)

    @classmethod
    def create_from_arg_string(
        cls, arg_string: str, additional_config: dict | None = None
    ) -> ShapebenchLM:
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    # ---- what TemplateLM needs ------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eot_id

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **kwargs
    ) -> list[int]:
        ids = self.tokenizer.encode(string)
        return ids if add_special_tokens is False else [self.eot_token_id, *ids]

    def get_model_info(self) -> dict[str, Any]:
        """Recorded in lm-eval's results under "config"."""
        return {
            "checkpoint": self.checkpoint,
            "family": self.model.spec.family,
            "loops": self.loops,
            "max_length": self.max_length,
            "tokenizer_id": self.tokenizer.tokenizer_id,
        }

    # ---- scoring --------------------------------------------------------------------------
    @torch.inference_mode()
    def logits(self, rows: list[list[int]]) -> torch.Tensor:
        """Token rows of any lengths -> float32 logits (B, T, vocab), T the longest row. Rows are
        right-padded: the model is causal, so padding never reaches a real position."""
        width = max(map(len, rows))
        idx = torch.tensor(
            [row + [self.eot_token_id] * (width - len(row)) for row in rows], device=self.device
        )
        with autocast(self._device.type, self._dtype):
            return self.model(idx, loops=self.loops).float()

    def _loglikelihood_tokens(
        self, requests, disable_tqdm: bool = False, **kwargs
    ) -> list[tuple[float, bool]]:
        """(log P(continuation | context), whether greedy decoding gives the continuation) per
        (key, context ids, continuation ids); longest first, so a batch pads little."""
        windows = [self.window(context, continuation) for _, context, continuation in requests]
        results: list[tuple[float, bool]] = [(0.0, True)] * len(windows)
        order = sorted(range(len(windows)), key=lambda i: -len(windows[i][0]))
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            logits = self.logits([windows[i][0] for i in batch])
            logprobs, greedy = [], []
            for row, i in enumerate(batch):
                inputs, target = windows[i]
                scored = F.log_softmax(
                    logits[row, len(inputs) - len(target) : len(inputs)], dim=-1
                )  # (n, vocab)
                target_t = torch.tensor(target, device=scored.device)
                logprobs.append(scored.gather(1, target_t[:, None]).sum())
                greedy.append((scored.argmax(-1) == target_t).all())
            # One read per batch: a read per request would make the host wait for the GPU each time.
            read = torch.stack(
                [torch.stack(logprobs), torch.stack(greedy).float()]
            ).tolist()  # (2, B)
            for i, logprob, exact in zip(batch, *read):
                results[i] = (logprob, bool(exact))
        return results

    def window(self, context: list[int], continuation: list[int]) -> tuple[list[int], list[int]]:
        """The model input that scores `continuation`: its last max_length tokens before the end."""
        if len(continuation) > self.max_length:
            raise ValueError(
                f"shapebench: a continuation of {len(continuation)} tokens does not fit "
                f"the context window (max_length={self.max_length})"
            )
        return (context + continuation)[-(self.max_length + 1) : -1], continuation

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of whole texts, in disjoint windows of max_length tokens, each of which
        sees as much preceding text as fits (lm-eval's get_rolling_token_windows, context_len=1)."""
        windows, owner = [], []
        for i, request in enumerate(requests):
            tokens = self.tok_encode(request.args[0], add_special_tokens=False)
            pairs = get_rolling_token_windows(
                tokens, self.prefix_token_id, self.max_length, context_len=1
            )
            for context, target in map(make_disjoint_window, pairs):
                windows.append((None, context, target))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owner, self._loglikelihood_tokens(windows)):
            totals[i] += logprob
        return totals

    # ---- generation -----------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations, cut before the first `until` string, at most max_gen_toks tokens."""
        contexts = [self.tok_encode(request.args[0]) for request in requests]
        settings = [generation_settings(request.args[1]) for request in requests]
        results = [""] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: -len(contexts[i]))
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            texts = self.greedy([contexts[i] for i in batch], [settings[i] for i in batch])
            for i, text in zip(batch, texts):
                results[i] = text
        return results

    def greedy(self, contexts: list[list[int]], settings: list[tuple[list[str], int]]) -> list[str]:
        """One token per step for every unfinished row. Without a KV cache each step runs the
        whole window, the last max_length tokens of context + generated."""
        generated: list[list[int]] = [[] for _ in contexts]
        active = [j for j, (_, max_toks) in enumerate(settings) if max_toks > 0]
        while active:
            rows = [(contexts[j] + generated[j])[-self.max_length :] for j in active]
            logits = self.logits(rows)
            last = torch.tensor([len(row) - 1 for row in rows], device=logits.device)
            # Every row's next token in one read (a read per row would wait for the GPU each time).
            for j, token in zip(
                active,
                logits[torch.arange(len(rows), device=logits.device), last].argmax(-1).tolist(),
            ):
                generated[j].append(token)
            active = [j for j in active if not self.finished(generated[j], *settings[j])]
        return [self.cut(tokens, until) for tokens, (until, _) in zip(generated, settings)]

    def finished(self, tokens: list[int], until: list[str], max_toks: int) -> bool:
        if tokens[-1] == self.eot_token_id or len(tokens) >= max_toks:
            return True
        text = self.tokenizer.decode(tokens)
        return any(stop in text for stop in until)

    def cut(self, tokens: list[int], until: list[str]) -> str:
        if tokens and tokens[-1] == self.eot_token_id:
            tokens = tokens[:-1]
        text = self.tokenizer.decode(tokens)
        for stop in until:
            text = text.split(stop)[0]
        return text


def generation_settings(gen_kwargs: dict[str, Any]) -> tuple[list[str], int]:
    """(stop strings, max new tokens) from a task's generation_kwargs."""
    if gen_kwargs.get("do_sample"):
        raise ValueError(
            "shapebench: only greedy decoding is supported (do_sample=True was requested)"
        )
    until = gen_kwargs.get("until") or []
    until = [until] if isinstance(until, str) else list(until)
    return [stop for stop in until if stop], int(gen_kwargs.get("max_gen_toks", MAX_GEN_TOKS))


def checkpoint_tokenizer(path: str | Path, meta: dict[str, Any]) -> Tokenizer:
    """The tokenizer saved with the checkpoint (benchmark.trial.run writes it)."""
    file = Path(path) / TOKENIZER
    if not file.is_file():
        raise CheckpointError(f"{path}: no {TOKENIZER}; lm-eval needs the checkpoint's tokenizer")
    inner = tokenizers.Tokenizer.from_file(str(file))
    eot = next((t for t in HF_EOT_CANDIDATES if inner.token_to_id(t) is not None), None)
    if eot is None:
        raise CheckpointError(
            f"{file}: no end-of-text token (looked for {', '.join(HF_EOT_CANDIDATES)})"
        )
    name = str(meta.get("tokenizer_id", "checkpoint")).split("@")[0]
    return Tokenizer(inner=inner, name=name, eot_id=inner.token_to_id(eot))


def training_seq_len(path: str | Path, meta: dict[str, Any]) -> int:
    """The window the model was trained on: meta.json's "training" (a JSON string) -> seq_len."""
    training = meta.get("training")
    if not training:
        raise CheckpointError(f"{path}: meta.json records no training settings; pass max_length=N")
    return int(json.loads(training)["seq_len"])


def positive_int(value: int | str, name: str) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"shapebench: {name} must be a positive integer, got {value!r}")
    return value


def main() -> None:
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
