#!/usr/bin/env bash
# Issue 36 §2: bytes and tokens (bytes / 4) of a session's first `tools/list` with 10 servers,
# full mode against lazy mode (floor: lazy under 5 % of full). Deterministic: the 10 servers'
# lists are the test peers' captured `tools/list`s (gateway-edge/src/mcp/builtin/tool_rank/
# peer_tools.json), put through the same listing hook a session's `tools/list` calls.
# Prints the markdown table docs/BENCHMARKS.md quotes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
cargo test -q -p coffer-gateway --lib builtin::meta::tests::ten_servers -- --nocapture --test-threads 1 2>&1 \
  | grep -E '^\||^lazy / full'
