"""Python MCP SDK client peer (works with mcp 1.x and 2.x).

Run it with the interpreter of the venv whose SDK you want to exercise:

  .venv-mcp1/bin/python py_client.py http://127.0.0.1:PORT/mcp [--call echo --args '{"message":"hi"}']
  .venv-mcp2/bin/python py_client.py http://127.0.0.1:PORT/mcp [--mode auto|legacy|2026-07-28]
  .venv-mcpN/bin/python py_client.py --stdio -- CMD [ARGS...]

Connects (Streamable HTTP for a URL, stdio with --stdio), lists tools,
optionally calls one, and prints one JSON line:
  {"sdk": "2.3.0", "protocolVersion": "...", "serverInfo": {...},
   "tools": [...], "call": {...}}
mcp 1.x: ClientSession + initialize handshake (mode is ignored).
mcp 2.x: mcp.Client, mode 'auto' by default (server/discover probe, then
falls back to initialize on a legacy server).
Exit code 1 with the error on stderr on any failure.
"""

import argparse
import importlib.metadata
import json
import sys

import anyio

SDK = importlib.metadata.version("mcp")
MAJOR = int(SDK.split(".")[0])


def dump(obj):
    if obj is None:
        return None
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json", by_alias=True, exclude_none=True)
    return obj


async def run_v1(a):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client

    async def use(read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            out = {"sdk": SDK, "protocolVersion": init.protocolVersion,
                   "serverInfo": dump(init.serverInfo)}
            tools = await s.list_tools()
            out["tools"] = [t.name for t in tools.tools]
            if a.call:
                out["call"] = dump(await s.call_tool(a.call, json.loads(a.args)))
            return out

    if a.stdio:
        params = StdioServerParameters(command=a.target[0], args=a.target[1:])
        async with stdio_client(params) as (read, write):
            return await use(read, write)
    async with streamable_http_client(a.target[0]) as (read, write, _sid):
        return await use(read, write)


async def run_v2(a):
    from mcp import Client, StdioServerParameters

    server = (StdioServerParameters(command=a.target[0], args=a.target[1:])
              if a.stdio else a.target[0])
    async with Client(server, mode=a.mode) as c:
        out = {"sdk": SDK, "mode": a.mode, "protocolVersion": c.protocol_version,
               "serverInfo": dump(c.server_info)}
        tools = await c.list_tools()
        out["tools"] = [t.name for t in tools.tools]
        if a.call:
            out["call"] = dump(await c.call_tool(a.call, json.loads(a.args)))
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stdio", action="store_true")
    ap.add_argument("--mode", default="auto", help="mcp 2.x only: auto | legacy | <modern version>")
    ap.add_argument("--call")
    ap.add_argument("--args", default="{}")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("target", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    if a.target and a.target[0] == "--":
        a.target = a.target[1:]
    if not a.target:
        ap.error("missing URL or (with --stdio) server command")

    async def go():
        with anyio.fail_after(a.timeout):
            return await (run_v1(a) if MAJOR < 2 else run_v2(a))

    try:
        out = anyio.run(go)
    except BaseException as e:  # noqa: BLE001 - report anything, incl. ExceptionGroup
        print("py_client (mcp %s): %s: %s" % (SDK, type(e).__name__, e), file=sys.stderr)
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
