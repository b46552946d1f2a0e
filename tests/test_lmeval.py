"""The lm-eval adapter and the offline held-out tasks: scores equal the model's own log-probs,
rolling windows, greedy stops, deterministic task files, and a trained model beating an untrained
one through lm_eval.simple_evaluate with the network switched off."""

import os

# Before lm-eval or datasets are imported: they read these once.
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"

import json
import random
import socket
import subprocess
import sys

import lm_eval
import pytest
import torch
import torch.nn.functional as F
import yaml
from lm_eval.api.instance import Instance
from lm_eval.tasks import TaskManager

from benchmark import build_model
from benchmark.data import DataConfig, load_corpus, prepare
from benchmark.lmeval import ShapebenchLM
from benchmark.recipe import TrainConfig
from benchmark.tasks import make_tasks
from benchmark.trial.run import run_trial

ANIMALS = "cat dog fox owl hen pig cow bee".split()
# Each action fixes its preposition and place, so the last word of a sentence is predictable; the
# actions follow one another in this cycle, so a document's next sentence is predictable too.
ACTIONS = [
    ("sat", "on", "mat"),
    ("ran", "up", "hill"),
    ("slept", "in", "bed"),
    ("swam", "across", "lake"),
    ("hid", "under", "log"),
    ("sang", "by", "tree"),
]
ADJECTIVES = "big small red old".split()
SEQ_LEN = 32
SPEC = {
    "family": "transformer",
    "d_model": 32,
    "n_heads": 2,
    "vocab_size": 320,
    "layers": {"begin": 2},
}
TASKS = ["shapebench_cloze", "shapebench_choice"]


