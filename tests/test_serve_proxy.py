"""Proxy mode: requests go unchanged to a real OpenAI-compatible server, answers come back
unchanged, and the record holds the server's cached_tokens beside kvsim's prediction.

Against a second ``kvsim serve`` the two must agree on every request; against a scripted
server that reports other figures, fails and stalls, every disagreement and error must be
reported and no request lost from the record.
"""
from __future__ import annotations

import json

import httpx
import pytest

from serve_helpers import read_record, start_fake_upstream, start_kvsim, start_kvsims, wait_for_record

MODEL = "kvsim"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("proxy_pair")
    servers = start_kvsims(tmp, {
        "upstream": ["--lora-modules", "team_a=/lora/a", "--served-model-name", MODEL],
        "proxy": ["--upstream", "http://127.0.0.1:{port}", "--record", str(tmp / "proxy.jsonl"),
                  "--lora-modules", "team_a=/lora/a"]})
    upstream, proxy = servers["upstream"], servers["proxy"]
    proxy.record = tmp / "proxy.jsonl"
    yield upstream, proxy
    assert proxy.stop() == 0 and upstream.stop() == 0


def _drive(client) -> list[str]:
    """A little of everything, one request at a time; returns the answers' ids."""
    ids = []
    system = {"role": "system", "content": "You are the support assistant of a bicycle shop. " * 40}
    history = []
    for turn in ("My chain skips.", "It is a 10-speed.", "Can I fix it myself?"):
        r = client.chat.completions.create(model=MODEL, messages=[system, *history, {"role": "user", "content": turn}],
                                           max_tokens=24)
        history += [{"role": "user", "content": turn}, {"role": "assistant", "content": r.choices[0].message.content}]
        ids.append(r.id)
    for salt in ("tenant:a", "tenant:b", "tenant:a"):
        r = client.chat.completions.create(model=MODEL, messages=[system, {"role": "user", "content": "Hours?"}],
                                           max_tokens=5, extra_body={"cache_salt": salt})
        ids.append(r.id)
    for model in ("team_a", "team_a", MODEL):
        r = client.chat.completions.create(model=model, messages=[system, {"role": "user", "content": "Brakes?"}],
                                           max_tokens=6)
        ids.append(r.id)
    stream = client.chat.completions.create(model=MODEL, messages=[system, {"role": "user", "content": "Tires?"}],
                                            max_tokens=9, stream=True, stream_options={"include_usage": True})
    ids.append([c.id for c in stream][0])
    stream = client.chat.completions.create(model=MODEL, messages=[system, {"role": "user", "content": "Tires?"}],
                                            max_tokens=9, stream=True)  # no usage: nothing to compare
    ids.append([c.id for c in stream][0])
    doc = "Shop manual, chapter 4: derailleur adjustment. " * 40
    r = client.completions.create(model=MODEL, prompt=doc + "Step 1:", max_tokens=7)
    ids.append(r.id)
    stream = client.completions.create(model=MODEL, prompt=doc + "Step 2:", max_tokens=7, stream=True,
                                       stream_options={"include_usage": True})
    ids.append([c.id for c in stream][0])
    r = client.chat.completions.create(model=MODEL, messages=[system, {"role": "user", "content": "Tires?"}],
                                       max_tokens=9, extra_body={"return_token_ids": True})
    ids.append(r.id)
    return ids


def test_proxy_to_kvsim_agrees_on_every_request(pair, capsys):
    upstream, proxy = pair
    ids = _drive(proxy.client())
    lines = wait_for_record(proxy.record, len(ids))
    assert [line["upstream"]["id"] for line in lines] == ids   # every request, once, in order
    compared = [line for line in lines if line["upstream"]["cached_tokens"] is not None]
    assert len(compared) == len(lines) - 1                   # the stream without include_usage
    assert all(line["upstream"]["status"] == 200 and line["upstream"]["error"] is None for line in lines)
    assert all(line["kvsim"]["cached_tokens"] == line["upstream"]["cached_tokens"] for line in compared)
    assert all(line["kvsim"]["prompt_tokens"] == line["upstream"]["prompt_tokens"] for line in compared)
    assert sum(line["kvsim"]["cached_tokens"] for line in compared) > 0

    from kvsim.cli import run

    capsys.readouterr()
    assert run(["report", str(proxy.record), "--agreement"]) == 0
    out = capsys.readouterr().out
    assert f"{len(compared)}/{len(compared)} exact (100.0%)" in out and "no disagreement" in out

    metrics = httpx.get(proxy.url + "/metrics").text
    assert f'kvsim:proxy_comparisons_total{{result="exact"}} {float(len(compared))}' in metrics
    assert httpx.get(proxy.base_url + "/models").json()["data"][0]["id"] == MODEL


def test_proxy_record_replays_to_the_predictions(pair):
    """The proxy's record is a log like any other: simulate gives the predicted numbers."""
    from kvsim import load_trace
    from kvsim.drive.sequential import replay
    from kvsim.engines.options import SimOptions

    _, proxy = pair
    lines = read_record(proxy.record)
    replay = replay("apc", load_trace(proxy.record), SimOptions())
    assert replay.cached_tokens.tolist() == [line["kvsim"]["cached_tokens"] for line in lines]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("proxy_fake")
    fake = start_fake_upstream(tmp)
    proxy = start_kvsim(tmp, "--upstream", fake.base_url, "--upstream-timeout", "1", "--record",
                        str(tmp / "proxy.jsonl"), "--record-text", name="proxy")
    proxy.record = tmp / "proxy.jsonl"
    yield fake, proxy
    assert proxy.stop() == 0
    fake.stop()


