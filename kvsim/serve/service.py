"""What ``kvsim serve`` does with a request, apart from HTTP.

1. ``prepare``: resolve the model name (base model, or a LoRA adapter by name as vLLM
   serves adapters, or SGLang's ``base:adapter`` and ``lora_path``), render and tokenize
   the prompt as ``simulate`` reads a log, and fix the output budget as vLLM does
   (``get_max_tokens``: at most ``max_model_len - prompt``).
2. ``complete``: make the synthetic reply, then ``apply`` it.
3. ``apply``: run the request through the cache model (admit, decode, finish), update the
   metrics and append the record line — all in one synchronous step, so the record's order
   is the order the cache model saw, and ``simulate`` on the record reproduces every answer.

In proxy mode (:mod:`kvsim.serve.proxy`) step 2 is the real server's reply, and ``apply``
runs when that reply is complete.
"""
from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np

from kvsim.io.fields import BadRecord, logprob_fields
from kvsim.serve.config import ServeConfig
from kvsim.engines import registry
from kvsim.engines.serving import Served
from kvsim.serve.errors import ApiError
from kvsim.serve.metrics import ServeMetrics
from kvsim.serve.prompts import Prompter
from kvsim.serve.protocol import ChatCompletionRequest, CompletionRequest
from kvsim.serve.record import Recorder
from kvsim.serve.replies import Reply, ReplyMaker
from kvsim.serve.responses import Answer

_ID_PREFIX = {"chat": "chatcmpl-", "completion": "cmpl-"}


@dataclass
class Prepared:
    """A validated request, ready for the cache model."""

    kind: str
    request_id: str
    model: str                     # the name answered in "model" (the adapter's, for a LoRA request)
    lora: str | None
    cache_salt: str | None
    prompt_ids: list[int]
    max_tokens: int
    prompt_logprobs: bool          # vLLM skips reading the cache for these (spec vllm_apc.md §2.1)
    logprob_start_len: int = -1    # SGLang caps a logprob request's match there (sglang_radix.md §2.1)
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    return_token_ids: bool = False
    seed: int | None = None
    user: str | None = None
    session_id: str | None = None
    arrival: float = field(default_factory=time.time)
    text: dict[str, Any] = field(default_factory=dict)   # messages / prompt, kept only with --record-text


