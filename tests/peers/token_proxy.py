"""Test-only header-injecting proxy for peers that cannot send Coffer's token.

  .venv-mcp1/bin/python token_proxy.py --listen PORT --target http://127.0.0.1:COFFER_PORT --token-file DAEMON_JSON

Forwards every request to the target with `X-Coffer-Token` added and streams the response
(SSE included). Host and Origin that name the proxy itself are rewritten to the target's, so
Coffer's DNS-rebinding checks still see foreign Host/Origin values unchanged. Prints
"listening on PORT" on stdout once ready. Never part of the product: Coffer has no auth bypass.
"""

import argparse
import json
import sys
from urllib.parse import urlsplit

import httpx
import uvicorn
from starlette.requests import Request
from starlette.responses import StreamingResponse

HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection", "content-length"}


def build(listen_port, target, token):
    t = urlsplit(target)
    target_host = t.netloc
    own = {f"127.0.0.1:{listen_port}", f"localhost:{listen_port}"}
    client = httpx.AsyncClient(base_url=target, timeout=None, trust_env=False)

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        req = Request(scope, receive)
        headers = {}
        for k, v in req.headers.items():
            lk = k.lower()
            if lk in HOP:
                continue
            if lk == "host" and v in own:
                v = target_host
            if lk == "origin" and urlsplit(v).netloc in own:
                v = f"{t.scheme}://{target_host}"
            headers[k] = v
        headers["X-Coffer-Token"] = token
        body = await req.body()
        path = scope["raw_path"].decode()
        if scope.get("query_string"):
            path += "?" + scope["query_string"].decode()
        upstream = client.build_request(req.method, path, headers=headers, content=body)
        resp = await client.send(upstream, stream=True)
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP}

        async def body_iter():
            try:
                async for chunk in resp.aiter_raw():
                    yield chunk
            finally:
                await resp.aclose()

        r = StreamingResponse(body_iter(), status_code=resp.status_code, headers=out_headers)
        await r(scope, receive, send)

    return app


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--listen", type=int, required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--token-file", required=True)
    a = p.parse_args()
    token = json.load(open(a.token_file))["token"]
    config = uvicorn.Config(build(a.listen, a.target, token), host="127.0.0.1", port=a.listen, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    orig = server.startup

    async def startup(*args, **kw):
        await orig(*args, **kw)
        print(f"listening on {a.listen}", flush=True)

    server.startup = startup
    server.run()


if __name__ == "__main__":
    sys.exit(main())