def test_disagreements_errors_and_delays_are_reported(scripted, capsys):
    import openai

    fake, proxy = scripted
    client = proxy.client()
    long = "A long shared instruction for every request of this test. " * 30

    def ask(content, cached=0, tag="x", **kw):
        headers = {"X-Fake-Cached-Tokens": str(cached), "X-Fake-Id": tag}
        return client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": content}],
                                              max_tokens=3, extra_headers=headers, **kw)

    first = ask(long + "one", 0, "a")             # kvsim: nothing cached yet; the server agrees
    assert first.choices[0].message.content == "fake upstream reply"   # the server's answer, unchanged
    second = ask(long + "two", 0, "b")            # kvsim predicts the shared blocks; the server says 0
    third = ask(long + "three", 5, "c")           # the server says 5
    with pytest.raises(openai.InternalServerError) as err:
        ask(long + "[error 500]", tag="d")
    assert "fake failure 500" in str(err.value)   # the server's own error, passed back
    with pytest.raises(openai.BadRequestError):
        ask(long + "[error 400]", tag="e")
    with pytest.raises(openai.APIStatusError) as err:
        ask(long + "[slow]", tag="f")
    assert err.value.status_code == 504
    delayed = ask(long + "[delay]", 0, "g")
    events = []
    with pytest.raises(openai.APIError, match="upstream stream broke"):   # an error event ends the stream
        for event in ask(long + "[drop]", tag="h", stream=True):
            events.append(event)
    assert events[0].choices[0].delta.content == "fake"
    bad = httpx.post(proxy.base_url + "/chat/completions", content=b'{"messages": [', timeout=10,
                     headers={"Content-Type": "application/json"})
    assert bad.status_code == 400 and "fake: invalid JSON" in bad.text   # forwarded, the server's answer

    lines = wait_for_record(proxy.record, 8)
    assert [line["upstream"]["id"] for line in lines[:3]] == ["fake-a", "fake-b", "fake-c"]
    assert len(lines) == 8                          # all but the unreadable body, none lost
    status = [line["upstream"]["status"] for line in lines]
    assert status == [200, 200, 200, 500, 400, 504, 200, 502]
    assert "fake failure 500" in lines[3]["upstream"]["error"]
    assert lines[6]["upstream"]["latency_ms"] >= 300
    assert lines[1]["kvsim"]["cached_tokens"] > 0 and lines[1]["upstream"]["cached_tokens"] == 0
    assert lines[0]["messages"][0]["content"].endswith("one")   # --record-text keeps the messages

    from kvsim.report.agreement import load_agreement

    ag = load_agreement(proxy.record)
    s = ag.summary()
    compared = [ln for ln in lines if ln["upstream"]["status"] < 400 and ln["upstream"]["error"] is None
                and ln["upstream"]["cached_tokens"] is not None]
    diffs = [abs(ln["kvsim"]["cached_tokens"] - ln["upstream"]["cached_tokens"]) for ln in compared]
    assert s["compared"] == len(compared) == 4 and s["errors"] == 4
    assert s["exact"] == diffs.count(0) and s["max_abs_diff"] == max(diffs)
    assert s["mean_abs_diff"] == pytest.approx(sum(diffs) / len(diffs))
    assert s["first_disagreement"]["line"] == 2 and s["first_disagreement"]["served"] == 0
    assert s["prompt_token_mismatches"] == 4        # every answer with usage: the fake says 1000 tokens

    capsys.readouterr()
    from kvsim.cli import run

    assert run(["report", str(proxy.record), "--agreement"]) == 0
    out = capsys.readouterr().out
    assert "first disagreement: line 2" in out and "upstream error" in out
    assert "A long shared instruction" not in out   # no prompt text unless asked
    assert run(["report", str(proxy.record), "--agreement", "--show-text"]) == 0
    assert "A long shared instruction" in capsys.readouterr().out

    metrics = httpx.get(proxy.url + "/metrics").text
    assert 'kvsim:upstream_errors_total{status="504"} 1.0' in metrics
    assert "kvsim:proxy_unmodelled_requests_total 1.0" in metrics
    assert delayed.usage.prompt_tokens == 1000


def test_report_of_a_broken_proxy_record_is_one_line(tmp_path, capsys):
    from kvsim.cli import run

    rec = tmp_path / "rec.jsonl"
    good = {"request_id": "r1", "prompt_token_ids": [1, 2], "output_token_ids": [3],
            "kvsim": {"cached_tokens": 0, "prompt_tokens": 2}, "upstream": {"status": 200, "cached_tokens": 0}}
    rec.write_text(json.dumps(good) + "\n" + json.dumps({**good, "kvsim": {"cached_tokens": "x"}}) + "\n")
    assert run(["report", str(rec), "--agreement"]) == 2
    err = capsys.readouterr().err
    assert f"{rec}:2:" in err and "Traceback" not in err
