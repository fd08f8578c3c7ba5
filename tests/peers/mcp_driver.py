"""A Python MCP SDK client that Coffer's Rust end-to-end tests drive step by step (mcp 1.x and 2.x).

  .venv-mcpN/bin/python mcp_driver.py [--mode auto] [--listen] --header "X-Coffer-Token: T" http://127.0.0.1:PORT/mcp
  .venv-mcpN/bin/python mcp_driver.py [--sampling TEXT | --sampling-silent] [--elicitation JSON]
                                      [--root URI ...] --stdio -- CMD [ARGS...]

Connects (Streamable HTTP, or stdio with the SDK's own stdio_client; the server gets this
process's COFFER_* and HOME; both SDK majors), prints {"ready": {...}}, then reads one JSON command per stdin
line and answers each, in order, with one JSON line on stdout:
  {"op":"list_tools"}                          -> {"tools":[names]}
  {"op":"call","name":N,"args":{..}}           -> {"result":{..}} | {"error":{"code","message","data"}}
  {"op":"call",...,"progress":true}            the same, with a progress callback: the SDK sends a
                                                  progressToken and each notifications/progress for
                                                  it is an {"event":{"kind":"progress",...}} line
  {"op":"set_level","level":"debug"}           -> {"result":{}}
  {"op":"wire"}                                -> {"wire":[..]} (HTTP only: POSTed methods and
                                                  JSON answers, as the SDK's httpx client saw them)
Meanwhile it prints {"event": {...}} lines as things happen (log messages, notifications, callback
invocations), also while a call is pending. EOF or {"op":"close"} ends the session the SDK's way. mcp 1.x uses ClientSession with the
callbacks asked for; mcp 2.x uses mcp.Client(mode=--mode, cache=None) with the same callbacks (on a
2026-07-28 connection they answer the server's InputRequiredResult input requests), and with
--listen also keeps a subscriptions/listen open for tools list changes ({"event":{"kind":"listen"}}).
--sampling-silent declares sampling but never answers a sampling request (a hung client).
"""

import argparse
import importlib.metadata
import json
import os
import sys

import anyio

SDK = importlib.metadata.version("mcp")
MAJOR = int(SDK.split(".")[0])
wire = []


def dump(obj):
    return obj.model_dump(mode="json", by_alias=True, exclude_none=True) if hasattr(obj, "model_dump") else obj


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def event(**fields):
    emit({"event": fields})


def http_client(a):
    """The SDK's own httpx factory with our headers, plus hooks that record the wire exchange."""
    from mcp.shared._httpx_utils import create_mcp_http_client

    async def on_request(req):
        try:
            wire.append({"sent": json.loads(req.content).get("method")} if req.method == "POST" else {"sent": req.method})
        except Exception:  # noqa: BLE001 - a streamed body: method unknown
            wire.append({"sent": req.method})

    async def on_response(resp):
        entry = {"status": resp.status_code, "content_type": resp.headers.get("content-type", "")}
        if entry["content_type"].startswith("application/json"):
            body = json.loads(await resp.aread() or b"null")
            if isinstance(body, dict) and "error" in body:
                entry["error"] = body["error"]
        wire.append(entry)

    headers = dict(h.split(":", 1) for h in a.header)
    c = create_mcp_http_client(headers={k.strip(): v.strip() for k, v in headers.items()})
    c.event_hooks = {"request": [on_request], "response": [on_response]}
    return c


def v1_callbacks(a):
    from mcp import types

    async def log(params):
        event(kind="log", level=params.level, logger=params.logger, data=params.data)

    async def message(m):
        if isinstance(m, Exception):
            event(kind="exception", text=str(m))
        elif hasattr(m, "root"):
            event(kind="notification", method=m.root.method)

    async def sampling(_ctx, params):
        texts = [getattr(x.content, "text", None) for x in params.messages]
        event(kind="sampling", texts=texts, maxTokens=params.maxTokens)
        return types.CreateMessageResult(role="assistant", model="coffer-test-model", stopReason="endTurn",
                                         content=types.TextContent(type="text", text=a.sampling))

    async def elicitation(_ctx, params):
        event(kind="elicitation", message=params.message)
        return types.ElicitResult(action="accept", content=json.loads(a.elicitation))

    async def roots(_ctx):
        event(kind="roots")
        return types.ListRootsResult(roots=[types.Root(uri=u, name=f"root{i}") for i, u in enumerate(a.root)])

    kw = {"logging_callback": log, "message_handler": message}
    if a.sampling is not None or a.sampling_silent:
        kw["sampling_callback"] = sampling
    if a.elicitation is not None:
        kw["elicitation_callback"] = elicitation
    if a.root:
        kw["list_roots_callback"] = roots
    return kw


async def serve(a, ops, ready):
    """Runs stdin commands against `ops` (list_tools, call_tool, set_logging_level)."""
    emit({"ready": ready})
    stdin = anyio.wrap_file(sys.stdin)
    async for line in stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "close":
                global CLOSING
                CLOSING = True
                return
            if op == "wire":
                out = {"wire": wire}
            elif op == "list_tools":
                out = {"tools": [t.name for t in (await ops.list_tools()).tools]}
            elif op == "call":
                kw = {}
                if cmd.get("progress"):
                    async def progress(value, total, message, name=cmd["name"]):
                        event(kind="progress", tool=name, progress=value, total=total, message=message)
                    kw["progress_callback"] = progress
                out = {"result": dump(await ops.call_tool(cmd["name"], cmd.get("args", {}), **kw))}
            elif op == "set_level":
                out = {"result": dump(await ops.set_logging_level(cmd["level"]))}
            else:
                out = {"error": {"code": None, "message": f"unknown op {op}"}}
        except Exception as e:  # noqa: BLE001 - an MCP error (McpError/MCPError) or anything else
            err = getattr(e, "error", None)
            out = {"error": {"code": getattr(err, "code", None), "message": getattr(err, "message", repr(e)),
                             "data": getattr(err, "data", None)}}
        emit(out)


