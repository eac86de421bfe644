"""Compiled building blocks shared by the cache engines, the sweep and the analyzer: one
open-addressing hash table (:mod:`.table`) and one LRU stack-depth counter (:mod:`.stack`).
They know nothing about engines; the modules that use them give the numbers a meaning.
"""
