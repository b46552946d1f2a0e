"""ArchSpec validation: presets, overrides, round trips, and errors that name the key."""

from dataclasses import fields

import pytest

from benchmark import FAMILIES, ArchSpec, SpecError
from benchmark.arch.presets import PRESETS
from benchmark.arch.spec import FFNSpec, HyperSpec, LayerSplit


def test_every_family_has_a_preset_that_validates():
    assert set(PRESETS) == set(FAMILIES)
    for fam in FAMILIES:
        spec = ArchSpec.from_dict({"family": fam})
        assert spec.family == fam


def test_defaults_are_the_dataclass_fields():
    """A spec that gives nothing gets each field's declared default; only the derived keys
    (head_dim, n_kv_heads, the FFN width) are resolved from the others."""
    s = ArchSpec.from_dict({})
    derived = {"n_kv_heads": 4, "head_dim": 64, "ffn": FFNSpec(d_ff=704, ratio=2.75)}
    for f in fields(ArchSpec):
        default = f.default_factory() if f.name in ("ffn", "layers") else f.default
        assert getattr(s, f.name) == derived.get(f.name, default), f.name
    assert s.layers == LayerSplit(begin=4)
    assert ArchSpec.from_dict({"hyper": {"every": "layer"}}).hyper == HyperSpec(every="layer")
    hourglass = ArchSpec.from_dict({"ffn": {"kind": "hourglass"}}).ffn
    assert hourglass == FFNSpec(kind="hourglass", d_h=102, dh_ratio=0.4)  # 0.4 x 256, rounded


def test_hyperloop_preset_is_the_paper():
    s = ArchSpec.from_dict({"family": "hyperloop"})
    assert (s.layers.begin, s.layers.middle, s.layers.end, s.loops) == (2, 4, 2, 3)
    assert s.injection == "hyper" and s.looped
    assert (s.hyper.streams, s.hyper.every, s.hyper.mixing, s.hyper.loop_embedding) == (
        4,
        "loop",
        "diagonal",
        True,
    )
    assert s.structure() == "2L→4L(×3)→2L"


def test_presets_fill_and_explicit_keys_override():
    s = ArchSpec.from_dict({"family": "hyperloop", "hyper": {"streams": 8}, "loops": 5})
    assert s.hyper.streams == 8 and s.hyper.mixing == "diagonal" and s.loops == 5
    m = ArchSpec.from_dict({"family": "mhc"})
    assert (m.hyper.every, m.hyper.mixing, m.hyper.sinkhorn_iters, m.looped) == (
        "sublayer",
        "sinkhorn",
        20,
        False,
    )
    a = ArchSpec.from_dict({"family": "abbie-d"})
    assert a.eval_loops == (1, 2, 4, 8) and a.loops == 2 and a.injection == "residual"


