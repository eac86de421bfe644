"""vLLM 0.33 Automatic Prefix Caching: rules, hashing, block pool, reference and fast engines."""