class CacheService:
    """The cache model, prompt rendering, replies, metrics and record of one server."""

    def __init__(self, config: ServeConfig) -> None:
        config.check()
        self.config = config
        options = config.options
        if config.lora_modules:
            options = replace(options, extra={**options.extra, "lora_paths": dict(config.lora_modules)})
        spec = registry.engine(config.policy)
        if "finish" in spec.extra_keys:
            options = replace(options, extra={**options.extra, "finish": config.finish})
        self.options = options
        self.engine = spec.serve_adapter(options, config.implementation)
        self.timed = None                      # --replay timed: the scheduler model in wall-clock time
        if config.replay_mode is not None:
            from kvsim.serve.timed import TimedEngine

            self.timed = TimedEngine(config.policy, options, config.replay_mode)
        self.max_model_len = config.resolve_max_model_len(self.engine.max_request_tokens())
        self.prompter = Prompter(config.tokenizer, config.chat_template)
        self.replies = ReplyMaker(self.prompter.tokenizer, self.prompter.eot_id, config.seed)
        self.metrics = ServeMetrics(self.engine.family, config.served_model_name, self.max_model_len)
        self.recorder = Recorder(config.record) if config.record is not None else None
        self.applied = 0
        self.metrics.engine_state(self.engine.state())

    # -- 1. prepare ----------------------------------------------------------------------
    def resolve_model(self, model: str | None, lora_path: str | None = None,
                      strict: bool = True) -> tuple[str, str | None]:
        """(name to answer with, LoRA adapter or None); an unknown name is a 404 as in vLLM,
        or (``strict=False``, proxy mode: the server knows its names) the base model."""
        base = self.config.served_model_name
        adapters = self.config.lora_modules
        lora = None
        if model and model != base:
            if model in adapters:
                lora = model
            else:
                head, _, tail = model.partition(":")   # SGLang: "base-model:adapter"
                if head.strip() == base and tail.strip() in adapters:
                    lora = tail.strip()
                elif not strict:
                    return model, None
                else:
                    raise ApiError(f"The model `{model}` does not exist. Valid aliases: {base}.", 404,
                                   "NotFoundError", "model")
        if lora is None and lora_path:
            if lora_path not in adapters and not strict:
                return base, lora_path
            if lora_path not in adapters:
                raise ApiError(f"LoRA adapter {lora_path} does not exist", 404, "NotFoundError", "lora_path")
            lora = lora_path
        return (lora or base), lora

    def prepare(self, kind: str, req: ChatCompletionRequest | CompletionRequest,
                headers: Mapping[str, str] | None = None, strict: bool = True) -> Prepared:
        """Step 1. ``strict=False`` (proxy mode) skips the output budget checks: the real
        server decides those."""
        model, lora = self.resolve_model(req.model, req.lora_path, strict)
        if kind == "chat":
            prompt_ids = self.prompter.chat(req.messages)
            text = {"messages": req.messages}
        else:
            prompt_ids = self.prompter.completion(req.prompt)
            text = {"prompt": req.prompt}
        base_id = (headers or {}).get("x-request-id") or req.request_id or uuid.uuid4().hex
        try:  # what each engine makes of logprob requests, exactly as the log readers decide it
            vllm_skips_read, start = logprob_fields(req.model_dump(exclude_unset=True))
        except BadRecord as e:
            raise ApiError(str(e), param="logprob_start_len") from None
        prep = Prepared(
            kind=kind, request_id=_ID_PREFIX[kind] + base_id, model=model, lora=lora, cache_salt=req.cache_salt,
            prompt_ids=prompt_ids, max_tokens=1, prompt_logprobs=vllm_skips_read, logprob_start_len=start,
            stream=bool(req.stream), include_usage=req.include_usage, continuous_usage=req.continuous_usage,
            return_token_ids=bool(req.return_token_ids), seed=req.seed, user=req.user, session_id=req.session_id,
            text=text if self.config.record_text else {})
        requested, param = req.requested_max_tokens()
        if strict:
            prep.max_tokens = self._max_tokens(kind, requested, param, len(prompt_ids))
        elif requested is not None:
            prep.max_tokens = requested
        return prep

    def _max_tokens(self, kind: str, requested: int | None, param: str, prompt_len: int) -> int:
        """vLLM ``TokenizeParams`` checks, then ``get_max_tokens``."""
        limit = self.max_model_len
        if requested is not None and requested > limit:
            raise ApiError(f"{param}={requested} cannot be greater than max_model_len={limit}. "
                           "Please request fewer output tokens.", param=param)
        if prompt_len > limit:
            raise ApiError(f"This model's maximum context length is {limit} tokens. However, your prompt "
                           f"contains {prompt_len} input tokens, which exceeds this limit even without any "
                           "output tokens. Please reduce the length of the input prompt.", param="input_tokens")
        fallback = requested
        if fallback is None and kind == "chat":
            fallback = self.config.default_max_tokens
        budget = limit - prompt_len if fallback is None else min(limit - prompt_len, fallback)
        if budget < 1:
            raise ApiError(f"max_tokens must be at least 1, got {budget}.", param=param)
        return budget

    # -- 2. complete ---------------------------------------------------------------------
    def complete(self, prep: Prepared) -> Answer:
        """Step 2 (own replies): a synthetic reply, applied to the cache model."""
        key = np.asarray(prep.prompt_ids, np.int64).tobytes() + repr(prep.seed).encode()
        reply = self.replies.make(prep.max_tokens, hashlib.sha256(key).digest(), self.config.finish)
        served = self.apply(prep, reply.token_ids, reply_text=reply.text)
        if served.rejected and self.engine.refuses(len(prep.prompt_ids), prep.logprob_start_len):
            raise _logprob_abort(prep)
        return _answer(prep, reply, served, self.engine.capacity_tokens)

    async def complete_timed(self, prep: Prepared) -> Answer:
        """Step 2 with ``--replay timed``: the reply is made as in :meth:`complete`, the request
        joins the scheduler model's queue and the answer comes when its last step has ended."""
        key = np.asarray(prep.prompt_ids, np.int64).tobytes() + repr(prep.seed).encode()
        reply = self.replies.make(prep.max_tokens, hashlib.sha256(key).digest(), self.config.finish)
        out = np.asarray(reply.token_ids if len(reply.token_ids) else [-1], np.int64)
        if self.engine.refuses(len(prep.prompt_ids), prep.logprob_start_len):
            raise _logprob_abort(prep)
        t = await self.timed.serve(np.asarray(prep.prompt_ids, np.int64), out, prep.lora, prep.cache_salt,
                                   prep.prompt_logprobs, prep.logprob_start_len)
        served = t.served
        timing = {"ttft_s": round(t.first_token - t.released, 6),
                  "e2e_s": round(t.finished - t.released, 6)} if not served.rejected else {}
        self._account(prep, list(reply.token_ids), served, self.timed.state(), 0.0, reply.text,
                      extra={"kvsim_timed": timing} if timing else None)
        return _answer(prep, reply, served, self.timed.capacity_tokens)

    # -- 3. apply ------------------------------------------------------------------------
    def apply(self, prep: Prepared, output_ids: list[int], reply_text: str | None = None,
              finish_reason: str | None = None, extra: dict[str, Any] | None = None) -> Served:
        """Step 3: the cache model serves the request; metrics and record follow at once.

        ``output_ids`` may be empty (a failed upstream request): the engine still samples
        one token, which is never cached (spec vllm_apc.md §4.1; radix §3.3)."""
        out = np.asarray(output_ids if len(output_ids) else [-1], np.int64)
        t0 = time.thread_time()  # CPU time: the model's share of the work, whatever else runs
        served = self.engine.serve(prep.request_id, np.asarray(prep.prompt_ids, np.int64), out, prep.lora,
                                   prep.cache_salt, prep.prompt_logprobs, prep.logprob_start_len)
        seconds = time.thread_time() - t0
        self._account(prep, output_ids, served, self.engine.state(), seconds, reply_text, finish_reason, extra)
        return served

    def _account(self, prep: Prepared, output_ids: list[int], served: Served, state, seconds: float,
                 reply_text: str | None = None, finish_reason: str | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        """Metrics and the record line of a request the cache model served."""
        self.applied += 1
        finish = finish_reason or ("stop" if self.config.finish == "stop" else "length")
        self.metrics.observe(served, len(prep.prompt_ids), prep.stream, finish, state, seconds)
        if self.recorder is not None:
            kept = list(output_ids) if served.rejected or not len(output_ids) else list(output_ids[:served.generated])
            self.recorder.write(self._record_line(prep, kept, served, reply_text, extra))

    def _record_line(self, prep: Prepared, output_ids: list[int], served: Served, reply_text: str | None,
                     extra: dict[str, Any] | None) -> dict[str, Any]:
        line: dict[str, Any] = {"request_id": prep.request_id, "timestamp": round(prep.arrival, 6),
                                "endpoint": prep.kind, "model": prep.model}
        for name in ("lora", "cache_salt", "user", "session_id"):
            value = getattr(prep, name)
            if value is not None:
                line[name] = value
        if prep.prompt_logprobs:
            line["prompt_logprobs"] = True
        if prep.prompt_logprobs or prep.logprob_start_len != -1:
            line["logprob_start_len"] = prep.logprob_start_len   # explicit: the readers take it as is
        line["max_tokens"] = prep.max_tokens
        line["prompt_token_ids"] = [int(t) for t in prep.prompt_ids]
        line["output_token_ids"] = [int(t) for t in output_ids]
        line["kvsim"] = {"policy": self.engine.policy, "seq": self.applied, "prompt_tokens": len(prep.prompt_ids),
                         "cached_tokens": served.cached_tokens, "completion_tokens": served.generated,
                         "evicted_tokens": served.evicted_tokens, "rejected": served.rejected, "stream": prep.stream}
        if self.config.record_text:
            line.update(prep.text)
            if reply_text is not None:
                line["reply_text"] = reply_text
        if extra:
            line.update(extra)
        return line

    # -- the rest ------------------------------------------------------------------------
    def reset(self) -> bool:
        """vLLM ``/reset_prefix_cache``: forget every cached prefix (only when idle; not with
        ``--replay timed``)."""
        if self.timed is not None:
            return False
        ok = self.engine.reset()
        if ok:
            self.metrics.engine_reset(self.engine.state())
        return ok

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.close()


def _logprob_abort(prep: Prepared) -> ApiError:
    """SGLang's error for a ``logprob_start_len`` past the prompt (the request is aborted)."""
    return ApiError(f"req.logprob_start_len={prep.logprob_start_len} is higher than the number of input "
                    f"tokens len(req.origin_input_ids)={len(prep.prompt_ids)}. Please use a smaller "
                    "logprob_start_len.", param="logprob_start_len")


def _answer(prep: Prepared, reply: Reply, served, capacity_tokens: int | None) -> Answer:
    """The answer to a served request: an error if it never fit, the reply clipped where SGLang
    clipped it to the pool."""
    if served.rejected:
        raise ApiError(f"This request needs more KV cache than the cache holds ({len(prep.prompt_ids)} "
                       f"prompt tokens, {prep.max_tokens} output tokens; capacity "
                       f"{capacity_tokens} tokens).", param="input_tokens")
    if served.generated < len(reply.token_ids):  # SGLang clipped the reply to the pool
        reply = Reply(reply.token_ids[:served.generated], reply.pieces[:served.generated], "length")
    return Answer(prep.kind, prep.request_id, prep.model, prep.prompt_ids, reply, served.cached_tokens,
                  prep.return_token_ids, int(prep.arrival))
