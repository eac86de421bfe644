"""Offload tiers: the KV a serving engine keeps in host memory (or on disk) beside HBM.

Readable models of the three designs, re-stated from their installed source
(``docs/engines/offload.md``), pure Python and numpy, independent of kvsim's GPU engines:

- vLLM 0.33 native CPU offloading: :mod:`kvsim.tiers.vllm_policies` (LRU rank heap, ARC),
  :mod:`kvsim.tiers.vllm_offload` (``CPUOffloadingManager``, capacity from bytes) and
  :mod:`kvsim.tiers.vllm_connector` (the connector's scheduler-side rules, called where
  vLLM's scheduler calls them);
- LMCache 0.5.6: :mod:`kvsim.tiers.lmcache` (chunk keys, per-tier LRU, lookup across tiers,
  what the vLLM adapter asks to load and to save);
- SGLang 0.5.23 HiCache: :mod:`kvsim.tiers.hicache` (host pool size, write policies,
  load-back, the per-request device/host split).
"""
