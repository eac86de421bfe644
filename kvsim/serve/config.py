"""The settings of one ``kvsim serve`` process, checked where they are built."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

from kvsim.errors import ConfigError
from kvsim.engines.options import SimOptions

#: vLLM's context length when the model does not say otherwise is the model's own; kvsim
#: has no model, so it assumes this unless --max-model-len (or a small cache) says less
DEFAULT_MAX_MODEL_LEN = 32768
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
FINISHES = ("length", "stop")


@dataclass(frozen=True)
class ServeConfig:
    """Everything the server needs; :meth:`check` raises ConfigError on a bad combination."""

    policy: str = "apc"
    implementation: str = "fast"          # fast, or reference (the readable models, step by step)
    options: SimOptions = field(default_factory=SimOptions)
    tokenizer: str = "cl100k_base"
    chat_template: str = "llama3"
    served_model_name: str | None = None  # None: the tokenizer's name, and any model name is answered
    any_model_name: bool | None = None    # answer requests for any model name (None: when no name is given)
    lora_modules: dict[str, str] = field(default_factory=dict)   # adapter name -> path
    max_model_len: int | None = None      # None: DEFAULT_MAX_MODEL_LEN, or less if the cache is small
    default_max_tokens: int | None = 256  # a chat request without max_tokens (None: vLLM's, the rest of the context)
    finish: str = "length"                # how synthetic replies end: length or stop (a stop token)
    seed: int = 0
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    record: Path | None = None
    record_text: bool = False
    upstream: str | None = None
    upstream_api_key: str | None = None
    upstream_timeout: float = 600.0
    replay_mode: Any = None               # --replay timed: a kvsim.drive.concurrent.ReplayMode

    def __post_init__(self) -> None:
        # Without --served-model-name the server answers requests for any model name, as
        # SGLang does, and lists the tokenizer's name; with one it is strict (a 404), as vLLM.
        if self.any_model_name is None:
            object.__setattr__(self, "any_model_name", self.served_model_name is None)
        if self.served_model_name is None:
            object.__setattr__(self, "served_model_name", self.tokenizer)

    def asked_model(self, model: str | None) -> tuple[str | None, str | None]:
        """(the model name the cache model resolves, the name to answer with or None) for a
        request naming ``model``. A strict server resolves the name as given (an unknown one
        is a 404); with :attr:`any_model_name` a name that is neither the base model nor an
        adapter (``NAME`` or SGLang's ``ANYTHING:NAME``) is served by the base model and
        answered with the name asked for, as SGLang does."""
        if not self.any_model_name or not model or model == self.served_model_name or model in self.lora_modules:
            return model, None
        head, sep, tail = model.partition(":")
        if sep and tail.strip() in self.lora_modules:
            return f"{self.served_model_name}:{tail.strip()}", None
        return None, model

    def check(self) -> None:
        from kvsim.engines import registry

        if self.policy not in registry.names():
            raise ConfigError(f"--policy must be {' or '.join(registry.names())} for serve, got {self.policy!r}")
        if self.implementation not in ("fast", "reference"):
            raise ConfigError(f"--implementation must be fast or reference, got {self.implementation!r}")
        if self.finish not in FINISHES:
            raise ConfigError(f"--finish must be length or stop, got {self.finish!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"--max-model-len must be at least 2, got {self.max_model_len}")
        if self.default_max_tokens is not None and self.default_max_tokens < 1:
            raise ConfigError(f"--default-max-tokens must be at least 1, got {self.default_max_tokens}")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"--max-body-bytes must be at least 1024, got {self.max_body_bytes}")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"--port must be in 0..65535 (0: any free port), got {self.port}")
        if self.upstream_timeout <= 0:
            raise ConfigError(f"--upstream-timeout must be positive, got {self.upstream_timeout}")
        if self.upstream is not None and not self.upstream.startswith(("http://", "https://")):
            raise ConfigError(f"--upstream must be an http:// or https:// URL, got {self.upstream!r}")
        if self.replay_mode is not None and self.upstream is not None:
            raise ConfigError("--replay timed serves the scheduler model's replies; it cannot proxy (--upstream)")
        if self.served_model_name in self.lora_modules:
            raise ConfigError(f"LoRA adapter {self.served_model_name!r} has the name of the base model")
        if self.record is not None:
            if self.record.is_dir():
                raise ConfigError(f"--record {self.record}: is a directory, expected a file")
            from kvsim.errors import KvsimError
            from kvsim.outputs import check_output_path

            try:
                check_output_path(self.record)   # a missing folder is created when the record opens
            except KvsimError as e:
                raise ConfigError(f"--record {e}") from None

    def resolve_max_model_len(self, engine_limit: int | None) -> int:
        """The context length served: what the user asked, bounded by what the cache holds
        (vLLM refuses to start when one request of max_model_len cannot fit its KV cache)."""
        if self.max_model_len is None:
            return DEFAULT_MAX_MODEL_LEN if engine_limit is None else min(DEFAULT_MAX_MODEL_LEN, engine_limit)
        if engine_limit is not None and self.max_model_len > engine_limit:
            raise ConfigError(f"--max-model-len {self.max_model_len} does not fit the KV cache: one request of "
                              f"up to {engine_limit} tokens does; lower --max-model-len or raise the capacity "
                              "(vLLM refuses to start in this case too)")
        return self.max_model_len


def parse_lora_modules(items: list[str] | None) -> dict[str, str]:
    """``NAME=PATH`` items (vLLM's --lora-modules) -> {name: path}; a bare NAME is its own path."""
    out: dict[str, str] = {}
    for item in items or []:
        for part in item.split():
            name, _, path = part.partition("=")
            name = name.strip()
            if not name:
                raise ConfigError(f"--lora-modules: expected NAME=PATH, got {part!r}")
            if name in out:
                raise ConfigError(f"--lora-modules: adapter {name!r} given twice")
            out[name] = path.strip() or name
    return out
