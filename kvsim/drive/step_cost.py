"""What one scheduler step costs in time, from the batch it runs (``--replay timed``).

A step runs one forward pass over its batch: request *i* computes ``n_i`` new tokens
after ``c_i`` tokens already in its KV cache (a prefill chunk: many new tokens; a decode:
one). Two models:

- **Roofline** (default, from ``--model`` and ``--gpu``): the pass does the linear layers
  for every new token (2 FLOPs per weight), attention over each request's causal
  query-key pairs ``n*c + n(n+1)/2`` (QK and PV: 4 x head_dim FLOPs per pair per query
  head and layer), and the LM head once per request; it reads the weights once, reads
  every request's context KV once and writes the new tokens' KV. The step takes
  ``max(FLOPs / peak FLOP/s, bytes / peak bandwidth)``: a lower bound (no kernel reaches
  peak; norms, activations, sampling and scheduling overhead are left out). Decode steps
  are memory-bound by the weights, so batching them is nearly free; prefill is
  compute-bound, so cached tokens save time in proportion to the work skipped.
- **Calibration** (``--calibration``, fitted by ``kvsim gpu-validate``): the measured
  prefill cost ``fixed + per_token * n + per_context_token * pairs``, summed over the
  batch's tokens and pairs with one fixed cost per step.

A step with an empty batch (vLLM's step that only reports finished requests, SGLang's
iteration that only processes the last result) costs nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from kvsim.errors import ConfigError
from kvsim.costs.calibration import Calibration, attention_pairs
from kvsim.costs.roofline import DevicePeak, device_peak
from kvsim.models import ModelShape, get_model


@dataclass(frozen=True)
class RooflineStepCost:
    """The roofline time of a batched forward pass of ``model`` on ``device``."""

    model: ModelShape
    device: DevicePeak

    @property
    def linear_params(self) -> float:
        """Matmul weights the tokens go through: all parameters but the two embedding tables."""
        m = self.model
        return m.params - 2 * m.vocab_size * m.hidden_size

    def flops(self, new_tokens, context) -> float:
        m = self.model
        new, ctx = np.asarray(new_tokens, np.float64), np.asarray(context, np.float64)
        linear = 2.0 * self.linear_params * new.sum()
        attention = 4.0 * m.num_layers * m.num_heads * m.head_dim * attention_pairs(new, ctx).sum()
        lm_head = 2.0 * m.hidden_size * m.vocab_size * len(new)
        return float(linear + attention + lm_head)

    def bytes(self, new_tokens, context) -> float:
        m = self.model
        new, ctx = np.asarray(new_tokens, np.float64), np.asarray(context, np.float64)
        kv = m.kv_bytes_per_token()
        return float(m.weight_bytes() + kv * (ctx + new).sum() + kv * new.sum())

    def seconds(self, new_tokens, context) -> float:
        if len(new_tokens) == 0:
            return 0.0
        # the same sums as flops() and bytes(), in plain Python: a step's batch is small and
        # this runs once per step, so numpy's per-call overhead would dominate the replay
        k = self._constants
        new = sum(new_tokens)
        pairs = sum(n * c + n * (n + 1) / 2 for n, c in zip(new_tokens, context))
        flops = k[0] * new + k[1] * pairs + k[2] * len(new_tokens)
        nbytes = k[3] + k[4] * (sum(context) + 2 * new)
        return max(flops / k[5], nbytes / k[6])

    def decode_run_seconds(self, context, k: int) -> list[float]:
        """The seconds of ``k`` decode steps of one batch: in step j request r computes one token
        after ``context[r] + j``. Bit for bit what :meth:`seconds` gives step by step: the sums are
        integers (exact in float64), the products and quotients the same IEEE operations."""
        bs = len(context)
        if bs == 0:
            return [0.0] * k
        k0, k1, k2, k3, k4, k5, k6 = self._constants
        total = np.int64(sum(context)) + bs * np.arange(k, dtype=np.int64)     # sum of contexts, per step
        flops = k0 * bs + k1 * (total + bs).astype(np.float64) + k2 * bs        # pairs: c + 1 per request
        nbytes = k3 + k4 * (total + 2 * bs)
        return np.maximum(flops / k5, nbytes / k6).tolist()

    @cached_property
    def _constants(self) -> tuple[float, ...]:
        m, d = self.model, self.device
        return (2.0 * self.linear_params, 4.0 * m.num_layers * m.num_heads * m.head_dim,
                2.0 * m.hidden_size * m.vocab_size, float(m.weight_bytes()), float(m.kv_bytes_per_token()),
                d.flops(m.dtype_bytes), d.mem_bandwidth)

    def describe(self) -> str:
        return f"roofline of {self.model.name} on {self.device.name}"


@dataclass(frozen=True)
class CalibratedStepCost:
    """A ``kvsim gpu-validate`` calibration applied to the whole batch."""

    calibration: Calibration

    def seconds(self, new_tokens, context) -> float:
        if len(new_tokens) == 0:
            return 0.0
        c = self.calibration
        new, ctx = np.asarray(new_tokens, np.float64), np.asarray(context, np.float64)
        return float(c.fixed_s + c.per_token_s * new.sum() + c.per_context_token_s * attention_pairs(new, ctx).sum())

    def decode_run_seconds(self, context, k: int) -> list[float]:
        """``k`` decode steps at once, bit for bit as :meth:`seconds` step by step (see the roofline's)."""
        bs = len(context)
        if bs == 0:
            return [0.0] * k
        c = self.calibration
        pairs = (np.int64(sum(context)) + bs * np.arange(k, dtype=np.int64) + bs).astype(np.float64)
        return (c.fixed_s + c.per_token_s * float(bs) + c.per_context_token_s * pairs).tolist()

    def describe(self) -> str:
        c = self.calibration
        return f"calibration of {c.model} on {c.device}"


def decode_run_seconds(cost, context, k: int) -> list[float]:
    """Seconds of ``k`` decode steps of a batch whose requests start after ``context`` tokens
    (each step one new token each): the model's own bulk form, else step by step."""
    bulk = getattr(cost, "decode_run_seconds", None)
    if bulk is not None:
        return bulk(context, k)
    ones = [1] * len(context)
    return [cost.seconds(ones, [c + j for c in context]) for j in range(k)]


def step_cost(model: str | None = None, gpu: str | None = None, calibration: str | None = None):
    """The step-time model the options ask for; a ConfigError says what is missing."""
    if calibration is not None:
        return CalibratedStepCost(Calibration.load(calibration))
    if model is None or gpu is None:
        raise ConfigError("--replay timed needs --model and --gpu (a roofline) or --calibration")
    peak = device_peak(gpu)
    if peak is None:
        raise ConfigError(f"no peak FLOP/s and bandwidth known for GPU {gpu!r}; "
                          "use --calibration (kvsim gpu-validate writes one)")
    return RooflineStepCost(get_model(model), peak)
