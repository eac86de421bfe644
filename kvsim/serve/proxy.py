"""Proxy mode (``--upstream URL``): forward every request unchanged to a real
OpenAI-compatible server (vLLM, SGLang), stream its answer back unchanged, and record the
server's ``cached_tokens`` beside kvsim's prediction for the same request.

The life of a proxied request:

1. kvsim reads the body as it would serve it (prompt tokens, adapter, salt); a body it
   cannot read is still forwarded, but not modelled or recorded (counted in
   ``kvsim:proxy_unmodelled_requests``).
2. The body goes to the server as is (only hop-by-hop headers, ``Accept-Encoding`` and,
   with ``--upstream-api-key``, ``Authorization`` change); the answer — status, body or
   SSE stream — comes back as the server sent it. A timeout is a 504, an unreachable
   server a 502, each an OpenAI error object (in a stream: an error event).
3. When the answer is complete, the generated tokens (the server's ``token_ids`` when it
   returns them, else the reply text tokenized, plus the end-of-turn token for a chat reply
   that stopped) go through the cache model, and the record line holds the prediction
   (``kvsim``) and the server's figures (``upstream``). A failed request is modelled as
   prefilled with nothing generated.

Requests reach the cache model in the order their answers complete: for a client that
sends one request at a time that is the arrival order.
"""
from __future__ import annotations

import json
import time
from typing import Any, AsyncIterator

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from kvsim.serve.errors import ApiError, error_body
from kvsim.serve.protocol import parse_request
from kvsim.serve.service import CacheService, Prepared

_HOP_BY_HOP = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "trailer",
               "upgrade", "proxy-authorization", "proxy-connection", "accept-encoding"}
_NOT_BACK = {"content-length", "connection", "keep-alive", "transfer-encoding", "content-encoding", "date",
             "server"}


class Proxy:
    """Forwards to one upstream server and compares its answers with the cache model."""

    def __init__(self, service: CacheService, upstream: str, api_key: str | None = None,
                 timeout: float = 600.0) -> None:
        self.service = service
        base = upstream.rstrip("/")
        self.base = base[:-3] if base.endswith("/v1") else base
        self.api_key = api_key
        self.timeout = timeout
        self.client = httpx.AsyncClient(base_url=self.base, timeout=httpx.Timeout(timeout),
                                        limits=httpx.Limits(max_connections=512, max_keepalive_connections=128))

    # -- forwarding ------------------------------------------------------------------
    def _headers(self, request: Request) -> dict[str, str]:
        out = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        if self.api_key is not None:
            out = {k: v for k, v in out.items() if k.lower() != "authorization"}
            out["authorization"] = f"Bearer {self.api_key}"
        return out

    def _prepare(self, kind: str, body: bytes, request: Request) -> Prepared | None:
        try:
            return self.service.prepare(kind, parse_request(kind, body, strict=False), request.headers,
                                        strict=False)
        except ApiError:
            self.service.metrics.unmodelled.inc()
            return None

    async def forward(self, request: Request, kind: str, body: bytes) -> Response:
        """Forward one chat or completion request and answer with what the server answered."""
        prep = self._prepare(kind, body, request)
        stream = prep.stream if prep is not None else _asks_stream(body)
        path = request.url.path
        t0 = time.perf_counter()
        try:
            if not stream:
                resp = await self.client.post(path, content=body, headers=self._headers(request))
                # the answer goes out first; the cache model runs right after it is sent
                latency = time.perf_counter() - t0
                return Response(resp.content, status_code=resp.status_code, headers=_back(resp.headers),
                                background=BackgroundTask(_on_loop, self._finish_unary, prep, resp.status_code,
                                                          resp.content, latency))
            upstream = await self.client.send(
                self.client.build_request("POST", path, content=body, headers=self._headers(request)), stream=True)
        except httpx.TimeoutException:
            return self._failed(prep, 504, f"upstream {self.base} did not answer within {self.timeout:g} s", t0)
        except httpx.HTTPError as e:
            return self._failed(prep, 502, f"upstream {self.base} unreachable: {type(e).__name__}", t0)
        if upstream.status_code != 200:
            content = await upstream.aread()
            await upstream.aclose()
            latency = time.perf_counter() - t0
            return Response(content, status_code=upstream.status_code, headers=_back(upstream.headers),
                            background=BackgroundTask(_on_loop, self._finish_unary, prep, upstream.status_code, content,
                                                      latency))
        return StreamingResponse(self._relay(prep, upstream, t0), status_code=200,
                                 headers=_back(upstream.headers))

    async def _relay(self, prep: Prepared | None, upstream: httpx.Response, t0: float) -> AsyncIterator[bytes]:
        collected = SseCollector()
        error: tuple[int, str] | None = None
        try:
            try:
                async for chunk in upstream.aiter_raw():
                    collected.feed(chunk)
                    yield chunk
            except httpx.TimeoutException:
                error = (504, f"upstream {self.base} stopped streaming for {self.timeout:g} s")
            except httpx.HTTPError as e:
                error = (502, f"upstream stream broke: {type(e).__name__}")
            if error is not None:
                event = json.dumps(error_body(error[1], error[0]))
                yield f"data: {event}\n\ndata: [DONE]\n\n".encode()
        finally:
            status, message = error if error is not None else (200, None)
            self._finish(prep, status, collected.result(), message, time.perf_counter() - t0)
            await upstream.aclose()

    async def forward_get(self, request: Request, path: str) -> Response:
        try:
            resp = await self.client.get(path, headers=self._headers(request))
        except httpx.TimeoutException:
            raise ApiError(f"upstream {self.base} did not answer within {self.timeout:g} s", 504,
                           "GatewayTimeout") from None
        except httpx.HTTPError as e:
            raise ApiError(f"upstream {self.base} unreachable: {type(e).__name__}", 502, "BadGateway") from None
        return Response(resp.content, status_code=resp.status_code, headers=_back(resp.headers))

    async def reset_upstream(self, request: Request) -> bool:
        """Reset the server's prefix cache too, so that both start empty again."""
        try:
            resp = await self.client.post("/reset_prefix_cache", headers=self._headers(request))
        except httpx.HTTPError:
            return False
        try:
            return resp.status_code == 200 and bool(resp.json().get("success", True))
        except ValueError:
            return resp.status_code == 200

    # -- comparing -------------------------------------------------------------------
    def _failed(self, prep: Prepared | None, status: int, message: str, t0: float) -> Response:
        err_type = "GatewayTimeout" if status == 504 else "BadGateway"
        return JSONResponse(error_body(message, status, err_type), status_code=status,
                            background=BackgroundTask(_on_loop, self._finish, prep, status, {}, message,
                                                      time.perf_counter() - t0))

    def _finish_unary(self, prep: Prepared | None, status: int, content: bytes, latency: float) -> None:
        try:
            body = json.loads(content)
        except ValueError:
            body = None
        message = None
        if status >= 400:
            err = body.get("error") if isinstance(body, dict) else None
            message = (err.get("message") if isinstance(err, dict) else err) or content[:200].decode("utf-8", "replace")
        self._finish(prep, status, _unary_result(body), str(message) if message is not None else None, latency)

    def _finish(self, prep: Prepared | None, status: int, result: dict[str, Any], error: str | None,
                latency: float) -> None:
        """Step 3: the cache model serves the request; the record holds both answers."""
        metrics = self.service.metrics
        if status >= 400 or error is not None:
            metrics.upstream_errors.labels(str(status)).inc()
        if prep is None:
            return
        usage = result.get("usage") if isinstance(result.get("usage"), dict) else {}
        details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
        served_cached = _int(details.get("cached_tokens"))
        text = result.get("text")
        finish = result.get("finish_reason")
        output_ids = result.get("token_ids")
        if not (isinstance(output_ids, list) and all(isinstance(t, int) for t in output_ids)):
            output_ids = self._reply_ids(prep.kind, text, finish)
        upstream = {"status": status, "id": result.get("id"), "prompt_tokens": _int(usage.get("prompt_tokens")),
                    "completion_tokens": _int(usage.get("completion_tokens")), "cached_tokens": served_cached,
                    "finish_reason": finish, "latency_ms": round(latency * 1000, 3),
                    "error": error}
        failed = status >= 400 or error is not None
        served = self.service.apply(prep, output_ids, reply_text=text,
                                    finish_reason="error" if failed else finish, extra={"upstream": upstream})
        if not failed:
            metrics.compared(None if served.rejected else served.cached_tokens, served_cached)

    def _reply_ids(self, kind: str, text: Any, finish: Any) -> list[int]:
        """The tokens the server generated, from its text: an engine's output ids include
        the stop token it sampled (a chat reply that stopped ends with end-of-turn)."""
        prompter = self.service.prompter
        ids = prompter.tokenizer.encode(text) if isinstance(text, str) and text else []
        if kind == "chat" and finish == "stop" and prompter.eot_id is not None:
            ids.append(prompter.eot_id)
        return ids

    def close_sync(self) -> None:
        try:
            import asyncio

            asyncio.run(self.client.aclose())
        except RuntimeError:
            pass


