"""A tiny MCP server on the Python mcp 2.x SDK, for Coffer's tests of new-era upstreams.

Run with tests/peers/.venv-mcp2/bin/python:
    mcp2_server.py stdio
    mcp2_server.py http --port PORT      (Streamable HTTP on 127.0.0.1:PORT/mcp; prints
                                          "listening on port PORT" on stderr once it accepts)

Tools:
    echo {message}        -> "Echo: <message>"
    greet                 -> asks the client's user for a name (elicitation), "Hello, <name>!"
    ask_model             -> samples the client's LLM, "The model said: <text>"
    add_tool {name}       -> registers a tool <name> (answers "added <name>") and tells
                             subscribers notifications/tools/list_changed

On 2026-07-28 the SDK turns greet's and ask_model's questions into an InputRequiredResult
(multi round-trip requests); on 2025-11-25 into server-to-client requests.
"""

from __future__ import annotations

import argparse
import sys
from typing import Annotated

import anyio
from mcp.server.mcpserver import Context, Elicit, MCPServer, Resolve, Sample
from mcp_types import CreateMessageResult, SamplingMessage, TextContent
from pydantic import BaseModel


class Person(BaseModel):
    name: str


def ask_name() -> Elicit[Person]:
    return Elicit("What is your name?", Person)


def ask_llm() -> Sample:
    return Sample([SamplingMessage(role="user", content=TextContent(type="text", text="Say something"))], max_tokens=32)


server = MCPServer("coffer-mcp2-peer", version="1.0.0")


@server.tool()
def echo(message: str) -> str:
    """Echoes the message back."""
    return f"Echo: {message}"


@server.tool()
def greet(person: Annotated[Person, Resolve(ask_name)]) -> str:
    """Asks the user for a name and greets them."""
    return f"Hello, {person.name}!"


@server.tool()
def ask_model(reply: Annotated[CreateMessageResult, Resolve(ask_llm)]) -> str:
    """Asks the client's model something and reports its answer."""
    content = reply.content
    text = content.text if isinstance(content, TextContent) else str(content)
    return f"The model said: {text}"


@server.tool()
async def add_tool(name: str, ctx: Context) -> str:
    """Registers a new tool called `name` and announces the change."""

    def added() -> str:
        return f"I am {name}"

    server.add_tool(added, name=name, description=f"The {name} tool")
    await ctx.notify_tools_changed()
    return f"added {name}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    if args.transport == "stdio":
        server.run("stdio")
        return
    import uvicorn

    app = server.streamable_http_app(streamable_http_path="/mcp")
    config = uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning")
    uv = uvicorn.Server(config)

    async def serve() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(uv.serve)
            while not uv.started:
                await anyio.sleep(0.05)
            print(f"listening on port {args.port}", file=sys.stderr, flush=True)

    anyio.run(serve)


if __name__ == "__main__":
    main()
