"""Corpus sources, tokenizers, the token cache and batches. Other packages import from here."""

from benchmark.data.corpus import DataConfig, PreparedData, batches, cache_root, eval_sets, load_corpus, prepare

__all__ = ["DataConfig", "PreparedData", "batches", "cache_root", "eval_sets", "load_corpus", "prepare"]
