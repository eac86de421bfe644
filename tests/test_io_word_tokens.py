"""The compiled word splitting of cl100k (kvsim.io.tokenize.word_tokens): on any texts the same ids as
tiktoken's encode(text, allowed_special="all"), however the store grows, forgets or clashes."""
from __future__ import annotations

import numpy as np
import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim.io.tokenize import word_tokens
from kvsim.io.tokenize.templates import get_template
from kvsim.io.tokenize.tokenizers import get_tokenizer
from kvsim.io.tokenize.word_tokens import WordTokens

SPECIALS = get_template("llama3").special_tokens

# pieces where the pattern's alternatives meet: contractions in either case, every kind of
# whitespace (Unicode's, and the ASCII separators that are not whitespace), digits, letters
# and numbers beyond ASCII, special tokens and halves of them, lone surrogates
FRAGMENTS = [chr(i) for i in range(128)] + [
    "'s", "'S", "'ll", "'lL", "'ve", "'Re", "'dog", " 'm", "  ", "\n\n", " \n", "\r\n", " \n x", "\t\n ",
    "123456", "hello", " world", "HELLO", "é", "漢字", "😀", "\u00a0", "\u2028", "\u0085", "\u3000", "ſ", "K",
    "١٢", "Ⅻ", "\ud800", "\udfff", "<|eot_id|>", "<|start_header_id|>", "<|endoftext|>", "<|", "|>", "eot_id|>",
]
# few kinds, so that runs where a line may be cut (newline, whitespace, non-ASCII) are common
DENSE = ["\n", "\r", " ", "\t", "\x0b", "\x1c", "\u00a0", "\u2028", "\u0085", "a", "S", "1", "!", "'", "é", "<|eot_id|>"]
texts = st.lists(st.one_of(st.lists(st.sampled_from(FRAGMENTS), max_size=60), st.lists(st.sampled_from(DENSE), max_size=30))
                 .map("".join), min_size=1, max_size=6)


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer("cl100k_base", SPECIALS)


def fresh(tok) -> WordTokens:
    return WordTokens(tok._enc, tok.special_token_ids)


def expected(tok, batch):
    return [tok._enc.encode(t, allowed_special="all") for t in batch]


def encoded(words: WordTokens, tok, batch):
    return [a.tolist() for a in words.encode(batch, tok._encode_whole)]


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=texts)
def test_equals_tiktoken_on_any_text(tok, batch):
    assert encoded(tok._words, tok, batch) == expected(tok, batch)


def test_the_store_grows_from_its_smallest_size(tok):
    """Many distinct words, long texts and many foreign spans in one call: every array grows."""
    rng = np.random.default_rng(7)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = [" " + "".join(rng.choice(letters, rng.integers(3, 12))) for _ in range(40_000)]
    batch = ["".join(words[:20_000]), "".join(words[20_000:]) + "\nx\n" + "\n".join(["é x"] * 300),
             "\n".join(["x é"] * 300), "'ll 42"]  # one foreign span of 300, then 300 foreign spans
    store = fresh(tok)
    assert encoded(store, tok, batch) == expected(tok, batch)
    assert store._known > 30_000  # every distinct word learnt once
    assert encoded(store, tok, batch[::-1]) == expected(tok, batch[::-1])  # and reused


def test_a_clash_of_keys_gives_tiktokens_ids_and_forgets(tok):
    """Two words with one key are never confused: the call falls back to tiktoken."""
    store = fresh(tok)
    encoded(store, tok, ["alpha"])
    h = np.uint64(0xCBF29CE484222325)  # FNV-1a of " beta", the key the scanner computes
    with np.errstate(over="ignore"):
        for b in b" beta":
            h = (h ^ np.uint64(b)) * np.uint64(0x100000001B3)
    from kvsim.kernels.table import probe

    slot = probe(store._keys, h)
    store._keys[slot], store._vals[slot] = h, 0  # " beta" now keys the word "alpha"
    assert encoded(store, tok, ["alpha beta"]) == expected(tok, ["alpha beta"])
    assert store._known == 0  # forgotten


def test_forgets_beyond_its_bound(tok, monkeypatch):
    monkeypatch.setattr(word_tokens, "MAX_WORDS", 3)
    store = fresh(tok)
    batch = ["one two three four five", "six seven"]
    assert encoded(store, tok, batch) == expected(tok, batch)
    assert store._known > 3
    assert encoded(store, tok, ["eight nine"]) == expected(tok, ["eight nine"])
    assert store._known == 2  # started again from nothing: "eight", " nine"


def test_only_the_cl100k_pattern_and_overlap_free_specials(tok):
    enc = tok._enc
    assert WordTokens.usable(enc, tok.special_token_ids)
    other = tiktoken.Encoding(name="other", pat_str=r"\S+|\s+", mergeable_ranks=enc._mergeable_ranks,
                              special_tokens={})
    assert not WordTokens.usable(other, {})
    assert not WordTokens.usable(enc, {"<|a|>": enc.n_vocab, "<|a|>b": enc.n_vocab + 1})


def test_small_batches_are_left_to_tiktoken(monkeypatch):
    """Below WORD_PATH_MIN_CHARS the word path is not taken (nor its compiled code loaded)."""
    from kvsim.io.tokenize import tokenizers

    monkeypatch.setattr(tokenizers, "WORD_PATH_MIN_CHARS", 1 << 15)
    tok = tokenizers.TiktokenTokenizer(get_tokenizer("cl100k_base", SPECIALS)._enc, [])
    assert [a.tolist() for a in tok.encode_arrays(["a short text"])] == [tok.encode("a short text")]
    assert "_words" not in tok.__dict__
    big = ["a longer text " * 3000]
    assert [a.tolist() for a in tok.encode_arrays(big)] == [tok.encode(big[0])]
    assert tok.__dict__["_words"]._known == 5  # "a", " longer", " text", " a" and the last " "


