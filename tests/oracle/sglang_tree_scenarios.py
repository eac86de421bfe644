"""Tree-level scenarios of ``docs/engines/radix.md §9`` (1-14) plus 0.5.23's own, written once.

``scenarios(make)`` runs them on any tree that the factory ``make(page_size, policy)``
wraps with ``ins(tokens, ns=None, prio=0)``, ``m(tokens, ns=None)``, ``node(tokens)``,
``ev(n)``, ``lock(node)``, ``unlock(handle)`` and ``sizes()`` (total, evictable,
protected). kvsim's test wraps its reference tree; run as a script under the oracle
interpreter, this file wraps the real SGLang 0.5.23 trees and prints the results:

    sglang_tree_scenarios.py radix|rust|python ...      (JSON on stdout)
"""
from __future__ import annotations

import json
import sys


def scenarios(make) -> dict:
    R = {}
    t = make()
    R["1"] = [t.ins([1, 2, 3]), t.m([1, 2, 3]), t.m([1, 2]), t.sizes()]
    t = make()
    R["2"] = [t.ins(list(range(1, 9))), t.ins([1, 2, 9, 10]), t.sizes()]
    t = make()
    R["3"] = [t.ins([1, 2, 3]), t.ins([1, 2, 3]), t.ins([1, 2, 3, 4]), t.sizes()]
    t = make()
    R["4"] = [t.ins([1, 2, 3], "k1"), t.ins([1, 2, 3], "k2"), t.sizes(), t.m([1, 2, 3], "k1"),
              t.m([1, 2, 3], "k2"), t.m([1, 2, 3]), t.m([1, 2, 3], "zz")]
    t = make(4)
    t.ins(list(range(1, 9)))
    R["5"] = [t.m(list(range(1, 11))), t.m(list(range(1, 8))), t.m([1, 2, 3, 4, 5, 6, 99, 8]), t.m([1, 2, 3])]
    t = make(2)
    R["6"] = [t.ins(list(range(1, 7))), t.ins([1, 2, 3, 9, 9, 9]), t.sizes()]
    t = make()
    t.ins([1, 2, 3])
    t.ins([4, 5])
    t.ins([6, 7, 8, 9])
    t.m([1, 2, 3])
    R["7"] = [t.ev(2), t.sizes(), t.ev(1), t.sizes()]
    t = make()
    t.ins(list(range(100)))
    R["7b"] = t.ev(1)
    t = make()
    t.ins([1, 2, 3, 4])
    t.ins([1, 2, 5, 6])
    R["8"] = [t.ev(3), t.sizes(), t.ev(10), t.sizes()]
    t = make()
    t.ins([1, 2, 3])
    h = t.lock(t.node([1, 2, 3]))
    a = [t.sizes(), t.ev(10)]
    t.unlock(h)
    R["9a"] = a + [t.sizes(), t.ev(10)]
    t = make()
    t.ins([1, 2, 3, 4])
    t.ins([1, 2, 5, 6])
    t.lock(t.node([1, 2, 5, 6]))
    R["9b"] = [t.sizes(), t.ev(100)]
    t = make()
    t.ins(list(range(1, 7)))
    t.lock(t.node(list(range(1, 7))))
    R["10"] = [t.m([1, 2, 3, 9]), t.sizes()]
    t = make()
    t.ins(list(range(1, 9)))
    t.ins([20, 21])
    R["11"] = [t.m([1, 2, 3, 9]), t.ev(1), t.ev(1), t.ev(1)]
    for pol in ("lru", "lfu", "fifo", "mru", "filo"):
        t = make(1, pol)
        t.ins([1, 2])
        t.ins([3, 4])
        t.m([1, 2])
        t.ev(1)
        R[f"12-{pol}"] = [t.m([1, 2]), t.m([3, 4])]
    t = make(1, "lfu")
    t.ins([1, 2])
    t.ins([3, 4])
    for _ in range(5):
        t.m([3, 4])
    t.m([1, 2])
    t.ev(1)
    R["13"] = [t.m([1, 2]), t.m([3, 4])]
    for pol in ("lfu", "lru", "slru"):   # 0.5.23: inserts raise hit_count, matches do not
        t = make(1, pol)
        t.ins([1, 2])
        t.ins([1, 2])
        t.ins([3, 4])
        t.m([3, 4])
        t.ev(1)
        R[f"13-insert-hits-{pol}"] = [t.m([1, 2]), t.m([3, 4])]
    t = make(1, "priority")
    t.ins([1, 2], prio=5)
    t.ins([3, 4])
    t.ins([5, 6])
    t.m([3, 4])
    R["14a"] = [[t.ev(1), t.m([5, 6]), t.m([3, 4]), t.m([1, 2])] for _ in range(3)]
    t = make(1, "priority")
    t.ins([1, 2, 3, 4])
    t.ins([1, 2, 7, 8], prio=9)
    t.ev(1)
    R["14b"] = [t.m([1, 2, 3, 4]), t.m([1, 2, 7, 8])]
    for pol in ("fifo", "filo"):         # 0.5.23 unified tree: a split keeps the creation time
        t = make(1, pol)
        t.ins(list(range(1, 9)))
        t.ins([20, 21])
        t.m([1, 2, 3, 9])
        R[f"split-creation-{pol}"] = [t.ev(1), t.ev(1), t.ev(1)]
    return R


