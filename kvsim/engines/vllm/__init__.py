"""vLLM 0.33.0: Automatic Prefix Caching (rules, hashing, the block pool and KV-cache manager,
readable and compiled), the sequential request life and the v1 scheduler."""
