"""Model shapes, KV sizes and capacity conversions (spec docs/engines/apc.md §8, docs/engines/radix.md §6)."""
import json

import pytest

from kvsim.errors import ConfigError, InputError
from kvsim.models import (GiB, apc_num_gpu_blocks, get_model, parse_bytes, radix_max_total_tokens,
                          sglang_mem_fraction_static)
from kvsim.engines.options import SimOptions


def test_llama3_8b_kv_bytes_match_the_specs_worked_examples():
    m = get_model("llama-3-8b")
    assert m.kv_bytes_per_token() == 128 * 1024                      # 128 KiB per token
    assert (60 * GiB) // (m.kv_bytes_per_token() * 16) == 30_720     # vLLM: 60 GiB -> 30,720 blocks
    assert (50 * GiB) // m.kv_bytes_per_token() == 409_600           # SGLang: 50 GiB -> 409,600 tokens


def test_mla_kv_is_latent_plus_rope_and_not_split_by_tp():
    m = get_model("deepseek-v3")
    assert m.kv_bytes_per_token() == 61 * (512 + 64) * 2
    assert m.kv_bytes_per_token(tp=8) == m.kv_bytes_per_token()


def test_gqa_heads_split_by_tensor_parallel():
    m = get_model("llama-3-70b")
    assert m.kv_bytes_per_token(tp=8) == m.kv_bytes_per_token() // 8
    assert m.kv_bytes_per_token(tp=16) == m.kv_bytes_per_token() // 8  # at least one KV head per GPU


def test_capacity_tokens_map_to_engine_units():
    opts = SimOptions(capacity_tokens=1000, block_size=16, page_size=16)
    assert apc_num_gpu_blocks(opts) == 1000 // 16 + 1                 # + the null block
    assert radix_max_total_tokens(opts) == 992                        # page-aligned
    assert apc_num_gpu_blocks(SimOptions(capacity_tokens=float("inf"))) is None
    assert radix_max_total_tokens(SimOptions()) is None
    assert radix_max_total_tokens(SimOptions(num_gpu_blocks=11, block_size=16)) == 160
    assert apc_num_gpu_blocks(SimOptions(num_gpu_blocks=11)) == 11


def test_kv_memory_with_model_converts_with_the_engine_formulas():
    opts = SimOptions(kv_cache_memory=60 * GiB, model="llama-3-8b")
    assert apc_num_gpu_blocks(opts) == 30_720
    assert radix_max_total_tokens(SimOptions(kv_cache_memory=50 * GiB, model="llama-3-8b")) == 409_600
    with pytest.raises(ConfigError, match="--model"):
        apc_num_gpu_blocks(SimOptions(kv_cache_memory=GiB))


def test_sglang_default_mem_fraction_follows_its_reserved_memory_rule():
    # H100 80 GB: 512 + 8192*1.5 + 128 + 256*2 = 13,440 MiB reserved
    assert sglang_mem_fraction_static(81559 * 1024**2) == round((81559 - 13440) / 81559, 3)
    # small GPUs: the 10 GiB floor does not apply
    assert sglang_mem_fraction_static(23034 * 1024**2) == round((23034 - (512 + 4096 * 1.5 + 128 + 96)) / 23034, 3)


def test_hf_config_json_is_read(tmp_path):
    cfg = {"num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584,
           "intermediate_size": 18944, "vocab_size": 152064, "torch_dtype": "bfloat16"}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    assert get_model(str(p)).kv_bytes_per_token() == get_model("qwen2.5-7b").kv_bytes_per_token()


@pytest.mark.parametrize("content,match", [("{", "JSON"), ("[1]", "object"), ('{"hidden_size": 1}', "num_hidden_layers")])
def test_bad_hf_config_is_a_clear_input_error(tmp_path, content, match):
    p = tmp_path / "config.json"
    p.write_text(content)
    with pytest.raises(InputError, match=match):
        get_model(str(p))


def test_unknown_model_and_bad_sizes_are_config_errors():
    with pytest.raises(ConfigError, match="unknown model"):
        get_model("gpt-9")
    assert parse_bytes("20GiB") == 20 * GiB and parse_bytes("1e9") == 10**9
    for bad in ("-3GiB", "lots", "0"):
        with pytest.raises(ConfigError):
            parse_bytes(bad)


@pytest.mark.parametrize("kwargs", [dict(block_size=0), dict(page_size=-1), dict(capacity_tokens=-5),
                                    dict(capacity_tokens=float("nan")), dict(num_gpu_blocks=0)])
def test_bad_options_are_rejected(kwargs):
    with pytest.raises(ConfigError):
        SimOptions(**kwargs)


def test_capacity_cli_prints_both_engines_and_fails_cleanly(capsys):
    from kvsim.cli import run

    assert run(["capacity", "--model", "llama-3-8b", "--gpu", "H100-80GB"]) == 0
    out = capsys.readouterr().out
    assert "131,072" in out and "num_gpu_blocks" in out and "max_total_num_tokens" in out
    assert run(["capacity", "--model", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "unknown model" in err and "Traceback" not in err


@pytest.mark.parametrize("kwargs", [dict(capacity_tokens="abc"), dict(block_size="x"), dict(num_gpu_blocks="z"),
                                    dict(block_size=16.5)])
def test_non_numeric_options_are_config_errors(kwargs):
    with pytest.raises(ConfigError, match="number"):
        SimOptions(**kwargs)


def test_numeric_strings_are_accepted():
    assert SimOptions(capacity_tokens="1e5", block_size="32").block_size == 32