class SseCollector:
    """Reads a relayed SSE stream on the side: reply text, finish reason, usage, token ids."""

    def __init__(self) -> None:
        self._buf = b""
        self.parts: list[str] = []
        self.token_ids: list[int] = []
        self.ids_complete = True
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.id: str | None = None

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                continue
            try:
                event = json.loads(data)
            except ValueError:
                continue
            if isinstance(event, dict):
                self._event(event)

    def _event(self, event: dict) -> None:
        if self.id is None and isinstance(event.get("id"), str):
            self.id = event["id"]
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        choices = event.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        delta = choice.get("delta")
        piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if isinstance(piece, str):
            self.parts.append(piece)
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            self.token_ids.extend(t for t in ids if isinstance(t, int))
        elif piece:
            self.ids_complete = False
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "text": "".join(self.parts), "finish_reason": self.finish_reason,
                               "usage": self.usage or {}}
        if self.token_ids and self.ids_complete:
            out["token_ids"] = self.token_ids
        return out


def _unary_result(body: Any) -> dict[str, Any]:
    """Reply text, finish reason, usage and token ids of a non-streamed answer."""
    if not isinstance(body, dict):
        return {}
    out: dict[str, Any] = {"id": body.get("id"),
                           "usage": body.get("usage") if isinstance(body.get("usage"), dict) else {}}
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
        message = choice.get("message")
        out["text"] = message.get("content") if isinstance(message, dict) else choice.get("text")
        out["finish_reason"] = choice.get("finish_reason")
        if isinstance(choice.get("token_ids"), list):
            out["token_ids"] = choice["token_ids"]
    return out


async def _on_loop(fn, *args) -> None:
    """Run ``fn`` on the event loop (Starlette would run a plain function in a worker
    thread): the cache model and the record are touched by one thread, one request at a time."""
    fn(*args)


def _asks_stream(body: bytes) -> bool:
    try:
        data = json.loads(body)
    except ValueError:
        return False
    return isinstance(data, dict) and bool(data.get("stream"))


def _back(headers: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _NOT_BACK}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
