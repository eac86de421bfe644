"""gpu-validate: a real paged prefill driven by the cache models' block tables.

Modules (torch and triton are imported only by the ones marked *):
``kernels``* Triton paged-prefill attention and KV-write kernels; ``reference``* the same in
plain torch (CPU path, test oracle); ``configs`` model shapes; ``llama``* the random-weight
Llama decoder; ``paged_cache``* the device page pool; ``block_tables`` page ids and the slot
ledger; ``cache_models`` the APC/radix models as the validation drives them; ``validate`` the
flow (FLOPs/bytes, device peaks and the fitted prefill cost it writes live in
:mod:`kvsim.costs`); ``cuda_check``* the kernel checks of ``scripts/gpu_check.sh``.
"""
