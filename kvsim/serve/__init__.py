"""``kvsim serve``: an OpenAI-compatible endpoint that answers with the cache model's
``cached_tokens``, records replayable logs, and checks a real server in proxy mode.

The life of a request (one module per step):

1. ``app``: API key, body bound (413), JSON media type; the route picks chat or completion.
2. ``protocol``: the body is validated as vLLM's OpenAI server validates it (400s).
3. ``service.prepare``: model name → base model or LoRA adapter (404 if unknown);
   ``prompts`` renders and tokenizes the prompt as ``kvsim simulate`` reads a log; the
   output budget follows vLLM (``max_model_len``).
4. ``replies``: a deterministic synthetic reply of that many tokens
   (or, in proxy mode, ``proxy`` forwards the request and collects the server's reply).
5. ``service.apply``: ``engine`` runs the request through the cache model (the only place
   that builds one); ``metrics`` and ``record`` follow in the same step.
6. ``responses``: the response object or SSE stream with ``usage.prompt_tokens_details``.

``server`` binds and runs uvicorn; ``config`` holds the settings.
"""