def test_a_chat_log_of_real_prose_reads_as_with_tiktoken(tmp_path, monkeypatch):
    """The repository's own docs (with ×, —, ≥, accents and code) as a multi-turn chat log:
    the same trace through the word path as through tiktoken alone."""
    import json
    import random
    from pathlib import Path

    import kvsim
    from kvsim.io.tokenize import tokenizers

    docs = Path(__file__).resolve().parent.parent / "docs"
    paragraphs = [p for f in sorted(docs.glob("*.md")) for p in f.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    assert any(any(ord(c) > 127 for c in p) for p in paragraphs)
    rng = random.Random(0)
    log = tmp_path / "prose.jsonl"
    with log.open("w", encoding="utf-8") as out:
        for _ in range(40):
            messages = [{"role": "system", "content": rng.choice(paragraphs)}]
            for _ in range(4):
                messages.append({"role": "user", "content": "\n\n".join(rng.sample(paragraphs, 3))})
                reply = rng.choice(paragraphs)
                out.write(json.dumps({"messages": messages, "response": reply}, ensure_ascii=rng.random() < 0.5) + "\n")
                messages = [*messages, {"role": "assistant", "content": reply}]
    by_words = kvsim.load_trace(log)
    monkeypatch.setattr(tokenizers, "WORD_PATH_MIN_CHARS", 1 << 62)
    by_tiktoken = kvsim.load_trace(log)
    for name in ("offsets", "tokens", "output_offsets", "output_tokens", "msg_starts"):
        assert np.array_equal(getattr(by_words, name), getattr(by_tiktoken, name)), name


# -- the numba-free chunk path (kvsim.io.tokenize.chunk_tokens) ----------------------------------
ASCII = [chr(i) for i in range(1, 128)] + [
    "'s", "'S", "'ll", "'lL", "'ve", "'Re", "'dog", " 'm", "  ", "\n\n", " \n", "\r\n", " \n x", "\t\n ", "123456",
    "hello", " world", "HELLO", " internationalization", "...", "!!!???", " a1b2c3", "\x0b\x0c\x1c",
]
ascii_texts = st.lists(st.lists(st.sampled_from(ASCII), max_size=60).map("".join), min_size=1, max_size=6)


def chunks(tok) -> "ChunkTokens":
    from kvsim.io.tokenize.chunk_tokens import ChunkTokens

    return ChunkTokens(tok._enc, tok.special_token_ids)


def by_chunks(store, tok, batch):
    return [a.tolist() for a in store.encode(batch, tok._encode_whole)]


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.one_of(ascii_texts, texts))
def test_chunks_equal_tiktoken_on_any_text(tok, batch):
    """ASCII texts cut after each letter that a non-letter follows, each distinct chunk encoded
    once (the others left to tiktoken): tiktoken's ids, in a fresh store and in a used one."""
    assert by_chunks(chunks(tok), tok, batch) == expected(tok, batch)
    assert by_chunks(tok._chunks, tok, batch) == expected(tok, batch)


def test_chunks_with_one_key_are_never_confused(tok, monkeypatch):
    """Keys that meet (here: every chunk of 9 to 16 bytes keyed by its first 8) send the call
    to tiktoken; chunks longer than 16 bytes are kept by their bytes."""
    from kvsim.io.tokenize import chunk_tokens

    monkeypatch.setattr(chunk_tokens, "_MIX", np.uint64(0))
    store = chunks(tok)
    batch = [" abcdefghij abcdefghik", " internationalization internationalizations"]
    assert by_chunks(store, tok, batch) == expected(tok, batch)
    assert by_chunks(store, tok, [" abcdefghij", " abcdefghik"]) == expected(tok, [" abcdefghij", " abcdefghik"])
    assert by_chunks(store, tok, batch[1:]) == expected(tok, batch[1:])


def test_chunks_forgotten_beyond_their_bound(tok, monkeypatch):
    from kvsim.io.tokenize import chunk_tokens

    monkeypatch.setattr(chunk_tokens, "MAX_CHUNKS", 3)
    store = chunks(tok)
    batch = ["one two three four five", "six seven"]
    assert by_chunks(store, tok, batch) == expected(tok, batch)
    assert by_chunks(store, tok, ["eight nine"]) == expected(tok, ["eight nine"])
    assert len(store._starts) - 1 == 2  # started again from nothing: "eight", " nine"


def test_bulk_tokenization_takes_the_chunk_path_without_numba(tok, monkeypatch):
    """Before the word path is loaded (WORD_PATH_AFTER_CHARS, numba not imported), bulk
    tokenization goes through the chunk path."""
    from kvsim.io.tokenize import tokenizers

    fresh_tok = tokenizers.TiktokenTokenizer(tok._enc, [])
    monkeypatch.setattr(tokenizers, "WORD_PATH_AFTER_CHARS", 1 << 62)
    monkeypatch.setitem(__import__("sys").modules, "numba", None)  # as if numba were not imported
    monkeypatch.delitem(__import__("sys").modules, "numba")
    monkeypatch.setattr(tokenizers.aot, "_load", lambda: None)       # nor the kernels built ahead of time
    batch = ["a longer text " * 3000, "x"]
    assert [a.tolist() for a in fresh_tok.encode_arrays(batch)] == expected(tok, batch)
    assert "_words" not in fresh_tok.__dict__ and len(fresh_tok._chunks._starts) > 1
