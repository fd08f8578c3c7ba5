#!/usr/bin/env python3
"""What TCP_NODELAY saves on one query embedding: starts bench/embed_server.py with and without
--nagle, sends the same short query N times on one kept-alive HTTP/1.1 connection (as Coffer's
client does), and prints p50/p90 of each and their difference.

Usage: bench/.venv/bin/python bench/embed_latency.py [N]   (N = 100)
"""

import http.client
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUERY = "what similarity laws must be obeyed when constructing aeroelastic models"


def measure(nagle, n):
    args = [sys.executable, str(HERE / "embed_server.py"), "--port", "0"] + (["--nagle"] if nagle else [])
    server = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()  # "listening on 127.0.0.1:<port> …"
        host, port = line.split()[2].split(":")
        conn = http.client.HTTPConnection(host, int(port))
        body = json.dumps({"model": "all-MiniLM-L6-v2", "input": QUERY})
        times = []
        for i in range(n + 5):
            t = time.perf_counter()
            conn.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            if i >= 5:  # warm-up
                times.append((time.perf_counter() - t) * 1e3)
        times.sort()
        return statistics.median(times), times[int(len(times) * 0.9)]
    finally:
        server.kill()
        server.wait()


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    on = measure(True, n)
    off = measure(False, n)
    print(f"| one query embedding, {n} requests on one connection | p50 | p90 |")
    print("|---|---|---|")
    print(f"| Nagle on (before) | {on[0]:.1f} ms | {on[1]:.1f} ms |")
    print(f"| TCP_NODELAY (after) | {off[0]:.1f} ms | {off[1]:.1f} ms |")
    print(f"| saved | {on[0] - off[0]:.1f} ms | {on[1] - off[1]:.1f} ms |")


if __name__ == "__main__":
    main()
