"""The pieces of kvsim serve in-process: the engine adapter against the replays, prompts
against the log readers, replies, the record, metric names against the engines' source,
and option errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "oracle"))
from vllm_workloads import Mix, random_trace  # noqa: E402

from kvsim.engines.options import SimOptions  # noqa: E402
from kvsim.drive.requests import iter_requests  # noqa: E402
from kvsim.engines import registry  # noqa: E402


def build_engine(policy, options, implementation):
    return registry.engine(policy).serve_adapter(options, implementation)


def _serve_all(engine, trace) -> list[int]:
    return [engine.serve(r.request_id, r.prompt, r.output, r.lora, r.cache_salt, r.prompt_logprobs,
                         r.logprob_start_len).cached_tokens for r in iter_requests(trace)]


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("options", [
    SimOptions(capacity_tokens=3000),                      # evictions
    SimOptions(),                                          # unlimited: the pool grows
    SimOptions(engine_version="0.11"),                     # unlimited, freed blocks to the tail
    SimOptions(capacity_tokens=5000, block_size=32, hash_algo="sha256"),
], ids=["finite", "unlimited", "unlimited-0.11", "finite-sha256"])
def test_apc_adapter_equals_replay(options, engine):
    """Request by request, the served cached_tokens are the sequential replay's; with a
    finite pool the whole final pool (free queue order, cache map) is the step-by-step
    reference replay's too, so decoding a lone request's tokens at once changes nothing."""
    from kvsim.drive.sequential import replay, replay_detailed

    trace = random_trace(7, Mix(n=500, block_size=options.block_size))
    engine = build_engine("apc", options, engine)
    served = _serve_all(engine, trace)
    assert served == replay("apc", trace, options).cached_tokens.tolist()
    pool = engine.cache.pool
    if options.capacity_tokens is None:
        assert pool.num_blocks > 1024       # the growth path ran
        assert pool.num_evicted == 0
    else:
        result, cache = replay_detailed("apc", trace, options, implementation="reference")
        final = cache.final_state()
        assert served == result.cached_tokens.tolist()
        assert pool.num_evicted > 0 and pool.num_evicted == int(result.evictions.sum())
        assert pool.free_block_ids() == final.free_queue
        assert (len(pool.cached), pool.cached.num_blocks()) == (final.map_keys, final.cached_blocks)
        assert (engine.cache.queries, engine.cache.hits) == (result.extra["vllm_prefix_cache_queries"],
                                                            result.extra["vllm_prefix_cache_hits"])


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("options", [
    SimOptions(capacity_tokens=2000),
    SimOptions(),
    SimOptions(capacity_tokens=4096, page_size=4, eviction_policy="lfu"),
    SimOptions(capacity_tokens=3000, extra={"finish": "stop", "overlap": False}),
], ids=["finite", "unlimited", "page4-lfu", "stop-no-overlap"])
def test_radix_adapter_equals_replay(options, engine):
    from kvsim.drive.sequential import replay

    trace = random_trace(11, Mix(n=400))
    served = _serve_all(build_engine("radix", options, engine), trace)
    assert served == replay("radix", trace, options, implementation="reference").cached_tokens.tolist()


@pytest.mark.parametrize("kind", ["fast", "reference"])
def test_reset_forgets_and_requests_that_never_fit_are_rejected(kind):
    for policy in ("apc", "radix"):
        engine = build_engine(policy, SimOptions(capacity_tokens=512), kind)
        prompt, out = np.arange(300), np.arange(1000, 1010)
        engine.serve("a", prompt, out)
        assert engine.serve("b", prompt, out).cached_tokens > 0
        assert engine.reset()
        assert engine.serve("c", prompt, out).cached_tokens == 0
        too_big = engine.serve("d", np.arange(600), out)
        assert too_big.rejected and too_big.cached_tokens == 0
        assert engine.max_request_tokens() is not None and engine.max_request_tokens() <= 512


def test_max_model_len_is_bounded_by_the_cache():
    from kvsim.errors import ConfigError
    from kvsim.serve.config import ServeConfig
    from kvsim.serve.service import CacheService

    small = CacheService(ServeConfig(options=SimOptions(capacity_tokens=1000)))
    assert small.max_model_len == 1000 - 1000 % 16
    radix = CacheService(ServeConfig(policy="radix", options=SimOptions(max_total_tokens=1000, page_size=4)))
    assert radix.max_model_len == 1000 - 8
    # the longest allowed request fits an idle cache whole in both engines
    for svc in (small, radix):
        L = svc.max_model_len - 5
        served = svc.engine.serve("x", np.arange(L), np.arange(5) + 10**6)
        assert not served.rejected and served.generated == 5
    with pytest.raises(ConfigError, match="does not fit the KV cache"):
        CacheService(ServeConfig(options=SimOptions(capacity_tokens=1000), max_model_len=4096))


@pytest.mark.parametrize("template", ["llama3", "chatml", "mistral"])
def test_prompts_are_tokenized_as_simulate_reads_a_log(tmp_path, template):
    """The serve prompt ids equal what load_trace reads from the same chat / completion log."""
    from kvsim import load_trace
    from kvsim.serve.prompts import Prompter

    chats = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|eot_id|> there"}],
             [{"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "two"}]},
              {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again  "}]]
    prompter = Prompter("cl100k_base", template)
    log = tmp_path / "chat.jsonl"
    log.write_text("".join(json.dumps({"messages": m}) + "\n" for m in chats))
    trace = load_trace(log, chat_template=template)
    for i, messages in enumerate(chats):
        assert prompter.chat(messages) == trace.prompt(i).tolist()
    log = tmp_path / "completion.jsonl"
    log.write_text(json.dumps({"prompt": "Once upon a time"}) + "\n")
    trace = load_trace(log, chat_template=template)
    assert prompter.completion("Once upon a time") == trace.prompt(0).tolist()
    assert prompter.completion([[5, 6, 7]]) == [5, 6, 7]


@pytest.mark.parametrize("template", ["llama3", "chatml", "mistral"])
def test_a_reply_sent_back_is_the_tokens_generated(template):
    """A client that resends the reply in its history sends exactly the generated tokens."""
    from kvsim.serve.prompts import Prompter
    from kvsim.serve.replies import ReplyMaker

    prompter = Prompter("cl100k_base", template)
    maker = ReplyMaker(prompter.tokenizer, prompter.eot_id, seed=3)
    turn1 = [{"role": "user", "content": "Tell me about caches."}]
    for finish in ("length", "stop"):
        reply = maker.make(50, b"key", finish)
        assert len(reply.token_ids) == 50 and reply == maker.make(50, b"key", finish)
        assert reply != maker.make(50, b"other", finish)
        p1 = prompter.chat(turn1)
        p2 = prompter.chat(turn1 + [{"role": "assistant", "content": reply.text},
                                    {"role": "user", "content": "More."}])
        generated = p1 + reply.token_ids
        if finish == "stop":
            assert reply.finish_reason == "stop" and reply.token_ids[-1] == prompter.eot_id
        shared = next((i for i, (a, b) in enumerate(zip(p2, generated)) if a != b), len(generated))
        assert shared >= len(generated) - 1   # all but the last sampled token (never computed)


def test_replies_for_a_byte_tokenizer_have_the_exact_length():
    from kvsim.io.tokenize.tokenizers import get_tokenizer
    from kvsim.serve.replies import ReplyMaker

    tok = get_tokenizer("bytes")
    reply = ReplyMaker(tok, None).make(37, b"k")
    assert len(reply.token_ids) == 37 and tok.encode(reply.text) == reply.token_ids


def test_record_is_append_only(tmp_path):
    from kvsim.errors import ConfigError
    from kvsim.serve.record import Recorder

    path = tmp_path / "rec.jsonl"
    path.write_text('{"earlier": 1}\n')
    rec = Recorder(path)
    assert rec.existing_lines == 1
    rec.write({"prompt_token_ids": [1, 2]})
    rec.close()
    assert path.read_text().splitlines() == ['{"earlier": 1}', '{"prompt_token_ids":[1,2]}']
    with pytest.raises(ConfigError):
        Recorder(tmp_path)


def _oracle_site_packages() -> Path | None:
    python = os.environ.get("KVSIM_ORACLE_PYTHON")
    if not python or not Path(python).exists():
        return None
    out = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, timeout=60)
    return Path(out.stdout.strip()) if out.returncode == 0 else None


@pytest.mark.oracle
def test_metric_names_are_the_engines_own():
    """Every vllm:/sglang: series kvsim exports is defined under that name in the real code."""
    from kvsim.serve.metrics import SGLANG_NAMES, VLLM_NAMES

    site = _oracle_site_packages()
    if site is None:
        pytest.skip("KVSIM_ORACLE_PYTHON not set: the real vLLM/SGLang code is not available")
    vllm = (site / "vllm/v1/metrics/loggers.py").read_text()
    sglang = (site / "sglang/srt/observability/metrics_collector.py").read_text()
    for name in VLLM_NAMES:
        assert f'name="{name}"' in vllm, name
    for name in SGLANG_NAMES:
        assert f'name="{name}"' in sglang, name


@pytest.mark.parametrize("args,problem", [
    (["--policy", "all"], "--policy must be apc or radix"),
    (["--finish", "never"], "--finish must be length or stop"),
    (["--implementation", "turbo"], "--implementation must be fast or reference"),
    (["--port", "70000"], "--port must be in"),
    (["--record", f"{__file__}/rec.jsonl"], "is a file, cannot create the folder"),
    (["--capacity", "1000", "--max-model-len", "4096"], "does not fit the KV cache"),
    (["--tokenizer", "no-such-encoding"], "unknown tokenizer"),
    (["--lora-modules", "=x"], "expected NAME=PATH"),
    (["--upstream", "ftp://x"], "--upstream must be an http"),
])
def test_bad_options_are_one_line_and_exit_2(args, problem, capsys):
    from kvsim.cli import run

    assert run(["serve", "--port", "0", *args]) == 2
    err = capsys.readouterr().err
    assert problem in err and "Traceback" not in err


@pytest.mark.parametrize("policy", ["apc", "radix"])
def test_logprob_requests_as_each_engine_treats_them(tmp_path, policy):
    """vLLM skips the cache read for prompt_logprobs; SGLang caps the match at
    logprob_start_len and refuses a start past the prompt (yet runs a placeholder). The
    record replays to the same numbers, the refused request included."""
    from kvsim import load_trace
    from kvsim.drive.sequential import replay
    from kvsim.serve.config import ServeConfig
    from kvsim.serve.errors import ApiError
    from kvsim.serve.protocol import parse_request
    from kvsim.serve.service import CacheService

    record = tmp_path / "rec.jsonl"
    svc = CacheService(ServeConfig(policy=policy, record=record))
    messages = [{"role": "user", "content": "Logprobs and prefix caches do not mix well. " * 20}]

    def ask(**extra):
        body = json.dumps({"messages": messages, "max_tokens": 4, **extra}).encode()
        return svc.complete(svc.prepare("chat", parse_request("chat", body))).cached_tokens

    first = ask()
    full = ask()
    with_prompt_logprobs = ask(prompt_logprobs=1)
    capped = ask(logprob_start_len=20, return_logprob=True)
    refused = None
    try:
        ask(logprob_start_len=10_000, return_logprob=True)
    except ApiError as e:
        refused = e
    after = ask()
    assert first == 0 and full > 100
    assert with_prompt_logprobs == 0    # vLLM: no cache read; SGLang: the match starts at 0
    if policy == "apc":
        assert capped == full and refused is None and after == full
    else:
        assert capped == 20 and refused is not None and refused.status == 400
        assert "logprob_start_len" in refused.message and after == full
    svc.close()
    lines = read_lines(record)
    assert len(lines) == 6 and lines[2]["prompt_logprobs"] is True
    served = [line["kvsim"]["cached_tokens"] for line in lines]
    assert replay(policy, load_trace(record), SimOptions()).cached_tokens.tolist() == served


def read_lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()]
