"""A tiny trial the trial and curve tests train (imported as `tiny_trial`: pytest puts tests/ on
the path): a small looped spec and settings that train it in seconds on the `grammar_corpus`
fixture (conftest.py)."""

SPEC = {
    "family": "looped",
    "d_model": 32,
    "n_heads": 2,
    "vocab_size": 300,
    "layers": {"begin": 1, "middle": 1, "end": 1},
    "loops": 2,
    "eval_loops": [1, 2, 3],
}
CFG = dict(
    tokens="20K",
    seq_len=32,
    batch_size=8,
    lr=3e-3,
    compile=False,
    precision="fp32",
    eval_tokens=1024,
)
