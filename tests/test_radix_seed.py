"""The seed scenario: a code-review bot with a shared system prompt.

A = system prompt + "review this Python code", B = system prompt + "review this
JavaScript code", C = A + the assistant's reply + "explain more". The radix tree that
results, and the cached tokens each kvsim model gives C.
"""
from __future__ import annotations

import json

import pytest

import kvsim
from kvsim.engines.sglang.stats import format_tree
from kvsim.engines.options import SimOptions
from kvsim.drive.sequential import replay_detailed

SYSTEM = ("You are ReviewBot, an expert code reviewer. You review code written in Python, JavaScript "
          "and Go. Every finding names the problem, explains why it matters and shows a fix.")
A_USER = "Please review this Python code:\n\ndef add(a, b):\n    return a+b\n"
B_USER = "Please review this JavaScript code:\n\nfunction add(a, b) { return a + b }\n"
REPLY = ("The function is correct, but it lacks type hints and a docstring. Add "
         "`def add(a: int, b: int) -> int:` and a one-line docstring.")


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    records = [
        {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": A_USER}],
         "response": REPLY},
        {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": B_USER}],
         "response": "Add a semicolon."},
        {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": A_USER},
                      {"role": "assistant", "content": REPLY}, {"role": "user", "content": "Please explain more."}],
         "response": "Type hints document intent."},
    ]
    path = tmp_path_factory.mktemp("seed") / "seed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return kvsim.load_trace(path)


def shared_prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_seed_tree_and_cached_tokens(trace, capsys):
    """root -> system prompt (A, B, C) -> A's branch (A, C) -> C's continuation; B's own branch."""
    result, engine = replay_detailed("radix", trace, SimOptions())
    tree = engine.tree
    LA, LB, LC = (int(x) for x in trace.prompt_lengths)
    kA = int(trace.output_lengths[0])
    a, b, c = (trace.prompt(i) for i in range(3))
    s = shared_prefix(a, b)                       # system prompt + "Please review this"
    assert 0 < s < min(LA, LB)
    assert shared_prefix(a, c) == LA              # C extends A ...
    assert list(c[LA:LA + kA]) == list(trace.output(0))   # ... by A's reply (end of turn included)

    # SGLang: C reuses A's prompt and all of A's reply but its last token (whose KV was
    # never computed); B reuses the shared system prompt (len - 1 rule aside)
    assert list(result.cached_tokens) == [0, s, LA + kA - 1]

    print(format_tree(tree))
    printed = capsys.readouterr().out
    assert "request(s)" in printed and "tokens" in printed
    (shared,) = tree.root.children.values()
    assert (len(shared.key), shared.requests) == (s, 3)
    branches = {child.requests: child for child in shared.children.values()}
    a_branch, b_branch = branches[2], branches[1]
    # A's branch: the rest of A's prompt, then A's reply (split at the prompt boundary)
    assert len(a_branch.key) == LA - s
    (a_reply,) = a_branch.children.values()
    assert (len(a_reply.key), a_reply.requests) == (kA - 1, 2)
    # C's continuation: A's last reply token + C's new turn, then C's reply
    (c_cont,) = a_reply.children.values()
    assert (len(c_cont.key), c_cont.requests) == (LC - (LA + kA - 1), 1)
    (c_reply,) = c_cont.children.values()
    assert len(c_reply.key) == int(trace.output_lengths[2]) - 1 and not c_reply.children
    # B's own branch: the rest of B's prompt, then its reply
    assert (len(b_branch.key), b_branch.requests) == (LB - s, 1)
    (b_reply,) = b_branch.children.values()
    assert len(b_reply.key) == int(trace.output_lengths[1]) - 1
    report = result.extra["tree"]
    assert (report["nodes"], report["leaves"], report["max_depth_nodes"]) == (7, 2, 5)
    assert report["largest_shared"][0]["requests"] in (2, 3)


def test_seed_cached_tokens_radix_vs_apc(trace):
    """The same trace through both models: APC caches whole 16-token blocks only."""
    from kvsim.drive.sequential import replay

    radix, _ = replay_detailed("radix", trace, SimOptions())
    apc = replay("apc", trace, SimOptions())
    LA, kA = int(trace.prompt_lengths[0]), int(trace.output_lengths[0])
    s = shared_prefix(trace.prompt(0), trace.prompt(1))
    assert list(radix.cached_tokens) == [0, s, LA + kA - 1]
    # vLLM: full blocks of the same spans (its last token is never cached either)
    assert list(apc.cached_tokens) == [0, s // 16 * 16, (LA + kA - 1) // 16 * 16]
