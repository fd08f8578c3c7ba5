"""A tiny MCP server on the Python mcp 1.x SDK (FastMCP) speaking the legacy HTTP+SSE transport
of MCP 2024-11-05, for Coffer's tests of legacy upstreams.

Run with tests/peers/.venv-mcp1/bin/python:
    sse_server.py PORT [PATH]   (GET http://127.0.0.1:PORT/PATH, default /sse, opens the stream,
                                 whose `endpoint` event names /messages/?session_id=…; a POST
                                 there is 405; uvicorn prints "Uvicorn running on" on stderr
                                 once it accepts)

Tools:
    echo {message}        -> "Echo: <message>"
"""

from __future__ import annotations

import sys

from mcp.server.fastmcp import FastMCP

server = FastMCP(
    "sse-peer",
    host="127.0.0.1",
    port=int(sys.argv[1]),
    sse_path=sys.argv[2] if len(sys.argv) > 2 else "/sse",
)


@server.tool()
def echo(message: str) -> str:
    """Echoes the message back."""
    return f"Echo: {message}"


if __name__ == "__main__":
    server.run(transport="sse")