def story(rng: random.Random) -> str:
    animal, first = rng.choice(ANIMALS), rng.randrange(len(ACTIONS))
    sentences = []
    for i in range(rng.randint(3, 6)):
        verb, prep, place = ACTIONS[(first + i) % len(ACTIONS)]
        sentences.append(f"The {animal} {verb} {prep} the {rng.choice(ADJECTIVES)} {place}.")
    return " ".join(sentences)


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refuse(self, address, *args):
        raise AssertionError(f"network access attempted: {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("stories")
    rng = random.Random(0)
    (root / "stories.txt").write_text("\n\n".join(story(rng) for _ in range(300)))
    # A fifth held out: ~60 stories to draw task examples from.
    cfg = DataConfig(
        source=str(root / "stories.txt"),
        tokenizer="bpe:320",
        val_fraction=0.2,
        cache_dir=str(root / "cache"),
    )
    return cfg, prepare(cfg)


@pytest.fixture(scope="module")
def checkpoint(corpus, tmp_path_factory):
    path = tmp_path_factory.mktemp("ck") / "trained"
    train = TrainConfig(
        tokens="60K",
        seq_len=SEQ_LEN,
        batch_size=16,
        lr=1e-2,
        compile=False,
        precision="fp32",
        eval_tokens=512,
        seed=0,
    )
    row = run_trial(SPEC, train, data=corpus[1], checkpoint_dir=path)
    assert row["status"] == "ok"
    return path


@pytest.fixture(scope="module")
def tasks_dir(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("tasks")
    assert make_tasks(out, corpus[0], n_examples=40, seed=0) == TASKS
    return out


@pytest.fixture
def random_lm(corpus):
    torch.manual_seed(0)
    # fp32: the tests compare the batched scoring with fp32 forwards of their own; `auto` would
    # choose bf16 on a CPU where it is faster (avx512_bf16, AMX), a precision question, not scoring's
    return ShapebenchLM(
        model=build_model(SPEC),
        tokenizer=corpus[1].tokenizer,
        max_length=SEQ_LEN,
        batch_size=3,
        device="cpu",
        precision="fp32",
    )


def scores(results: dict) -> dict[str, float]:
    return {
        f"{task}/{metric}": results["results"][task][f"{metric},none"]
        for task, metric in [(TASKS[0], "acc"), (TASKS[1], "acc"), (TASKS[1], "acc_norm")]
    }


# --- through lm-eval ---------------------------------------------------------------------------


def test_trained_model_beats_untrained_on_the_offline_tasks(checkpoint, tasks_dir, random_lm):
    manager = TaskManager(include_path=str(tasks_dir), include_defaults=False)
    run = dict(tasks=TASKS, task_manager=manager, bootstrap_iters=0, log_samples=False)
    # By registered name, as the lm_eval command line does; its batch_size=1 must not clash.
    trained = scores(
        lm_eval.simple_evaluate(
            model="shapebench",
            model_args=f"checkpoint={checkpoint},batch_size=8",
            batch_size=1,
            device="cpu",
            **run,
        )
    )
    untrained = scores(lm_eval.simple_evaluate(model=random_lm, **run))
    print(f"trained {trained}\nuntrained {untrained}")
    # Measured: trained 1.0 / 1.0 / 0.95, untrained 0.0 / 0.175 / 0.15 (chance is 0.25).
    assert trained[f"{TASKS[0]}/acc"] >= 0.9 and untrained[f"{TASKS[0]}/acc"] <= 0.1
    assert trained[f"{TASKS[1]}/acc"] >= 0.8 and untrained[f"{TASKS[1]}/acc"] <= 0.5


@pytest.mark.slow  # ~10-25 s: the command line indexes all of lm-eval's built-in tasks
def test_command_line_runs_the_registered_model(checkpoint, tasks_dir):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmark.lmeval",
            "--model",
            "shapebench",
            "--model_args",
            f"checkpoint={checkpoint},batch_size=8",
            "--device",
            "cpu",
            "--tasks",
            TASKS[0],
            "--include_path",
            str(tasks_dir),
            "--limit",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"|{TASKS[0]}" in out.stdout.replace(" ", "") and "acc" in out.stdout


# --- exact scores ------------------------------------------------------------------------------


def request(kind: str, *args) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


def direct_log_prob(lm: ShapebenchLM, context: list[int], target: list[int]) -> tuple[float, bool]:
    """log P(target | context) token by token, one unpadded forward pass per token."""
    total, greedy = 0.0, True
    for i, token in enumerate(target):
        ids = context + target[:i]
        assert len(ids) <= lm.max_length
        logp = F.log_softmax(lm.model(torch.tensor([ids]))[0, -1].double(), dim=-1)
        total += logp[token].item()
        greedy &= int(logp.argmax()) == token
    return total, greedy


def test_loglikelihood_is_the_sum_of_token_log_probs(random_lm):
    enc, eot = random_lm.tokenizer.encode, random_lm.eot_token_id
    pairs = [
        ("The cat sat on the", " big mat."),
        ("The", " owl"),
        ("", "The hen sang by the tree."),
        (" ".join(["The fox hid under the old log."] * 6), " The fox sang"),
    ]  # ~50 tokens: truncated
    got = random_lm.loglikelihood([request("loglikelihood", *pair) for pair in pairs])
    for (context, continuation), (logprob, greedy) in zip(pairs, got):
        target = enc(context + continuation)[len(enc(context)) :]
        # A long context loses its start: context and continuation fit in max_length + 1 tokens.
        kept = [eot, *enc(context)][-(random_lm.max_length + 1 - len(target)) :]
        want, want_greedy = direct_log_prob(random_lm, kept, target)
        assert logprob == pytest.approx(want, rel=1e-5, abs=1e-5) and greedy == want_greedy


def test_rolling_loglikelihood_covers_every_token_once(random_lm):
    enc, eot, T = random_lm.tokenizer.encode, random_lm.eot_token_id, random_lm.max_length
    short, long = "The cat sat on the mat.", " ".join(story(random.Random(1)) for _ in range(3))
    tokens = enc(long)
    assert len(tokens) > 3 * T
    got_short, got_long = random_lm.loglikelihood_rolling(
        [request("loglikelihood_rolling", t) for t in (short, long)]
    )
    assert got_short == pytest.approx(direct_log_prob(random_lm, [eot], enc(short))[0], rel=1e-5)
    # Disjoint chunks of T tokens; each is scored after as many earlier tokens as fit in T.
    stream, want = [eot, *tokens], 0.0
    for start in range(0, len(tokens), T):
        end = min(start + T, len(tokens))
        window = stream[max(0, end - T) : end + 1]
        logp = F.log_softmax(random_lm.model(torch.tensor([window[:-1]]))[0].double(), dim=-1)
        want += sum(
            logp[i, window[i + 1]].item()
            for i in range(len(window) - 1 - (end - start), len(window) - 1)
        )
    assert got_long == pytest.approx(want, rel=1e-5)


# --- generation --------------------------------------------------------------------------------


def test_generate_until_stops_at_the_stop_string(checkpoint):
    lm = ShapebenchLM(checkpoint, batch_size=2, device="cpu")
    steps = []
    forward = lm.logits
    lm.logits = lambda rows: steps.append(len(rows)) or forward(rows)
    contexts = ["The cat sat on the big", "The dog ran up the old hill. The dog slept in the"]
    free = lm.generate_until(
        [request("generate_until", c, {"max_gen_toks": 10, "until": []}) for c in contexts]
    )
    assert steps == [2] * 10  # both rows batched, ten tokens each
    assert free[0].startswith(" mat. The cat ran up the")
    steps.clear()
    stopped = lm.generate_until(
        [request("generate_until", contexts[0], {"max_gen_toks": 10, "until": ["."]})]
    )
    assert stopped == [" mat"]
    assert len(steps) == len(lm.tokenizer.encode(" mat."))  # stopped as soon as "." appeared
    alone = lm.generate_until(
        [request("generate_until", contexts[1], {"max_gen_toks": 10, "until": "\n"})]
    )
    assert alone == free[1:]  # batching and padding change nothing
    with pytest.raises(ValueError, match="only greedy decoding"):
        lm.generate_until([request("generate_until", contexts[0], {"do_sample": True})])


# --- construction ------------------------------------------------------------------------------


def test_model_args_and_their_errors(checkpoint, corpus):
    lm = ShapebenchLM.create_from_arg_string(
        f"checkpoint={checkpoint},loops=2,batch_size=8",
        {"batch_size": 1, "device": "cpu", "max_batch_size": None},
    )
    assert (lm.batch_size, lm.loops, lm.max_length, str(lm.device)) == (8, 2, SEQ_LEN, "cpu")
    assert lm.get_model_info()["tokenizer_id"] == corpus[1].tokenizer.tokenizer_id
    with pytest.raises(ValueError, match="pass checkpoint=PATH, or both model and tokenizer"):
        ShapebenchLM()
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 'auto'"):
        ShapebenchLM(checkpoint, batch_size="auto")
    with pytest.raises(ValueError, match="max_length .* is required"):
        ShapebenchLM(model=lm.model, tokenizer=lm.tokenizer)


# --- the task files ----------------------------------------------------------------------------


def test_tasks_are_deterministic_and_come_from_held_out_text(corpus, tasks_dir, tmp_path):
    cfg = corpus[0]
    make_tasks(tmp_path / "again", cfg, n_examples=40, seed=0)
    make_tasks(tmp_path / "other", cfg, n_examples=40, seed=1)
    for task in TASKS:
        data = (tasks_dir / f"{task}.jsonl").read_text()
        assert (tmp_path / "again" / f"{task}.jsonl").read_text() == data
        assert (tmp_path / "other" / f"{task}.jsonl").read_text() != data
        config = yaml.safe_load((tasks_dir / f"{task}.yaml").read_text())
        assert config["dataset_kwargs"]["data_files"]["test"] == str(tasks_dir / f"{task}.jsonl")
    stories = load_corpus(cfg)
    held_out = [text for _, text in stories.documents(stories.parts[0], "validation")]
    make_tasks(
        tmp_path / "texts", held_out, n_examples=40, seed=0
    )  # the texts themselves: the same examples
    for task in TASKS:
        assert (tmp_path / "texts" / f"{task}.jsonl").read_text() == (
            tasks_dir / f"{task}.jsonl"
        ).read_text()
    cloze = [
        json.loads(line) for line in (tasks_dir / f"{TASKS[0]}.jsonl").read_text().splitlines()
    ]
    choice = [
        json.loads(line) for line in (tasks_dir / f"{TASKS[1]}.jsonl").read_text().splitlines()
    ]
    assert len(cloze) == len(choice) == 40
    for ex in cloze:
        assert ex["target"] in {place for _, _, place in ACTIONS}
        assert any(doc.startswith(f"{ex['context']} {ex['target']}.") for doc in held_out)
    for ex in choice:
        assert len(set(ex["choices"])) == 4
        assert any(
            doc.startswith(f"{ex['context']} {ex['choices'][ex['label']]}") for doc in held_out
        )
    assert len({ex["label"] for ex in choice}) == 4
