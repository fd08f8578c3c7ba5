#!/usr/bin/env python3
"""Capture the real `tools/list` of the pinned test peers into one JSON fixture.

Usage (after tests/peers/install.sh):
  tests/peers/capture_tools.py > gateway-edge/src/mcp/builtin/tool_search/peer_tools.json

Starts each peer over stdio with the stdlib probe (stdio_probe.Peer), sends `initialize`,
`notifications/initialized` and `tools/list` (following `nextCursor`), and prints
`{"captured_with": ..., "servers": [{"server", "package", "tools": [...]}]}` with every tool
exactly as the peer listed it, in the order it listed them. The server names are the ones the
e2e tests register the peers under (`everything`, `fs`, `time`, `git`), so a tool's exposed name
is `<server>__<tool>`. The tool-search labelled set (`tool_search/questions.json`) is judged over
this file, so it runs without the peers; re-capture when a peer's pin changes.
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from stdio_probe import Peer, ProbeError  # noqa: E402

NM = os.path.join(HERE, "node_modules")
EVERYTHING = os.path.join(NM, "@modelcontextprotocol/server-everything/dist/index.js")
FILESYSTEM = os.path.join(NM, "@modelcontextprotocol/server-filesystem/dist/index.js")
VENV = os.path.join(HERE, ".venv-mcp1", "bin")


def package_version(path):
    with open(os.path.join(path, "package.json")) as f:
        return json.load(f)["version"]


def pinned(req, name):
    with open(os.path.join(HERE, req)) as f:
        for line in f:
            if line.startswith(name + "=="):
                return line.strip().split("==", 1)[1]
    return "?"


def tools_of(cmd):
    peer = Peer(cmd, 60)
    try:
        r = peer.request(1, "initialize", {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "coffer-capture-tools", "version": "0"},
        })
        if "error" in r:
            raise ProbeError("initialize failed: %s" % json.dumps(r["error"]))
        peer.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        tools, cursor, next_id = [], None, 2
        while True:
            r = peer.request(next_id, "tools/list", {"cursor": cursor} if cursor else {})
            next_id += 1
            if "error" in r:
                raise ProbeError("tools/list failed: %s" % json.dumps(r["error"]))
            tools.extend(r["result"].get("tools", []))
            cursor = r["result"].get("nextCursor")
            if not cursor:
                return tools
    finally:
        peer.close()


def main():
    tmp = tempfile.mkdtemp(prefix="coffer-capture-")
    subprocess.run(["git", "init", "-q", os.path.join(tmp, "repo")], check=True)
    node = "node"
    servers = [
        ("everything", "npm @modelcontextprotocol/server-everything " + package_version(
            os.path.join(NM, "@modelcontextprotocol/server-everything")), [node, EVERYTHING, "stdio"]),
        ("fs", "npm @modelcontextprotocol/server-filesystem " + package_version(
            os.path.join(NM, "@modelcontextprotocol/server-filesystem")), [node, FILESYSTEM, tmp]),
        ("time", "PyPI mcp-server-time " + pinned("requirements-mcp1.txt", "mcp-server-time"),
         [os.path.join(VENV, "mcp-server-time"), "--local-timezone", "UTC"]),
        ("git", "PyPI mcp-server-git " + pinned("requirements-mcp1.txt", "mcp-server-git"),
         [os.path.join(VENV, "mcp-server-git"), "--repository", os.path.join(tmp, "repo")]),
    ]
    out = {
        "captured_with": "tests/peers/capture_tools.py (initialize 2025-11-25, tools/list over stdio)",
        "servers": [{"server": s, "package": p, "tools": tools_of(cmd)} for s, p, cmd in servers],
    }
    json.dump(out, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
