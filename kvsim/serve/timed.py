"""``kvsim serve --replay timed``: the scheduler model in wall-clock time, with simulated latency.

Requests reach the engine's scheduler model (``kvsim.sched``: vLLM 0.33.0's or SGLang
0.5.23's, as ``kvsim simulate --replay timed`` runs them) as they arrive; the model steps on
the server's clock, each step lasting what the step-cost model says for its batch (the
roofline of ``--model`` on ``--gpu``, or a ``--calibration``), and a response is sent when
the step that finishes its request has ended. So concurrent clients share batches, queue,
are preempted and hit each other's prefixes as on the real engine, and see its latency.

The clock: a request is released before the first step that starts after it arrived; a
step starting at simulated time t ends at t + cost, and the loop sleeps until then (when
computing the step takes longer, simulated time runs behind the wall clock and catches up
while the engine is idle). Everything runs on the server's event loop, one step at a time.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from kvsim.errors import ConfigError
from kvsim.engines.serving import EngineState, Served

#: request slots the per-request result arrays grow by
_GROW = 1024


@dataclass(frozen=True)
class TimedServed:
    """What the timed engine did with one request, and when (seconds of the server's clock)."""

    served: Served
    released: float
    first_token: float
    finished: float


class TimedEngine:
    """One scheduler model stepping on the event loop's clock."""

    def __init__(self, policy: str, options, mode, clock=None) -> None:
        from kvsim.drive.concurrent import check_supported, scheduler_settings
        from kvsim.engines.base import StepResult
        from kvsim.drive.step_cost import step_cost
        from kvsim.drive.timed import make_engine

        if not (options.capacity_tokens or options.num_gpu_blocks or options.max_total_tokens
                or options.kv_cache_memory or (options.model and options.gpu)):
            raise ConfigError("serve --replay timed needs a capacity: --capacity, --num-gpu-blocks, "
                              "--max-total-tokens, --kv-cache-memory or --model with --gpu")
        if options.capacity_tokens is not None and not np.isfinite(options.capacity_tokens):
            raise ConfigError("serve --replay timed needs a finite capacity")
        check_supported([policy], options)
        self.policy = policy
        self.cost = step_cost(options.model, options.gpu, mode.calibration)
        self.settings, self.defaults = scheduler_settings(policy, options, mode)
        self.prompts: list = []
        self.outputs: list = []
        self.loras: list = []
        self.salts: list = []
        self.prompt_logprobs: list = []
        self.logprob_starts: list = []
        self.engine = make_engine(self.settings, self.prompts, self.outputs, None, self.loras, self.salts,
                                  prompt_logprobs=self.prompt_logprobs, logprob_starts=self.logprob_starts)
        self.engine.result = StepResult.empty(self.engine.result.engine, 0)
        self.engine.on_batch = self._on_batch
        self._clock = clock                 # () -> seconds; the event loop's by default
        self._now = 0.0                     # simulated time: start of the next step
        self._step_cost = 0.0
        self._step_end: list[float] = []
        self._released: list[float] = []
        self._arrived: list[float] = []
        self._waiting: dict[int, asyncio.Future] = {}
        self._pending: list[int] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._seen = 0

    @property
    def capacity_tokens(self) -> int:
        s = self.settings
        return s.capacity if hasattr(s, "capacity") else (s.num_gpu_blocks - 1) * s.block_size

    def time(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    # -- requests -----------------------------------------------------------------------
    async def serve(self, prompt: np.ndarray, output: np.ndarray, lora=None, cache_salt=None,
                    prompt_logprobs: bool = False, logprob_start_len: int = -1) -> TimedServed:
        """Queue a request; returns once the step that finishes it has ended."""
        if self._task is None:
            self._wake = asyncio.Event()
            self._now = self.time()
            self._task = asyncio.get_running_loop().create_task(self._run())
        i = len(self.prompts)
        self.prompts.append(np.asarray(prompt, np.int64))
        self.outputs.append(np.asarray(output, np.int64))
        self.loras.append(lora)
        self.salts.append(cache_salt)
        self.prompt_logprobs.append(bool(prompt_logprobs))
        self.logprob_starts.append(int(logprob_start_len))
        self._released.append(float("nan"))
        self._arrived.append(self.time())
        self._grow(i + 1)
        done = asyncio.get_running_loop().create_future()
        self._waiting[i] = done
        self._pending.append(i)
        self._wake.set()
        return await done

    def _grow(self, n: int) -> None:
        """Room for ``n`` requests in the per-request result arrays (the engine reads them by index)."""
        r = self.engine.result
        size = len(r.rejected)
        if n <= size:
            return
        new = size + max(_GROW, n - size)
        for name, fill in (("cached_tokens", -1), ("first_token_step", -1), ("finish_step", -1),
                           ("preemptions", 0), ("rejected", False), ("output_tokens", 0)):
            old = getattr(r, name)
            grown = np.full(new, fill, old.dtype)
            grown[:size] = old
            setattr(r, name, grown)

    # -- the loop ---------------------------------------------------------------------------
    def _on_batch(self, step, requests, new_tokens, context, decode) -> None:
        self._step_cost = self.cost.seconds(new_tokens, context)

    async def _run(self) -> None:
        engine, step = self.engine, 0
        while True:
            if not engine.has_work():
                engine.idle()
                if not self._pending:
                    self._wake.clear()
                    await self._wake.wait()
                # the clock jumps over idle time to the next arrival
                self._now = max(self._now, min(self._arrived[i] for i in self._pending))
            released = [i for i in self._pending if self._arrived[i] <= self._now]
            for i in released:                              # before the step that starts now
                self._released[i] = self._now
                engine.add(i)
                if engine.result.rejected[i]:
                    self._resolve(i)
            if released:
                self._pending = [i for i in self._pending if self._arrived[i] > self._now]
            self._step_cost = 0.0
            if engine.step(step):
                step += 1
                self._now += self._step_cost
                self._step_end.append(self._now)
                delay = self._now - self.time()
                await asyncio.sleep(delay if delay > 0 else 0)
            else:
                await asyncio.sleep(0)
            finished = engine.result.finished
            while self._seen < len(finished):
                self._resolve(finished[self._seen])
                self._seen += 1

    def _resolve(self, i: int) -> None:
        r = self.engine.result
        done = self._waiting.pop(i, None)
        if done is None or done.done():
            return
        L = len(self.prompts[i])
        if r.rejected[i]:
            t = self._released[i]
            done.set_result(TimedServed(Served(0, 0, True, 0, 0), t, t, t))
            return
        cached = int(r.cached_tokens[i])
        served = Served(cached, int(r.output_tokens[i]), False, 0, L - cached)
        done.set_result(TimedServed(served, self._released[i], self._step_end[r.first_token_step[i]],
                                    self._step_end[r.finish_step[i]]))

    def state(self) -> EngineState:
        """The pool now, for ``/metrics``."""
        cap = self.capacity_tokens
        cache = getattr(self.engine, "cache", None)
        if cache is not None:                                # SGLang
            available, evictable = int(cache.available_size), int(cache.evictable_size)
        else:                                                # vLLM: free blocks, cached or not
            sched = self.engine.scheduler
            available = int(sched.cache.num_free_blocks) * self.settings.block_size
            evictable = 0
        held = cap - available
        return EngineState(prefix_queries=0, prefix_hits=0, held_tokens=held, capacity_tokens=cap,
                           available_tokens=available, evictable_tokens=evictable,
                           usage=(held - evictable) / cap if cap else 0.0)
