"""Load on loopback: 2,000 requests from 32 concurrent openai clients; every one answered,
recorded exactly once, and the record replays to the served numbers."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from serve_helpers import read_record, start_kvsim

REQUESTS, CLIENTS = 2000, 32


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve_load")
    srv = start_kvsim(tmp, "--record", str(tmp / "record.jsonl"), "--capacity", "20000")
    srv.record = tmp / "record.jsonl"
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.stderr()


def test_2000_requests_from_32_clients(server):
    from kvsim import load_trace
    from kvsim.drive.sequential import replay
    from kvsim.engines.options import SimOptions

    systems = [f"You are assistant number {k} of the help desk. " * 20 for k in range(8)]

    def client_work(c: int) -> list[tuple[str, int]]:
        client = server.client(timeout=60)
        out = []
        for i in range(c, REQUESTS, CLIENTS):
            messages = [{"role": "system", "content": systems[i % len(systems)]},
                        {"role": "user", "content": f"question {i}"}]
            stream = i % 5 == 0
            if stream:
                chunks = list(client.chat.completions.create(
                    model="kvsim", messages=messages, max_tokens=4, stream=True,
                    stream_options={"include_usage": True}))
                out.append((chunks[0].id, chunks[-1].usage.prompt_tokens_details.cached_tokens))
            else:
                r = client.chat.completions.create(model="kvsim", messages=messages, max_tokens=4)
                out.append((r.id, r.usage.prompt_tokens_details.cached_tokens))
        client.close()
        return out

    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = [a for part in pool.map(client_work, range(CLIENTS)) for a in part]
    assert len(answers) == REQUESTS
    lines = read_record(server.record)
    assert len(lines) == REQUESTS
    ids = [line["request_id"] for line in lines]
    assert len(set(ids)) == REQUESTS and set(ids) == {a[0] for a in answers}
    served = dict(answers)
    assert [served[i] for i in ids] == [line["kvsim"]["cached_tokens"] for line in lines]
    assert sum(served.values()) > 0
    replay = replay("apc", load_trace(server.record), SimOptions(capacity_tokens=20000))
    assert replay.cached_tokens.tolist() == [served[i] for i in ids]
