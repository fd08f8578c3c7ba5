#!/usr/bin/env python3
"""Minimal MCP stdio probe (stdlib only): initialize + tools/list [+ tools/call].

Usage:
  stdio_probe.py [--timeout S] [--expect-tool NAME]... [--call NAME --args JSON]
                 [--discover] [--protocol-version V] -- CMD [ARGS...]

Spawns CMD, speaks newline-delimited JSON-RPC on its stdin/stdout, and prints
one JSON object summarising the round trip:
  {"serverInfo": ..., "protocolVersion": ..., "tools": [...], "call": ...,
   "discover": ...}
Exits 1 (with the reason on stderr) on timeout, EOF, a JSON-RPC error, or a
missing --expect-tool. Used by install.sh to check every stdio peer starts.
"""

import argparse
import json
import os
import selectors
import subprocess
import sys
import time


class ProbeError(Exception):
    pass


class Peer:
    def __init__(self, cmd, timeout):
        self.deadline = time.monotonic() + timeout
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ, "out")
        self.sel.register(self.proc.stderr, selectors.EVENT_READ, "err")
        self.buf = b""
        self.stderr = b""
        self.notifications = []

    def send(self, msg):
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def _read_line(self):
        while b"\n" not in self.buf:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise ProbeError("timed out waiting for the server")
            for key, _ in self.sel.select(timeout=left):
                chunk = os.read(key.fileobj.fileno(), 65536)
                if key.data == "err":
                    self.stderr += chunk
                    if not chunk:
                        self.sel.unregister(key.fileobj)
                    continue
                if not chunk:
                    raise ProbeError("server closed stdout (exit code %s)" % self.proc.poll())
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def wait_response(self, req_id):
        while True:
            line = self._read_line().strip()
            if not line:
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                raise ProbeError("non-JSON line on stdout: %r" % line[:200])
            if msg.get("id") == req_id and ("result" in msg or "error" in msg):
                return msg
            if "method" in msg and "id" in msg:
                # Server-to-client request (e.g. roots/list): we declare no
                # capabilities, so answer method-not-found.
                self.send({"jsonrpc": "2.0", "id": msg["id"],
                           "error": {"code": -32601, "message": "Method not found"}})
            elif "method" in msg:
                self.notifications.append(msg["method"])

    def request(self, req_id, method, params=None):
        msg = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        return self.wait_response(req_id)

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--protocol-version", default="2025-11-25")
    ap.add_argument("--expect-tool", action="append", default=[])
    ap.add_argument("--call")
    ap.add_argument("--args", default="{}")
    ap.add_argument("--discover", action="store_true",
                    help="send server/discover first and report the answer")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd:
        ap.error("missing server command after --")

    try:
        peer = Peer(cmd, a.timeout)
    except OSError as e:
        print("stdio_probe: cannot start %s: %s" % (cmd[0], e), file=sys.stderr)
        return 1
    out = {}
    try:
        next_id = 1
        if a.discover:
            r = peer.request(next_id, "server/discover", {"_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28"}})
            out["discover"] = r.get("error") or r.get("result")
            next_id += 1
        r = peer.request(next_id, "initialize", {
            "protocolVersion": a.protocol_version,
            "capabilities": {},
            "clientInfo": {"name": "coffer-stdio-probe", "version": "0"},
        })
        next_id += 1
        if "error" in r:
            raise ProbeError("initialize failed: %s" % json.dumps(r["error"]))
        out["protocolVersion"] = r["result"].get("protocolVersion")
        out["serverInfo"] = r["result"].get("serverInfo")
        peer.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        r = peer.request(next_id, "tools/list", {})
        next_id += 1
        if "error" in r:
            raise ProbeError("tools/list failed: %s" % json.dumps(r["error"]))
        names = [t["name"] for t in r["result"].get("tools", [])]
        out["tools"] = names
        missing = [t for t in a.expect_tool if t not in names]
        if missing:
            raise ProbeError("expected tool(s) %s not in %s" % (missing, names))
        if a.call:
            r = peer.request(next_id, "tools/call",
                             {"name": a.call, "arguments": json.loads(a.args)})
            if "error" in r:
                raise ProbeError("tools/call %s failed: %s" % (a.call, json.dumps(r["error"])))
            out["call"] = r["result"]
        out["notifications"] = peer.notifications
    except ProbeError as e:
        peer.close()
        tail = peer.stderr.decode(errors="replace").strip()[-800:]
        print("stdio_probe: %s: %s%s" % (cmd[0], e, ("\n--- server stderr ---\n" + tail) if tail else ""),
              file=sys.stderr)
        return 1
    peer.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
