"""Engine settings: typed, frozen, checked once where built; a misspelt setting is an error."""
from __future__ import annotations

import dataclasses

import pytest

from kvsim.engines.vllm.settings import APCSettings
from kvsim.engines.sglang.settings import RadixSettings
from kvsim.errors import ConfigError
from kvsim.engines.options import SimOptions


def test_a_misspelt_extra_setting_is_an_error_that_names_the_right_one():
    with pytest.raises(ConfigError, match="unknown engine setting 'finsh'.*did you mean 'finish'"):
        SimOptions(extra={"finsh": "stop"})
    with pytest.raises(ConfigError, match="unknown engine setting 'colour' in SimOptions.extra; known: ") as raised:
        SimOptions(extra={"colour": 1})
    known = str(raised.value).split("known: ", 1)[1].split(", ")
    # every engine's settings and the tier's are listed, none twice
    assert {"lora_paths", "radix_tree", "finish", "offload", "hicache_write_policy"} <= set(known)
    assert len(known) == len(set(known))


def test_every_documented_extra_setting_is_accepted():
    extra = {"radix_tree": "classic", "overlap": False, "chunked_prefill_size": 256, "finish": "stop",
             "max_new_tokens": 10, "eviction_amount": "need", "slru_protected_threshold": 3,
             "lora_paths": {"a": "/x"}}
    s = RadixSettings.from_options(SimOptions(extra=extra, eviction_policy="slru", page_size=4))
    assert (s.tree, s.overlap, s.chunked_prefill_size, s.finish, s.max_new_tokens, s.eviction_amount,
            s.policy_config, s.page_size) == ("classic", False, 256, "stop", 10, "need",
                                              {"protected_threshold": 3}, 4)
    assert APCSettings.from_options(SimOptions(extra=extra)).lora_paths == {"a": "/x"}


@pytest.mark.parametrize("make, message", [
    (lambda: RadixSettings(tree="forest"), "unknown radix tree"),
    (lambda: RadixSettings(eviction_policy="tlru", tree="classic",
                           policy_config={"threshold": 9, "next_prompt_estimate": 1}), "unified tree"),
    (lambda: RadixSettings(finish="eos"), "unknown finish"),
    (lambda: RadixSettings(eviction_amount="all"), "unknown eviction amount"),
    (lambda: RadixSettings(chunked_prefill_size=0), "chunked prefill size"),
    (lambda: RadixSettings(page_size=0), "page size"),
    (lambda: RadixSettings(page_size=4, capacity=10), "multiple of the page size"),
    (lambda: RadixSettings(eviction_policy="random"), "unknown radix eviction policy"),
    (lambda: RadixSettings(eviction_policy="slru", policy_config={"colour": 1}), "bad parameters"),
    (lambda: APCSettings(block_size=0), "block size"),
    (lambda: APCSettings(num_gpu_blocks=0), "null block"),
    (lambda: APCSettings(hash_algo="md5"), "hash algorithm"),
    (lambda: APCSettings(engine_version="0.7"), "engine-version"),
])
def test_bad_settings_fail_when_built(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_settings_are_frozen_and_normalised():
    s = RadixSettings(eviction_policy="LRU")
    assert s.eviction_policy == "lru"
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.page_size = 16  # type: ignore[misc]
    a = APCSettings(block_size=32, num_gpu_blocks=11, engine_version="v0.11.2")
    assert a.capacity_tokens == 320 and a.profile.version == "0.11"
