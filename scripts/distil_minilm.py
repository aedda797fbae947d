"""Build `agents/knowledge/minilm/static.npy` and `static.scale.npy`, the router's static embedding
(`agents.knowledge.static`), from the bundled MiniLM itself: nothing to download.

Run once by a maintainer, after any change to the model (offline, about ten seconds on one core):

    python scripts/distil_minilm.py [DIMS]

As model2vec distils a sentence model: every entry of MiniLM's vocabulary goes through the model alone
(`[CLS] token [SEP]`, batched) and its mean-pooled output is that token's vector; PCA to DIMS (256) dimensions
drops the directions the table hardly uses; each row is weighted by an estimate of how rare its token is (SIF,
`a / (a + p)`, p from Zipf's law on the token's rank, the vocabulary being in about frequency order), so that
"the", "my" or "?" weigh little in a message's mean; special and `[unused]` entries are zero rows. Stored int8
with one float32 scale per row (the weight folded into the scale).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from agents.knowledge.local import MODEL_DIR, MiniLM
from agents.knowledge.static import SCALE_FILE, TABLE_FILE

DIMS = 256
SIF = 1e-4
"""model2vec's coefficient: a token weighs half when its Zipf probability is 1e-4 (about rank 800 here)."""
BATCH = 1024


def token_vectors(model: MiniLM) -> np.ndarray:
    vocab = model.tokenizer.get_vocab_size()
    cls, sep = model.tokenizer.token_to_id("[CLS]"), model.tokenizer.token_to_id("[SEP]")
    out = np.zeros((vocab, model.dim), dtype=np.float32)
    for start in range(0, vocab, BATCH):
        ids = np.arange(start, min(vocab, start + BATCH), dtype=np.int64)
        tokens = np.stack([np.full_like(ids, cls), ids, np.full_like(ids, sep)], axis=1)
        out[ids] = model.encode_ids(tokens, np.ones(tokens.shape, dtype=bool))
    return out


def distil(vectors: np.ndarray, special: np.ndarray, dims: int = DIMS, sif: float = SIF) -> np.ndarray:
    """The weighted, reduced table (float32); `special` marks the rows that count for nothing."""
    kept = vectors[~special]
    mean = kept.mean(0)
    _, _, components = np.linalg.svd(kept - mean, full_matrices=False)
    reduced = (vectors - mean) @ components[:dims].T
    inverse_rank = 1.0 / np.arange(2, len(vectors) + 2)
    weight = sif / (sif + inverse_rank / inverse_rank.sum())
    reduced *= weight[:, None]
    reduced[special] = 0.0
    table: np.ndarray = reduced.astype(np.float32)
    return table


def special_rows(model: MiniLM) -> np.ndarray:
    vocab = model.tokenizer.get_vocab()
    special = np.zeros(model.tokenizer.get_vocab_size(), dtype=bool)
    for token, i in vocab.items():
        if token.startswith("[") and token.endswith("]"):  # [PAD], [UNK], [CLS], [SEP], [MASK], [unused0..993]
            special[i] = True
    return special


def quantised(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scale = np.abs(table).max(1) / 127.0
    safe = np.where(scale > 0, scale, 1.0)
    rows = np.round(table / safe[:, None]).astype(np.int8)
    return rows, scale.astype(np.float32)


def main() -> None:
    dims = int(sys.argv[1]) if len(sys.argv) > 1 else DIMS
    model = MiniLM(MODEL_DIR)
    rows, scale = quantised(distil(token_vectors(model), special_rows(model), dims))
    np.save(MODEL_DIR / TABLE_FILE, rows)
    np.save(MODEL_DIR / SCALE_FILE, scale)
    for name in (TABLE_FILE, SCALE_FILE):
        print(f"{Path(MODEL_DIR / name)}: {(MODEL_DIR / name).stat().st_size} bytes")


if __name__ == "__main__":
    main()
