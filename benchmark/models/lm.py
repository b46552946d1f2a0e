"""One language model assembled from parts: token embedding, a begin block, a middle block that
may loop, an end block, and a head. Every seed architecture is a setting of this one class:

  transformer   begin only                       looped / abbie-c  middle x r, h = B(h)
  abbie-d       middle x r, h = B(h) + h          depth             h = B(W [e; h]), h0 random
                (from iteration loop_residual_from)
  hyperloop     middle x r inside loop-level hyper-connections (n streams)
  mhc / hc      hyper-connections at every sublayer over the whole stack
  lora-looped   looped with a LoRA adapter per loop on the middle layers
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmark.arch import ArchSpec, hyper_spans, with_counts
from benchmark.models.hyper import hyper_connect, make_gate
from benchmark.models.layers import INIT_STD, Block, Proj, RMSNorm, Rotary

DEPTH_STATE_STD = INIT_STD  # Depth's random initial state matches the embedding scale


class LanguageModel(nn.Module):
    def __init__(self, spec: ArchSpec):
        super().__init__()
        self.spec = spec
        d, s = spec.d_model, spec.layers
        self.tok_emb = nn.Embedding(spec.vocab_size, d)
        lora = (spec.lora_rank, spec.loops) if spec.lora_rank else (0, 0)
        self.begin = nn.ModuleList(Block(spec) for _ in range(s.begin))
        self.middle = nn.ModuleList(Block(spec, *lora) for _ in range(s.middle))
        if spec.lora_rank:  # the adapters' indices, as the middle layers take them (_loop)
            self.register_buffer("loop_ids", torch.arange(spec.loops), persistent=False)
        self.end = nn.ModuleList(Block(spec) for _ in range(s.end))
        self.final_norm = RMSNorm(d, spec.norm_eps)
        self.lm_head = None if spec.tie_embeddings else Proj(d, spec.vocab_size)
        self.rotary = Rotary(spec.head_dim, spec.rope_theta)
        self.inject = Proj(2 * d, d) if spec.injection == "concat" else None
        self.hyper = self.loop_emb = None
        if spec.hyper is not None:
            n_gates = len(hyper_spans(spec))
            self.hyper = nn.ModuleList(make_gate(spec.hyper, d, i) for i in range(n_gates))
            if spec.hyper.loop_embedding:
                self.loop_emb = nn.Parameter(torch.zeros(spec.loops, d))  # e_l (Hyperloop eq. 3)
        self._init_weights()

    def _init_weights(self) -> None:
        nn.init.normal_(self.tok_emb.weight, std=INIT_STD)
        # GPT-2: scale the projections that write into the residual stream by the unrolled depth.
        out_std = INIT_STD / math.sqrt(2 * self.spec.unrolled_layers())
        h = self.spec.hyper
        if h is not None and h.mixing in ("static", "dynamic"):
            # HC §4 "Implementation": the streams are summed at the end, so the std of the output
            # modules (attention's output projection, the FFN's second linear layer) is scaled by
            # sqrt(n), to keep the output's std at the baseline's. We read the scaling as a
            # division (the direction that keeps a sum of n streams at the baseline's std).
            out_std /= math.sqrt(h.streams)
        for block in [*self.begin, *self.middle, *self.end]:
            nn.init.normal_(block.attn.o.weight, std=out_std)
            for mlp in block.ffn.blocks:
                nn.init.normal_(mlp.w2.weight, std=out_std)

    # ---- the forward pass ---------------------------------------------------------------
    def forward(
        self, idx: torch.Tensor, loops: int | None = None, trace: list | None = None
    ) -> torch.Tensor:
        """idx (B, T) token ids -> logits (B, T, vocab). `loops` overrides the training loop count
        (test-time scaling). If `trace` is a list, the residual state after every unrolled layer is
        appended to it as (name, tensor): (B, T, d), or (B, T, n, d) inside hyper-connections."""
        return self._logits(self.features(idx, loops, trace))

    def features(
        self, idx: torch.Tensor, loops: int | None = None, trace: list | None = None
    ) -> torch.Tensor:
        """The last layer's output (B, T, d), before the final norm and the head (`_logits`): the
        training step compiles the head with its loss as one region (trial/step.py)."""
        spec = self.spec
        r = spec.loops if loops is None else loops
        if r < 1:
            raise ValueError(f"loops must be >= 1, got {r}")
        rope = self.rotary(idx.shape[1], idx.device)
        x = self.tok_emb(idx)  # (B, T, d)
        if spec.hyper is not None and not spec.looped:  # mHC / HC: the whole stack
            return self._hyper_region(x, self._all_layers(), rope, trace)
        x = self._run(self.begin, x, rope, "begin", trace)
        if spec.layers.middle:
            x = self._middle(x, r, rope, trace)
        return self._run(self.end, x, rope, "end", trace)

    def regions(self) -> list[tuple[nn.Module, str]]:
        """The repeated units that torch.compile compiles once and every layer and loop reuses
        (regional compilation, trial/step.py), as (module, method): each layer, or with
        sublayer hyper-connections (mHC, HC, a looped model's middle with `every: sublayer`), each
        sublayer's branch, which is what those call; and every gate's read and write. Same-class
        modules share one compiled graph, so compiling takes the time of one layer whatever the
        depth or loop count (a whole-model graph unrolls every loop, and its first step took
        minutes: benchmarks/2026-11-24-perf-cpu-epyc.md, "First step"). LoRA-looped layers
        too: their adapter's index comes in as a tensor (_loop)."""
        blocks = [*self.begin, *self.middle, *self.end]
        connected = []  # layers whose sublayers the hyper-connections call one by one
        if self.spec.hyper is not None and any(
            sub is not None for _, _, sub in hyper_spans(self.spec)
        ):
            connected = list(self.middle) if self.spec.looped else blocks
        units = [(sub, "branch") for block in connected for sub in block.sublayers]
        units += [
            (block, "forward") for block in blocks if block not in connected
        ]  # modules compare by identity
        return units + [
            (gate, method) for gate in (self.hyper or []) for method in ("read", "write")
        ]

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        x = self.final_norm(x)
        w = self.tok_emb.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(x, w)  # (B, T, vocab)

    def _loop(self, loop: int | None):
        """A loop index as the layers take it. A LoRA model's middle layers get their adapter's
        index as a 0-dim tensor (the last adapter past the trained loops): an int would be a
        constant to the compiler, one graph per loop, and past dynamo's 8 graphs a layer would run
        eager; the tensor also makes a cold first step shorter
        (benchmarks/2026-11-24-perf-cpu-epyc.md, "First step")."""
        if loop is None or not self.spec.lora_rank:
            return loop
        return self.loop_ids[min(loop, self.spec.loops - 1)]

    def _run(self, blocks, x, rope, name, trace, loop=None):
        for i, block in enumerate(blocks):
            x = block(x, rope, self._loop(loop))
            if trace is not None:
                trace.append((f"{name}.{i}" if loop is None else f"{name}.{loop}.{i}", x))
        return x

    def _middle(self, x: torch.Tensor, r: int, rope, trace) -> torch.Tensor:
        inj = self.spec.injection
        if inj == "hyper":
            layers = [
                (block, self._loop(loop), i)
                for loop in range(r)
                for i, block in enumerate(self.middle)
            ]
            return self._hyper_region(x, layers, rope, trace)
        if inj == "concat":
            e, x = x, self._depth_state(x)
        for loop in range(r):
            h = x
            if inj == "concat":  # Depth (Geiping et al.): h = B(W [e; h])
                # in the stream's precision: autocast runs W in bf16, and its output is the middle
                # and end blocks' residual stream, which stays float32 as the Transformer's does
                h = self.inject(torch.cat([e, h], dim=-1)).to(e.dtype)
            x = self._run(self.middle, h, rope, "middle", trace, loop)
            if inj == "residual" and loop >= self.spec.loop_residual_from:
                # AbbIE-D eq. 4, h_{k+1} = B(h_k) + h_k, for k = 0, ..., N - 1 (from k = 1 with
                # loop_residual_from: 1, which makes one iteration the plain Transformer).
                x = x + h
                if trace is not None:  # the stream after the inter-iteration residual
                    trace[-1] = (trace[-1][0], x)
        return x

    def _depth_state(self, e: torch.Tensor) -> torch.Tensor:
        """Depth's random initial state. In eval mode it is drawn from a fixed CPU generator so that
        evaluation is deterministic on any device; in training it follows the global (seeded) RNG."""
        if self.training:
            noise = torch.randn(e.shape, device=e.device, dtype=torch.float32)
        else:  # one (T, d) draw shared by the batch: a sequence's score never depends on its batch,
            # drawn on the CPU so that a checkpoint scores the same on every device (CPU and CUDA
            # generators give different numbers: a trained Depth model's logits differed by 0.46)
            gen = torch.Generator().manual_seed(0)
            noise = (
                torch.randn(e.shape[-2:], generator=gen, dtype=torch.float32)
                .to(e.device)
                .expand(e.shape)
            )
        return (noise * DEPTH_STATE_STD).to(e.dtype)

    # ---- hyper-connections --------------------------------------------------------------
    def _all_layers(self):
        blocks = [*self.begin, *self.middle, *self.end]
        return [(b, None, i) for i, b in enumerate(blocks)]

    def _gate_index(self, first: int, k: int, sub: int | None) -> int:
        """Which gate serves the connection that starts at unrolled layer `first`. Gates belong
        to positions of the training unroll; loops beyond it reuse the last loop's gates."""
        trained = (
            self.spec.layers.middle * self.spec.loops
            if self.spec.looped
            else self.spec.layers.unique
        )
        m = self.spec.layers.middle
        if first >= trained:
            first = trained - m + (first - trained) % m
        return 2 * first + sub if sub is not None else first // k

    def _hyper_region(self, x: torch.Tensor, layers, rope, trace) -> torch.Tensor:
        n, m = self.spec.hyper.streams, self.spec.layers.middle
        Y = x.unsqueeze(-2).expand(*x.shape[:-1], n, x.shape[-1]).contiguous()  # (B, T, n, d)
        r = len(layers) // m if self.spec.looped else 1
        for first, k, sub in hyper_spans(self.spec, r):
            gate = self.hyper[self._gate_index(first, k, sub)]
            span = layers[first : first + k]
            extra = None
            if self.loop_emb is not None:
                extra = self.loop_emb[min(first // m, self.spec.loops - 1)]
            Y = hyper_connect(gate, Y, self._span_fn(span, sub, rope, self.spec.hyper.read), extra)
            if trace is not None and (sub is None or sub == 1):
                trace.append((f"hyper.{first + k - 1}", Y))
        # average the streams before the end block (Hyperloop §3), in the residual's dtype: bf16
        # streams (hyper.stream_dtype) must not hand the end block and the head a bf16 residual
        return Y.mean(dim=-2, dtype=x.dtype)

    @staticmethod
    def _span_fn(span, sub, rope, read: str):
        """F of Hyperloop eq. 3 for one connection (hyper.py's docstring)."""
        if sub is not None:  # one sublayer: its branch (mHC's F)
            block, loop, _ = span[0]
            return lambda u: block.sublayers[sub].branch(u, rope, loop)

        def run(u):  # whole layers keep their own residuals
            h = u
            for block, loop, _ in span:
                h = block(h, rope, loop)
            return span_output(read, h, u)

        return run


def span_output(read: str, h: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """What a whole-layer span that maps u to h contributes to the streams (`hyper.read`): h
    itself (`block`, Hyperloop eq. 3's F) or the change h - u (`delta`)."""
    return h if read == "block" else h - u


def weight_decays(name: str, p: torch.Tensor) -> bool:
    """The one weight-decay rule: matrices decay; norms, biases, gating scalars and loop
    embeddings do not; of the hyper-connections only the dynamic projections W decay. HC §4: "The
    static component in Eqs. 1, 11, 12, 13 does not utilize weight decay, whereas the dynamic
    component does" (a decayed A_r would be pulled towards 0, not its identity initialisation)."""
    component = _component(name)
    if component == "loop_embedding":
        return False
    if component == "hyper":
        return name.endswith(".weight")  # SigmoidGate.weight, ZhuGate.weight: W (dynamic)
    return p.dim() >= 2


def build_model(spec: ArchSpec | dict) -> LanguageModel:
    """Build the torch model for a spec (a mapping is validated first)."""
    return LanguageModel(ArchSpec.from_dict(spec) if not isinstance(spec, ArchSpec) else spec)


def param_components(model: LanguageModel) -> dict[str, int]:
    """Parameter count per component (docs/architectures.md "Counting"), read off the built model (tests compare it with
    the analytic `count_params`)."""
    counts = dict.fromkeys(
        (
            "embedding",
            "head",
            "attention",
            "ffn",
            "norm",
            "hyper",
            "loop_embedding",
            "lora",
            "injection",
        ),
        0,
    )
    for name, p in model.named_parameters():
        counts[_component(name)] += p.numel()
    return with_counts(counts, sum(p.numel() for p in model.parameters()))


def _component(name: str) -> str:
    if "lora_" in name:
        return "lora"
    if name.endswith("norm.weight") or name == "final_norm.weight":
        return "norm"
    for prefix, comp in (
        ("tok_emb.", "embedding"),
        ("lm_head.", "head"),
        ("hyper.", "hyper"),
        ("loop_emb", "loop_embedding"),
        ("inject.", "injection"),
    ):
        if name.startswith(prefix):
            return comp
    if ".attn." in name:
        return "attention"
    if ".ffn." in name:
        return "ffn"
    raise KeyError(f"unclassified parameter {name}")
