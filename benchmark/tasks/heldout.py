"""Two offline lm-eval tasks cut from held-out text, so any checkpoint can be scored without a download.

    <name>_cloze    LAMBADA-style (Paperno et al. 2016; lm-eval's lambada_openai): a passage with
                    its last word removed; acc = the word is the greedy continuation (every one of
                    its tokens is the argmax), plus its perplexity.
    <name>_choice   HellaSwag-style (Zellers et al. 2019): a passage and four candidate next
                    sentences, the true one and the true next sentences of three other held-out
                    documents of the same corpus part; acc and acc_norm (per-byte) of the argmax.

Passages are whole sentences from the start of a document, whitespace collapsed to single spaces
(so every task shares one word separator), at most `max_words` words so they fit the context of a
small model. Examples are drawn round-robin from the corpus parts (wiki, bible, poetry), so no part
dominates; one seed gives byte-identical files.

`make_tasks` writes <name>_cloze.jsonl, <name>_choice.jsonl and one YAML per task that names its
data file by absolute path; lm-eval finds them with `--include_path OUT_DIR`
(or `TaskManager(include_path=OUT_DIR)`).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from benchmark.data import DataConfig, load_corpus

# ~1.3 BPE tokens per English word: 60 words is ~80 tokens, well inside a 256-token training window.
MAX_WORDS = 60
N_CHOICES = 4
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# LAMBADA's target is a plain word; trailing punctuation and closing quotes are dropped with it.
LAST_WORD = re.compile(r" ([A-Za-z]+)[^A-Za-z0-9\s]*$")

Example = dict[str, Any]


def make_tasks(
    out_dir: str | Path,
    source: str | DataConfig | Iterable[str] = DataConfig.source,
    *,
    n_examples: int = 500,
    seed: int = 0,
    max_words: int = MAX_WORDS,
    name: str = "shapebench",
) -> list[str]:
    """Write both tasks into out_dir and return their names. `source` is a data source (as
    DataConfig.source: its validation split is used) or the held-out texts themselves."""
    if n_examples < 1:
        raise ValueError(f"n_examples must be at least 1, got {n_examples}")
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    parts = held_out(source)
    rng = random.Random(seed)
    provenance = {"source": _describe(source), "seed": seed, "max_words": max_words}
    tasks = {
        f"{name}_cloze": interleave([_part_cloze(p, max_words) for p in parts], n_examples, rng),
        f"{name}_choice": interleave(
            [_part_choice(p, max_words, rng) for p in parts], n_examples, rng
        ),
    }
    for task, examples in tasks.items():
        if not examples:
            raise ValueError(
                f"{task}: no document of {provenance['source']} yields an example "
                f"(passages need whole sentences of at most {max_words} words)"
            )
        data = out / f"{task}.jsonl"
        data.write_text(
            "".join(json.dumps(ex, sort_keys=True) + "\n" for ex in examples), encoding="utf-8"
        )
        config = task_config(task, data, name, {**provenance, "n_examples": len(examples)})
        (out / f"{task}.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return list(tasks)


def held_out(source: str | DataConfig | Iterable[str]) -> list[list[str]]:
    """Held-out documents grouped by corpus part, whitespace collapsed."""
    if isinstance(source, (str, DataConfig)):
        corpus = load_corpus(
            source if isinstance(source, DataConfig) else DataConfig(source=source)
        )
        groups = [
            [text for _, text in corpus.documents(part, "validation")] for part in corpus.parts
        ]
    else:
        groups = [list(source)]
    return [[" ".join(text.split()) for text in group] for group in groups]


def _describe(source: str | DataConfig | Iterable[str]) -> str:
    if isinstance(source, DataConfig):
        return source.source
    return source if isinstance(source, str) else "texts"


def passage(text: str, max_words: int, keep: Callable[[list[str]], bool]) -> list[str] | None:
    """The longest run of leading sentences with at most max_words words that `keep` accepts."""
    sentences = SENTENCE_END.split(text)
    k, words = 0, 0
    while k < len(sentences) and words + len(sentences[k].split()) <= max_words:
        words += len(sentences[k].split())
        k += 1
    return next((sentences[:j] for j in range(k, 0, -1) if keep(sentences[:j])), None)


def cloze(text: str, max_words: int) -> Example | None:
    found = passage(text, max_words, lambda s: LAST_WORD.search(s[-1]) is not None)
    if found is None:
        return None
    joined = " ".join(found)
    match = LAST_WORD.search(joined)
    return {"context": joined[: match.start()], "target": match.group(1)}


def _part_cloze(texts: list[str], max_words: int) -> list[Example]:
    return [ex for ex in (cloze(t, max_words) for t in texts) if ex is not None]


def _part_choice(texts: list[str], max_words: int, rng: random.Random) -> list[Example]:
    """Context = leading sentences, ending = the next one; distractors are the endings of other
    documents of this part, so style alone does not give the answer away."""
    pairs = []
    for text in texts:
        # The context keeps at least one sentence back: the passage is context + ending.
        found = passage(text, max_words, lambda s: len(s) >= 2)
        if found is not None:
            pairs.append((" ".join(found[:-1]), found[-1]))
    endings = sorted({ending for _, ending in pairs})
    if len(endings) < N_CHOICES:
        return []
    examples = []
    for context, ending in pairs:
        others = rng.sample([e for e in endings if e != ending], N_CHOICES - 1)
        label = rng.randrange(N_CHOICES)
        examples.append(
            {
                "context": context,
                "choices": others[:label] + [ending] + others[label:],
                "label": label,
            }
        )
    return examples


def interleave(groups: list[list[Example]], n: int, rng: random.Random) -> list[Example]:
    """Up to n examples, shuffled within each group and taken from the groups in turn."""
    queues = [rng.sample(group, len(group)) for group in groups]
    out: list[Example] = []
    while len(out) < n and any(queues):
        out.extend(q.pop() for q in queues if q)
    return out[:n]


def task_config(task: str, data: Path, tag: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """An lm-eval task YAML as a dict. The json builder reads the local file; its Arrow cache goes
    next to it, so generating and running the tasks never touches the Hub or ~/.cache."""
    config: dict[str, Any] = {
        "task": task,
        "tag": [tag],
        "dataset_path": "json",
        "dataset_kwargs": {
            "data_files": {"test": str(data)},
            "cache_dir": str(data.parent / "hf-cache"),
        },
        "test_split": "test",
        "doc_to_text": "context",
    }
    if task.endswith("_cloze"):
        config |= {
            "output_type": "loglikelihood",
            "doc_to_target": "{{' ' + target}}",  # the word with its separator, as lambada_openai
            "metric_list": [
                {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                {"metric": "perplexity", "aggregation": "perplexity", "higher_is_better": False},
            ],
        }
    else:
        config |= {
            "output_type": "multiple_choice",
            "doc_to_choice": "choices",
            "doc_to_target": "label",
            "metric_list": [
                {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
            ],
        }
    return config | {"metadata": {"version": 1.0, **metadata}}
