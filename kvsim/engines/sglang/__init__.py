"""SGLang 0.5.23: RadixAttention (rules, tree, eviction policies, allocators), the request
life, and the scheduler with its queue policies and PrefillAdder."""
