"""The engines kvsim models, each whole in its own package: ``vllm/`` (vLLM 0.33.0's
Automatic Prefix Caching and v1 scheduler) and ``sglang/`` (SGLang 0.5.23's RadixAttention
and scheduler). ``base.py`` holds the request, the workload, the result types and the doors
the drivers call; ``registry.py`` is the one place that knows which engines exist."""