async def run_v1(a):
    from mcp import ClientSession, StdioServerParameters, types
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client

    class SilentSampling(ClientSession):
        """Receives sampling requests and never answers them."""

        async def _received_request(self, responder):
            if a.sampling_silent and isinstance(responder.request.root, types.CreateMessageRequest):
                event(kind="sampling-ignored")
                return None
            return await super()._received_request(responder)

    async def use(read, write):
        async with SilentSampling(read, write, **v1_callbacks(a)) as s:
            init = await s.initialize()
            await serve(a, s, {"sdk": SDK, "protocolVersion": init.protocolVersion,
                               "serverInfo": dump(init.serverInfo), "capabilities": dump(init.capabilities)})

    if a.stdio:
        env = {k: v for k, v in os.environ.items() if k.startswith("COFFER_") or k == "HOME"}
        params = StdioServerParameters(command=a.target[0], args=a.target[1:], env=env)
        async with stdio_client(params) as (read, write):
            await use(read, write)
    else:
        async with http_client(a) as hc, streamable_http_client(a.target[0], http_client=hc) as (read, write, _):
            await use(read, write)


def v2_callbacks(a):
    """mcp 2.x callbacks (field names are snake_case there); the same events as 1.x."""
    import mcp_types as types

    async def sampling(_ctx, params):
        texts = [getattr(x.content, "text", None) for x in params.messages]
        event(kind="sampling", texts=texts, maxTokens=params.max_tokens)
        if a.sampling_silent:
            event(kind="sampling-ignored")
            await anyio.sleep_forever()
        return types.CreateMessageResult(role="assistant", model="coffer-test-model", stop_reason="endTurn",
                                         content=types.TextContent(type="text", text=a.sampling))

    async def elicitation(_ctx, params):
        event(kind="elicitation", message=params.message)
        return types.ElicitResult(action="accept", content=json.loads(a.elicitation))

    async def roots(_ctx):
        event(kind="roots")
        return types.ListRootsResult(roots=[types.Root(uri=u, name=f"root{i}") for i, u in enumerate(a.root)])

    async def message(m):
        if isinstance(m, Exception):
            event(kind="exception", text=str(m))
        elif hasattr(m, "method"):
            event(kind="notification", method=m.method)

    kw = {"message_handler": message}
    if a.sampling is not None or a.sampling_silent:
        kw["sampling_callback"] = sampling
    if a.elicitation is not None:
        kw["elicitation_callback"] = elicitation
    if a.root:
        kw["list_roots_callback"] = roots
    return kw


async def run_v2(a):
    from mcp import Client, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client

    async def use(target):
        # No response cache: the tests list again right after a change and must see it.
        async with Client(target, mode=a.mode, cache=None, **v2_callbacks(a)) as c:
            async with anyio.create_task_group() as tg:
                if a.listen:
                    tg.start_soon(listen, c)
                await serve(a, c, {"sdk": SDK, "mode": a.mode, "protocolVersion": c.protocol_version,
                                   "serverInfo": dump(c.server_info)})
                tg.cancel_scope.cancel()

    async def listen(c):
        async with c.listen(tools_list_changed=True) as sub:
            event(kind="listening")
            async for ev in sub:
                event(kind="listen", type=type(ev).__name__)

    if a.stdio:
        env = {k: v for k, v in os.environ.items() if k.startswith("COFFER_") or k == "HOME"}
        await use(StdioServerParameters(command=a.target[0], args=a.target[1:], env=env))
    else:
        async with http_client(a) as hc:
            await use(streamable_http_client(a.target[0], http_client=hc))


# Set once the test asked for a clean close: after that, only teardown is left.
CLOSING = False


def _only_teardown_race(e):
    """True for the SDK's known teardown race (python-sdk #1749): after a requested close, its
    stream tasks may raise anyio.BrokenResourceError inside an ExceptionGroup."""
    if isinstance(e, anyio.BrokenResourceError):
        return True
    inner = getattr(e, "exceptions", None)
    return bool(inner) and all(_only_teardown_race(x) for x in inner)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stdio", action="store_true")
    ap.add_argument("--header", action="append", default=[], help='"Name: value" (HTTP only)')
    ap.add_argument("--mode", default="auto", help="mcp 2.x only: auto | legacy | <modern version>")
    ap.add_argument("--sampling", help="answer sampling requests with this text")
    ap.add_argument("--sampling-silent", action="store_true")
    ap.add_argument("--elicitation", help="accept elicitation requests with this JSON content")
    ap.add_argument("--root", action="append", default=[], help="a root URI to list")
    ap.add_argument("--listen", action="store_true", help="mcp 2.x only: subscriptions/listen for tools list changes")
    ap.add_argument("target", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    a.target = a.target[1:] if a.target[:1] == ["--"] else a.target
    if not a.target:
        ap.error("need a URL, or --stdio -- CMD")
    try:
        anyio.run(run_v1 if MAJOR < 2 else run_v2, a)
    except BaseException as e:  # noqa: BLE001 - report anything, incl. ExceptionGroup
        if CLOSING and _only_teardown_race(e):
            print("mcp_driver (mcp %s): ignored the SDK's teardown race after close: %r" % (SDK, e), file=sys.stderr)
            return 0
        print("mcp_driver (mcp %s): %s: %r" % (SDK, type(e).__name__, e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
