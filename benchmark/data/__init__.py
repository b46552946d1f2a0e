"""Data for a training trial: corpus sources, tokenizers, the token cache and batches. Other
packages import from here; the modules behind it, lowest first:

    packages   data files inside installed packages, found without importing them
    sources    where text comes from (embedded, hf:, local files), as weighted parts of documents
    tokenizer  the `data.tokenizer` forms and the Tokenizer they load
    config     DataConfig (the `data:` settings), cache_root and cache_uri
    corpus     the parts of a source split into train/validation by hash; its fingerprint and id
    mirror     the token cache's copy in the study's storage (a URI), which nodes download
    cache      token arrays cached on disk, and `prepare` (corpus -> tokenizer -> tokens)
    sampling   training batches and fixed evaluation windows, both drawn by the parts' weights

One mixture: training and validation draw the parts by the same weights, which the
dataset id records. `embedded` is wiki, bible and poetry at 1/3 each (by tokens, not by size:
poetry is ~94% of the text); `embedded:wiki,bible` is equal weights over those;
`embedded:wiki=0.5,bible=0.2,poetry=0.3` chooses (relative weights, normalised). An hf: or file
source is one part of weight 1.
"""

from benchmark.data.cache import PreparedData, cached_identity, cached_parts, prepare
from benchmark.data.config import DataConfig, cache_root
from benchmark.data.corpus import load_corpus
from benchmark.data.sampling import batches, eval_sets, passes
from benchmark.data.sources import pinned
from benchmark.data.tokenizer import HF_EOT_CANDIDATES, Tokenizer

__all__ = [
    "HF_EOT_CANDIDATES",
    "DataConfig",
    "PreparedData",
    "Tokenizer",
    "batches",
    "cache_root",
    "cached_identity",
    "cached_parts",
    "eval_sets",
    "load_corpus",
    "passes",
    "pinned",
    "prepare",
]
