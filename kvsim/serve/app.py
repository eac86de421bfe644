"""The HTTP application (Starlette): routes, API-key check, body bound, error objects.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``,
``GET /health``, ``GET /metrics``, ``POST /reset_prefix_cache`` (vLLM) and
``GET|POST /flush_cache`` (SGLang). With ``--api-key`` every route but ``/health`` needs
``Authorization: Bearer KEY``. Every error is an OpenAI error object (:mod:`.errors`);
an unexpected failure is a 500 with a one-line message, its traceback on the server's
stderr only.
"""
from __future__ import annotations

import hashlib
import secrets
import sys
import time
import traceback
from http import HTTPStatus
from typing import Any

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from kvsim.serve.errors import ApiError, error_body
from kvsim.serve.metrics import CONTENT_TYPE_LATEST
from kvsim.serve.protocol import parse_request
from kvsim.serve.responses import response_body, sse_events
from kvsim.serve.service import CacheService

OPEN_PATHS = ("/health",)


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


class ApiKeyMiddleware:
    """``Authorization: Bearer KEY`` on every route but /health (vLLM guards only /v1)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._digest = hashlib.sha256(api_key.encode()).digest()

    def _ok(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() != "bearer":
                    return False
                return secrets.compare_digest(hashlib.sha256(token.strip().encode()).digest(), self._digest)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") == "OPTIONS" or scope["path"] in OPEN_PATHS \
                or self._ok(scope):
            await self.app(scope, receive, send)
            return
        err = ApiError("Unauthorized: missing or wrong API key (Authorization: Bearer KEY).", 401, "Unauthorized")
        await error_response(err)(scope, receive, send)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 past ``limit`` bytes (checked as it arrives)."""
    declared = request.headers.get("content-length")
    too_large = ApiError(f"Request body too large: the limit is {limit} bytes (--max-body-bytes).",
                         HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "RequestEntityTooLarge")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def check_json(request: Request) -> None:
    """vLLM ``validate_json_request``: only application/json bodies."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise ApiError("1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
                       HTTPStatus.BAD_REQUEST, "Bad Request")


def build_app(service: CacheService, proxy: Any = None) -> Starlette:
    """The ASGI app around one :class:`CacheService` (and a :class:`~.proxy.Proxy` in proxy mode)."""
    config = service.config
    metrics = service.metrics

    async def complete(request: Request, kind: str) -> Response:
        body = await read_body(request, config.max_body_bytes)
        check_json(request)
        if proxy is not None:
            return await proxy.forward(request, kind, body)
        req = parse_request(kind, body)
        req.model, answer_as = config.asked_model(req.model)
        prep = service.prepare(kind, req, request.headers)
        if answer_as is not None:
            prep.model = answer_as
        answer = await service.complete_timed(prep) if service.timed is not None else service.complete(prep)
        if not prep.stream:
            return JSONResponse(response_body(answer))
        metrics.request_started()

        async def finished() -> None:  # async: runs on the event loop, not in a worker thread
            metrics.request_finished()

        return StreamingResponse(sse_events(answer, prep.include_usage, prep.continuous_usage),
                                 media_type="text/event-stream", background=BackgroundTask(finished))

    async def chat(request: Request) -> Response:
        return await complete(request, "chat")

    async def completions(request: Request) -> Response:
        return await complete(request, "completion")

    async def models(request: Request) -> Response:
        if proxy is not None:
            return await proxy.forward_get(request, "/v1/models")
        now = int(time.time())
        card = {"object": "model", "created": now, "owned_by": "kvsim", "permission": []}
        data = [{**card, "id": config.served_model_name, "root": config.served_model_name, "parent": None,
                 "max_model_len": service.max_model_len}]
        data += [{**card, "id": name, "root": path, "parent": config.served_model_name, "max_model_len": None}
                 for name, path in config.lora_modules.items()]
        return JSONResponse({"object": "list", "data": data})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def prometheus(request: Request) -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def reset_prefix_cache(request: Request) -> Response:
        if proxy is not None:
            upstream_ok = await proxy.reset_upstream(request)
            return JSONResponse({"success": bool(upstream_ok and service.reset())})
        return JSONResponse({"success": service.reset()})

    async def flush_cache(request: Request) -> Response:
        if service.reset():
            return PlainTextResponse("Cache flushed.\nPlease check backend logs for more details. "
                                     "(When there are running or waiting requests, the operation will not be performed.)\n")
        return PlainTextResponse("Cache not flushed because there are pending requests.\n", status_code=400)

    async def on_api_error(request: Request, exc: ApiError) -> Response:
        return error_response(exc)

    async def on_http_error(request: Request, exc: HTTPException) -> Response:
        return JSONResponse(error_body(str(exc.detail), exc.status_code, HTTPStatus(exc.status_code).phrase),
                            status_code=exc.status_code)

    async def on_crash(request: Request, exc: Exception) -> Response:
        print(f"kvsim serve: internal error on {request.method} {request.url.path}", file=sys.stderr)
        traceback.print_exception(exc, file=sys.stderr)
        return JSONResponse(error_body(f"Internal server error ({type(exc).__name__}); see the server log.", 500),
                            status_code=500)

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
        Route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"]),
        Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={ApiError: on_api_error, HTTPException: on_http_error,
                                                       Exception: on_crash})
    if config.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key)
    return app