def test_resolved_defaults():
    s = ArchSpec.from_dict({"d_model": 1024, "n_heads": 16, "n_kv_heads": 8})
    assert (s.head_dim, s.n_kv_heads, s.q_dim, s.kv_dim) == (64, 8, 1024, 512)
    assert s.ffn.d_ff == 2816  # 2.75 x 1024 (Hyperloop App. A)
    h = ArchSpec.from_dict(
        {"d_model": 1000, "n_heads": 10, "ffn": {"kind": "hourglass", "dh_ratio": 0.4, "K": 4}}
    )
    assert (h.ffn.d_h, h.ffn.K) == (400, 4)
    assert (
        ArchSpec.from_dict(
            {"d_model": 100, "n_heads": 2, "ffn": {"ratio": 3, "multiple_of": 64}}
        ).ffn.d_ff
        == 320
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip(family):
    s = ArchSpec.from_dict({"family": family, "d_model": 96, "n_heads": 6})
    assert ArchSpec.from_dict(s.to_dict()) == s
    assert ArchSpec.from_dict(__import__("json").loads(s.to_json())) == s


def test_replace_rederives_ratio_widths():
    s = ArchSpec.from_dict({"d_model": 128, "n_heads": 4, "ffn": {"ratio": 2.75}})
    t = s.replace(d_model=256)
    assert t.ffn.d_ff == 704 and t.d_model == 256 and t.head_dim == 64
    assert s.replace(**{"layers.begin": 7}).layers.begin == 7


@pytest.mark.parametrize(
    "raw, key, message",
    [
        (
            {"family": "hyperlop"},
            "family",
            "'hyperlop' is not one of transformer, looped, hyperloop, mhc, hc, abbie-c, abbie-d, depth, lora-looped (did you mean 'hyperloop'?)",
        ),
        (
            {"d_model": 1000, "n_heads": 16},
            "d_model",
            "d_model 1000 is not divisible by n_heads 16",
        ),
        (
            {"layers": {"begin": 2, "middle": 0, "end": 2}, "loops": 3},
            "layers.middle",
            "layers.middle must be > 0 when loops > 1",
        ),
        ({"d_modle": 64}, "d_modle", "unknown key (did you mean 'd_model'?)"),
        (
            {"ffn": {"kind": "hourglas"}},
            "ffn.kind",
            "'hourglas' is not one of swiglu, hourglass (did you mean 'hourglass'?)",
        ),
        ({"ffn": {"d_hh": 3}}, "ffn.d_hh", "unknown key (did you mean 'd_h'?)"),
        ({"ffn": {"K": 4}}, "ffn.K", "K=4 needs ffn.kind: hourglass (a SwiGLU FFN has K=1)"),
        (
            {"n_heads": 8, "n_kv_heads": 3, "d_model": 64},
            "n_kv_heads",
            "n_heads 8 is not divisible by n_kv_heads 3",
        ),
        ({"d_model": "big"}, "d_model", "expected an integer, got 'big'"),
        ({"loops": 0, "layers": {"begin": 1, "middle": 1}}, "loops", "must be >= 1, got 0"),
        (
            {"family": "hyperloop", "hyper": {"every": 5, "loop_embedding": False}},
            "hyper.every",
            "every 5 layers does not divide the 4 x 3 unrolled middle layers",
        ),
        (
            {"family": "hyperloop", "hyper": {"every": "layer"}},
            "hyper.loop_embedding",
            "the loop embedding is added at loop-level connections; needs every: loop, got layer",
        ),
        (
            {"family": "hyperloop", "hyper": {"mixing": "sinkorn"}},
            "hyper.mixing",
            "'sinkorn' is not one of identity, diagonal, sinkhorn, static, dynamic (did you mean 'sinkhorn'?)",
        ),
        (
            {"family": "mhc", "hyper": {"every": "loop"}},
            "hyper.every",
            "every: loop needs a looped middle block (layers.middle > 0, loops > 1)",
        ),
        (
            {"family": "hc", "hyper": {"mixing": "static", "tanh": False}},
            "hyper.tanh",
            "tanh squashes the dynamic part of HC (mixing: dynamic); mixing static has none",
        ),
        (
            {"family": "looped", "hyper": {"streams": 4}},
            "injection",
            "a looped model with a hyper section needs injection: hyper, got none",
        ),
        (
            {"injection": "hyper", "layers": {"begin": 1, "middle": 2}, "loops": 2},
            "hyper",
            "injection: hyper needs a hyper section (streams, every, mixing)",
        ),
        (
            {"ffn": {"ratio": 2, "d_ff": 100}, "d_model": 64},
            "ffn.d_ff",
            "ffn.d_ff 100 disagrees with ffn.ratio (gives 128); give one of them",
        ),
        ({"tie_embeddings": "yes"}, "tie_embeddings", "expected true or false, got 'yes'"),
        ({"layers": {"begin": 0}}, "layers", "the model needs at least one layer"),
        ({"head_dim": 15}, "head_dim", "head_dim 15 must be even for rotary embeddings"),
    ],
)
def test_errors_name_the_key_and_the_reason(raw, key, message):
    with pytest.raises(SpecError) as e:
        ArchSpec.from_dict(raw)
    assert e.value.key == key
    assert e.value.reason == message
    assert str(e.value) == f"{key}: {message}"
