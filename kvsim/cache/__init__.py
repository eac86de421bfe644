"""The cache designs kvsim models (apc/, radix/), the interfaces their engines implement
(base.py) and the registry that names them (registry.py)."""
