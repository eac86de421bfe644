"""Shared test setup: the trace cache lives in a temporary folder, never the user's."""
from __future__ import annotations

import os
import tempfile

import pytest

# Set before any test imports kvsim's CLI, and inherited by the processes tests start.
_CACHE = tempfile.TemporaryDirectory(prefix="kvsim-test-cache-")
os.environ["KVSIM_CACHE_DIR"] = _CACHE.name
os.environ.pop("KVSIM_NO_TRACE_CACHE", None)


@pytest.fixture
def trace_cache_dir(tmp_path, monkeypatch):
    """A fresh, empty cache folder for one test."""
    folder = tmp_path / "kvsim-cache"
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(folder))
    return folder


@pytest.fixture(autouse=True)
def words_on_small_texts(monkeypatch):
    """Every tokenization in bulk takes the compiled word path (kvsim.io.tokenize.word_tokens), however
    small, so the tests that compare a trace with tiktoken's encode also check that path."""
    monkeypatch.setattr("kvsim.io.tokenize.tokenizers.WORD_PATH_MIN_CHARS", 0)
    monkeypatch.setattr("kvsim.io.tokenize.tokenizers.WORD_PATH_AFTER_CHARS", 0)
    monkeypatch.setattr("kvsim.io.tokenize.tokenizers.WORD_PATH_IN_BACKGROUND", False)