# -- the real SGLang trees (run under the oracle interpreter) ---------------------------

def _real_factory(kind: str):
    import time
    import warnings
    from array import array

    warnings.filterwarnings("ignore")
    import torch
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", device="cpu"))
    import sglang.srt.mem_cache.radix_cache as radix_cache_module
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    class Clock:
        t = 0.0
        perf_counter = staticmethod(time.perf_counter)

        def monotonic(self):
            self.t += 1.0
            return self.t

    radix_cache_module.time = Clock()

    class Real:
        def __init__(self, page_size=1, policy="lru"):
            a = (TokenToKVPoolAllocator(size=4096, dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False)
                 if page_size == 1 else
                 PagedTokenToKVPoolAllocator(size=4096, page_size=page_size, dtype=torch.bfloat16, device="cpu",
                                             kvcache=None, need_sort=False))
            pool = ReqToTokenPool(size=4, max_context_len=64, device="cpu", enable_memory_saver=False)
            kw = dict(disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=a, page_size=page_size,
                      eviction_policy=policy)
            self.a = a
            if kind == "radix":
                self.c = RadixCache(CacheInitParams(**kw))
            else:
                self.c = UnifiedRadixCache(CacheInitParams(**kw, tree_components=(ComponentType.FULL,),
                                                           tree_core_backend=kind))

        def ins(self, tokens, ns=None, prio=0):
            v = self.a.alloc(len(tokens))
            return self.c.insert(InsertParams(key=RadixKey(array("q", tokens), ns), value=v, priority=prio)).prefix_len

        def _match(self, tokens, ns=None):
            return self.c.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens), ns)))

        def m(self, tokens, ns=None):
            return self._match(tokens, ns).device_prefix_len

        def node(self, tokens, ns=None):
            return self._match(tokens, ns).last_device_node

        def ev(self, n):
            return self.c.evict(EvictParams(num_tokens=n)).num_tokens_evicted

        def lock(self, node):
            return self.c.lock(node)

        def unlock(self, handle):
            self.c.unlock(handle)

        def sizes(self):
            total = self.c.total_size()
            total = total[0] if isinstance(total, tuple) else total
            return [int(total), int(self.c.evictable_size()), int(self.c.protected_size())]

    return Real


if __name__ == "__main__":
    out = {kind: scenarios(_real_factory(kind)) for kind in sys.argv[1:]}
    print(json.dumps(out))
