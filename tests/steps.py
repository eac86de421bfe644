"""Step-clock replays of the scheduler models, as the tests call them."""
from __future__ import annotations

from kvsim.drive.clock import run_steps
from kvsim.engines.base import StepResult


def replay_vllm_steps(prompts, outputs, arrival_steps, settings, priorities=None, loras=None, salts=None,
                      prompt_logprobs=None) -> StepResult:
    """Replay requests on the step clock through the vLLM scheduler model."""
    engine = settings.engine(prompts, outputs, priorities, loras, salts, prompt_logprobs)
    engine.result.steps = run_steps(engine, arrival_steps)
    return engine.result


def replay_sglang_steps(prompts, outputs, arrival_steps, settings, loras=None, salts=None,
                        logprob_starts=None) -> StepResult:
    """Replay requests on the step clock through the SGLang scheduler model."""
    engine = settings.engine(prompts, outputs, loras=loras, salts=salts, logprob_starts=logprob_starts)
    engine.result.steps = run_steps(engine, arrival_steps)
    return engine.result
