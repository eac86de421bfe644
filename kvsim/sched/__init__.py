"""Concurrent replay: the real schedulers' batching, chunking, preemption and ordering.

A sequential replay (``kvsim.replay``) serves one request at a time. Here requests
arrive on a step clock and the engine's scheduler decides, step by step, which requests
run, how many tokens each computes, and which are preempted (vLLM) or retracted
(SGLang). Both models are re-statements of the engines' scheduler code, proven request
for request against it (``tests/test_sched_*_oracle.py``); the rules are described in
``docs/engines/vllm-scheduler.md`` and ``docs/engines/sglang-scheduler.md``, whose
section numbers the comments cite.

- ``clock.py`` — the step clock (or seconds): releases before their step, jumps over idle
  time, closed-loop sessions (``Releases``).
- ``results.py`` — per-request results of a step replay (``StepResult``).
- ``vllm_cache.py``, ``sglang_cache.py`` — the one narrow adapter per engine onto the
  cache models (``kvsim.cache``): the only modules that import them; ``vllm_cache.py``
  picks the compiled pool (``vllm_cache_fast.py``, default) or the reference objects.
- ``vllm_scheduler.py`` — vLLM 0.33.0's v1 ``Scheduler`` and engine-core loop.
- ``sglang_policy.py``, ``sglang_adder.py``, ``sglang_scheduler.py`` — SGLang 0.5.23's
  waiting-queue policies, ``PrefillAdder`` and event loop.
- ``step_cost.py`` — what a step costs in time (roofline of its batch, or a calibration);
  ``timed.py`` — step and timed replays, latencies, the run without prefix caching.
- ``settings.py`` — scheduler settings from kvsim's options and the engines' GPU defaults;
  ``views.py`` — the concurrent view of a log for report and sweep.
"""
