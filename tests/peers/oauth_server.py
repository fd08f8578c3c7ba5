"""An OAuth-protected MCP server on the Python mcp 1.x SDK, for Coffer's sign-in tests.

Run with tests/peers/.venv-mcp1/bin/python:
    oauth_server.py --port PORT [--token-ttl SECONDS] [--transport streamable-http|sse]
                    [--step-up SCOPE]

One process is both the authorization server and the resource server, built from the SDK's
`mcp.server.auth` modules: FastMCP with an `OAuthAuthorizationServerProvider` (held in memory
here), `AuthSettings` with dynamic client registration on, and the resource server checking that
each token was issued for its own URL (`validate_token_resource`, RFC 8707). Its endpoints:
    POST /mcp                       Streamable HTTP; 401 + WWW-Authenticate resource_metadata
                                    without a valid token
    (with --transport sse instead: GET /sse opens the legacy HTTP+SSE stream of MCP 2024-11-05,
    POST /messages/?session_id=… takes the messages; both 401 without a valid token, and the
    resource is {base}/sse)
    /.well-known/oauth-protected-resource/mcp (/sse), /.well-known/oauth-authorization-server,
    /register, /authorize, /token   the SDK's
The consent step is automatic: /authorize redirects straight back to the client with a code
(the test drives the "browser" by following that redirect). Test controls (no auth needed):
    POST /test/revoke   forgets every refresh token (a revoked grant)
    POST /test/expire   expires every access token now
    GET  /test/stats    {"registered", "codes_issued", "refreshes", "tokens_issued"}
    GET  /test/tokens   {"issued": [every access and refresh token issued]}
Prints "listening on port PORT" on stderr once it accepts.

Tools: whoami -> "client <client_id> with scopes <scopes>"; echo {message} -> "Echo: <message>".
With --step-up SCOPE also admin -> "admin with scopes <scopes>": a call of it with a token that
lacks SCOPE is answered 403 with `WWW-Authenticate: Bearer error="insufficient_scope",
scope="mcp:tools SCOPE", resource_metadata=…` (MCP 2025-11-25 basic/authorization §Scope
Challenge Handling), and clients may register for SCOPE too.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
import warnings

import anyio
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    OAuthAuthorizationServerProvider,
    RefreshToken,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.fastmcp import FastMCP
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from starlette.requests import Request
from starlette.responses import JSONResponse

SCOPE = "mcp:tools"


class MemoryProvider(OAuthAuthorizationServerProvider[AuthorizationCode, RefreshToken, AccessToken]):
    def __init__(self, token_ttl: int) -> None:
        self.token_ttl = token_ttl
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.stats = {"registered": 0, "codes_issued": 0, "refreshes": 0, "tokens_issued": 0}
        # Every token ever issued, for the test's scan of Coffer's files and logs.
        self.history: list[str] = []

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        self.stats["registered"] += 1
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        code = secrets.token_urlsafe(24)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or [SCOPE],
            expires_at=time.time() + 300,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        self.stats["codes_issued"] += 1
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client, authorization_code: str) -> AuthorizationCode | None:
        code = self.codes.get(authorization_code)
        return code if code is not None and code.client_id == client.client_id else None

    def _issue(self, client_id: str, scopes: list[str], resource: str | None) -> OAuthToken:
        access = "at-" + secrets.token_urlsafe(24)
        refresh = "rt-" + secrets.token_urlsafe(24)
        expires = int(time.time()) + self.token_ttl
        self.access[access] = AccessToken(
            token=access, client_id=client_id, scopes=scopes, expires_at=expires, resource=resource
        )
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes, resource=resource)
        self.stats["tokens_issued"] += 1
        self.history += [access, refresh]
        return OAuthToken(
            access_token=access,
            token_type="Bearer",
            expires_in=self.token_ttl,
            refresh_token=refresh,
            scope=" ".join(scopes),
        )

    async def exchange_authorization_code(self, client, authorization_code: AuthorizationCode) -> OAuthToken:
        self.codes.pop(authorization_code.code, None)
        return self._issue(client.client_id, authorization_code.scopes, authorization_code.resource)

    async def load_refresh_token(self, client, refresh_token: str) -> RefreshToken | None:
        rt = self.refresh.get(refresh_token)
        return rt if rt is not None and rt.client_id == client.client_id else None

    async def exchange_refresh_token(self, client, refresh_token: RefreshToken, scopes: list[str]) -> OAuthToken:
        # Rotation: the refresh token used is spent.
        self.refresh.pop(refresh_token.token, None)
        self.stats["refreshes"] += 1
        return self._issue(client.client_id, scopes or refresh_token.scopes, refresh_token.resource)

    async def load_access_token(self, token: str) -> AccessToken | None:
        at = self.access.get(token)
        if at is None or (at.expires_at is not None and at.expires_at < time.time()):
            return None
        return at

    async def revoke_token(self, token) -> None:
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)


class StepUp:
    """ASGI middleware: a `tools/call` of `admin` whose bearer token lacks `need` is answered
    403 insufficient_scope with the scopes it needs (the granted one and `need`)."""

    def __init__(self, app, provider: MemoryProvider, need: str, metadata_url: str) -> None:
        self.app = app
        self.provider = provider
        self.need = need
        self.metadata_url = metadata_url

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        try:
            rpc = json.loads(body)
        except ValueError:
            rpc = None
        if isinstance(rpc, dict) and rpc.get("method") == "tools/call" and (rpc.get("params") or {}).get("name") == "admin":
            header = dict(scope["headers"]).get(b"authorization", b"").decode()
            token = header[7:] if header.lower().startswith("bearer ") else ""
            at = self.provider.access.get(token)
            if at is not None and self.need not in at.scopes:
                challenge = (
                    f'Bearer error="insufficient_scope", scope="{SCOPE} {self.need}", '
                    f'resource_metadata="{self.metadata_url}", error_description="admin needs {self.need}"'
                )
                await send(
                    {
                        "type": "http.response.start",
                        "status": 403,
                        "headers": [(b"www-authenticate", challenge.encode()), (b"content-type", b"application/json")],
                    }
                )
                await send({"type": "http.response.body", "body": b'{"error": "insufficient_scope"}'})
                return
        await self.app(scope, replay, send)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token-ttl", type=int, default=3600)
    parser.add_argument("--transport", choices=["streamable-http", "sse"], default="streamable-http")
    parser.add_argument("--step-up", default=None)
    args = parser.parse_args()
    base = f"http://127.0.0.1:{args.port}"
    endpoint = "/sse" if args.transport == "sse" else "/mcp"
    provider = MemoryProvider(args.token_ttl)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        auth = AuthSettings(
            issuer_url=base,
            resource_server_url=f"{base}{endpoint}",
            validate_token_resource=True,
            required_scopes=[SCOPE],
            client_registration_options=ClientRegistrationOptions(
                enabled=True,
                valid_scopes=[SCOPE] + ([args.step_up] if args.step_up else []),
                default_scopes=[SCOPE],
            ),
        )
    server = FastMCP("oauth-peer", auth_server_provider=provider, auth=auth, host="127.0.0.1", port=args.port)

    @server.tool()
    def whoami() -> str:
        """Says which OAuth client and scopes the call came with."""
        tok = get_access_token()
        if tok is None:
            return "anonymous"
        return f"client {tok.client_id} with scopes {' '.join(tok.scopes)}"

    @server.tool()
    def echo(message: str) -> str:
        """Echoes the message back."""
        return f"Echo: {message}"

    if args.step_up:

        @server.tool()
        def admin() -> str:
            """Needs the step-up scope."""
            tok = get_access_token()
            return f"admin with scopes {' '.join(tok.scopes) if tok else ''}"

    @server.custom_route("/test/revoke", methods=["POST"])
    async def revoke(_: Request) -> JSONResponse:
        n = len(provider.refresh)
        provider.refresh.clear()
        return JSONResponse({"revoked": n})

    @server.custom_route("/test/expire", methods=["POST"])
    async def expire(_: Request) -> JSONResponse:
        for at in provider.access.values():
            at.expires_at = int(time.time()) - 1
        return JSONResponse({"expired": len(provider.access)})

    @server.custom_route("/test/stats", methods=["GET"])
    async def stats(_: Request) -> JSONResponse:
        return JSONResponse(provider.stats)

    @server.custom_route("/test/tokens", methods=["GET"])
    async def tokens(_: Request) -> JSONResponse:
        return JSONResponse({"issued": provider.history})

    import uvicorn

    app = server.sse_app() if args.transport == "sse" else server.streamable_http_app()
    if args.step_up:
        app = StepUp(app, provider, args.step_up, f"{base}/.well-known/oauth-protected-resource{endpoint}")
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
