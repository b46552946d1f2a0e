"""Regional compilation (trial/step.py `compile_regions`): the compiled step trains as
the eager one does, compiles one graph per repeated unit whatever the depth or loop count, and
leaves the model eager when training ends. The only tests that run torch.compile: every trial
test trains eagerly to stay fast."""

import copy
import functools

import pytest
import torch

from benchmark import ArchSpec, build_model
from benchmark.recipe import TrainConfig
from benchmark.trial.policy import ExecPolicy
from benchmark.trial.step import TrainStep
from benchmark.trial.training import make_optimizer

TINY = {"vocab_size": 97, "d_model": 32, "n_heads": 4}
CPU = torch.device("cpu")


def tiny(family: str, **over) -> ArchSpec:
    raw = {"family": family, **TINY, **over}
    if family not in ("transformer", "mhc", "hc") and "layers" not in over:
        raw["layers"] = {"begin": 1, "middle": 2, "end": 1}
    return ArchSpec.from_dict(raw)


def losses(spec: ArchSpec, policy: ExecPolicy, steps: int = 3):
    torch.manual_seed(0)
    model = build_model(spec).train()
    step = TrainStep(model, make_optimizer(model, TrainConfig(lr=3e-3)), policy, CPU)
    data = torch.randint(
        0, spec.vocab_size, (1, 2, 17), generator=torch.Generator().manual_seed(1)
    ).expand(steps, 2, 17)
    out = [step(d[:, :-1], d[:, 1:]).item() for d in data]
    step.close()
    return out, model


@pytest.mark.parametrize("family", ["transformer", "mhc"])
def test_a_compiled_step_trains_as_the_eager_one_and_leaves_the_model_eager(family):
    # mHC with 3 Sinkhorn iterations, not 20: the same regions, a shorter loop to compile (18 s less, cold)
    spec = tiny(family, **({"hyper": {"sinkhorn_iters": 3}} if family == "mhc" else {}))
    eager, _ = losses(spec, ExecPolicy(precision="fp32", compile=False))
    compiled, model = losses(spec, ExecPolicy(precision="fp32", compile=True))
    assert eager[0] > eager[-1]  # it learns, so the comparison covers the updates too
    assert compiled == pytest.approx(eager, rel=1e-4)
    regions = model.regions()
    assert regions and all(name not in vars(module) for module, name in regions)
    # a copy (quantisation's) runs its own weights, with nothing bound to the original left
    twin = copy.deepcopy(model).eval()
    assert all(name not in vars(module) for module, name in twin.regions())
    with torch.no_grad():
        for block in [*twin.begin, *twin.middle, *twin.end]:
            for p in block.parameters():
                p.mul_(0.5)
        fresh = build_model(spec).eval()
        fresh.load_state_dict(twin.state_dict())
        x = torch.arange(8).unsqueeze(0) % spec.vocab_size
        torch.testing.assert_close(twin(x), fresh(x), rtol=0, atol=0)
        assert not torch.allclose(twin(x), model.eval()(x))


def graphs(spec: ArchSpec) -> int:
    """How many graphs dynamo traced for one compiled step of `spec`'s model."""
    from torch._dynamo.utils import counters

    counters.clear()
    losses(spec, ExecPolicy(precision="fp32", compile=True), steps=1)
    return counters["stats"]["unique_graphs"]


def test_the_compile_cache_keeps_every_region():
    """torch's AOTAutograd cache, which spares a warm trial re-tracing a region, keeps no graph
    with an autocast context in it, even a disabled one (the fp32 head, mHC's Sinkhorn: re-traced
    on every warm first step otherwise), nor by default one with a custom
    autograd Function (the gates' write, StreamWrite; the step allows it: `cached_functions`)."""
    from torch._dynamo.utils import counters

    for spec in (tiny("transformer"), tiny("mhc", hyper={"sinkhorn_iters": 3})):
        counters.clear()
        losses(spec, ExecPolicy(precision="fp32", compile=True), steps=1)
        assert counters["aot_autograd"]["ok"] == counters["stats"]["unique_graphs"] > 1
        assert counters["aot_autograd"]["autograd_cache_bypass"] == 0, spec.family


def test_regions_compile_once_whatever_the_depth_or_the_loop_count(monkeypatch):
    """A 2-layer and a 6-layer Transformer compile the same graphs (one per layer class, one for
    the head); so do a looped model at 2 and 4 loops, and a LoRA-looped one at 9. A whole-model
    graph grows with both."""
    # dynamo captures and guards the same graphs whatever backend compiles them; skipping
    # Inductor's C++ compile takes this test from 23 s to 3 s (2-core AMD EPYC)
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    assert (
        graphs(tiny("transformer", layers={"n": 6}))
        == graphs(tiny("transformer", layers={"n": 2}))
        == 2
    )
    assert graphs(tiny("hyperloop", loops=4)) == graphs(tiny("hyperloop", loops=2))
    # LoRA-looped: the middle layer's adapter index is a tensor, not a constant; as an int it was
    # one graph per loop (4, 6 and 9 graphs at 2, 4 and 9 loops), past dynamo's limit of 8 eager.
    # Now the begin/end layer's, the adapted middle layer's and the head's at any loop count.
    assert graphs(tiny("lora-looped", loops=9)) == 3


def test_sublayer_hyper_connections_compile_their_branches():
    """mHC and HC connect each sublayer, so their regions are attention's and the FFN's branches
    (what the connections call) and every gate; the others compile whole layers."""
    names = lambda family: {(type(m).__name__, n) for m, n in build_model(tiny(family)).regions()}  # noqa: E731
    assert names("mhc") == {
        ("Attention", "branch"),
        ("FeedForward", "branch"),
        ("SigmoidGate", "read"),
        ("SigmoidGate", "write"),
    }
    assert names("hc") == {
        ("Attention", "branch"),
        ("FeedForward", "branch"),
        ("ZhuGate", "read"),
        ("ZhuGate", "write"),
    }
    assert names("hyperloop") == {
        ("Block", "forward"),
        ("SigmoidGate", "read"),
        ("SigmoidGate", "write"),
    }
    assert names("transformer") == {("Block", "forward")}
    # a looped model connected at every sublayer: the middle's branches, the begin and end layers whole
    model = build_model(
        tiny("hyperloop", hyper={"every": "sublayer", "loop_embedding": False, "read": "delta"})
    )
    whole = [m for m, n in model.regions() if n == "forward" and type(m).__name__ == "Block"]
    assert len(whole) == 2 and whole[0] is model.begin[0] and whole[1] is model.end[0]
    assert sum(n == "branch" for _, n in model.regions()) == 2 * len(model.middle)
