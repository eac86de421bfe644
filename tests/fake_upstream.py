"""A scripted OpenAI-compatible server for the proxy tests (run as a process).

It answers chat and completion requests with a fixed reply and reports whatever
``cached_tokens`` the request's ``X-Fake-Cached-Tokens`` header asks for (0 without it),
so a test decides where the server disagrees with kvsim. Markers in the last message or
the prompt script failures: ``[error 500]`` / ``[error 400]`` answer with that error,
``[slow]`` waits 3 s before answering, ``[delay]`` 0.3 s, and ``[drop]`` breaks a stream
after its first chunk. It binds 127.0.0.1 on a free port and prints where it listens.
"""
from __future__ import annotations

import asyncio
import json
import socket
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

REPLY = ["fake", " upstream", " reply"]


def _marker_text(body: dict) -> str:
    msgs = body.get("messages")
    if isinstance(msgs, list) and msgs and isinstance(msgs[-1], dict):
        return str(msgs[-1].get("content"))
    return str(body.get("prompt"))


async def complete(request: Request) -> JSONResponse | StreamingResponse:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except ValueError:
        return JSONResponse({"error": {"message": "fake: invalid JSON", "type": "BadRequestError", "param": None,
                                       "code": 400}}, status_code=400)
    text = _marker_text(body)
    for code in (500, 400):
        if f"[error {code}]" in text:
            return JSONResponse({"error": {"message": f"fake failure {code}", "type": "FakeError", "param": None,
                                           "code": code}}, status_code=code)
    if "[slow]" in text:
        await asyncio.sleep(3)
    if "[delay]" in text:
        await asyncio.sleep(0.3)
    chat = "messages" in body
    cached = int(request.headers.get("x-fake-cached-tokens", "0"))
    usage = {"prompt_tokens": 1000, "completion_tokens": len(REPLY), "total_tokens": 1000 + len(REPLY),
             "prompt_tokens_details": {"cached_tokens": cached}}
    rid = "fake-" + request.headers.get("x-fake-id", "0")
    if not body.get("stream"):
        choice = {"index": 0, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": "".join(REPLY)}
        else:
            choice["text"] = "".join(REPLY)
        return JSONResponse({"id": rid, "object": "chat.completion" if chat else "text_completion", "created": 0,
                             "model": body.get("model"), "choices": [choice], "usage": usage})

    async def events():
        for i, piece in enumerate(REPLY):
            finish = "length" if i == len(REPLY) - 1 else None
            choice = {"index": 0, "finish_reason": finish}
            if chat:
                choice["delta"] = {"content": piece}
            else:
                choice["text"] = piece
            yield f"data: {json.dumps({'id': rid, 'choices': [choice]})}\n\n"
            if "[drop]" in text:
                raise RuntimeError("fake: connection dropped mid-stream")
        if (body.get("stream_options") or {}).get("include_usage"):
            yield f"data: {json.dumps({'id': rid, 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def models(request: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})


async def reset(request: Request) -> JSONResponse:
    return JSONResponse({"success": True})


app = Starlette(routes=[Route("/v1/chat/completions", complete, methods=["POST"]),
                        Route("/v1/completions", complete, methods=["POST"]),
                        Route("/v1/models", models), Route("/reset_prefix_cache", reset, methods=["POST"])])

if __name__ == "__main__":
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    sys.exit(0)
