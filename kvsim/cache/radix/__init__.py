"""SGLang 0.5.23 RadixAttention: rules, tree, eviction policies, reference and fast engines."""
