"""bench/affinity_bench.py apart from the lab: its conversations through the role's own
HAProxy config (a real HAProxy in front of three llama-server stand-ins, whose timings say
how much of each prompt their cache held), with affinity and with leastconn, and what its
summary makes of them."""

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from tests.roles.test_gateway_live import gateway
from tests.support.fake_llama_server import Behaviour, FakeLlamaServer

_spec = importlib.util.spec_from_file_location("affinity_bench",
                                               Path(__file__).resolve().parents[2] / "bench/affinity_bench.py")
bench = sys.modules.setdefault("affinity_bench", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(bench)


def test_a_conversation_resends_its_history_and_reads_each_turns_timings():
    with FakeLlamaServer() as s:
        records = bench.run_load(s.url, "one", conversations=2, concurrency=1, turns=3)
        sent = [b["messages"] for b in s.behaviour.bodies]
    assert [(r.conversation, r.turn, r.ok) for r in records] == [(c, t, True) for c in (0, 1) for t in range(3)]
    assert [len(m) for m in sent] == [2, 4, 6] * 2  # system, question; then each answer and a new question
    assert sent[1][2] == {"role": "assistant", "content": " Paris" * bench.MAX_TOKENS}
    first, second = records[0], records[1]
    assert first.prefix_n is None and first.cache_n == 0 and first.ttft_s is not None
    assert second.prefix_n == first.prompt_n + first.cache_n and second.cached_share == 1.0
    summary = bench.summary(records)
    assert (summary["sent"], summary["failed"], summary["returning_turns"], summary["cached_share"]) == (6, 0, 4, 1.0)


def test_a_failed_turn_ends_its_conversation_and_counts():
    with FakeLlamaServer(Behaviour(completion_status=503)) as s:
        records = bench.run_load(s.url, "down", conversations=3, concurrency=2, turns=4)
    assert [(r.turn, r.status, r.error) for r in records] == [(0, 503, "HTTP 503")] * 3
    assert bench.summary(records)["failed"] == 3 and bench.summary(records)["reasons"] == ["HTTP 503"]


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="no haproxy here (apt-get install haproxy)")
def test_affinity_serves_returning_turns_from_the_cache_and_leastconn_does_not(tmp_path):
    shares = {}
    for balance in ("affinity", "leastconn"):
        with gateway(tmp_path, {"gateway_balance": balance}) as (url, _, fakes):
            records = bench.run_load(url, balance, conversations=12, concurrency=3, turns=6)
        summary = bench.summary(records)
        assert summary["failed"] == 0 and summary["returning_turns"] == 60, summary
        shares[balance] = summary["cached_share"]
    assert shares["affinity"] == 1.0 and shares["leastconn"] < 0.8, shares


def test_the_result_carries_the_shared_stamp():
    args = bench.parse(["--conversations", "4"])
    head = bench.header(["--conversations", "4"], "http://10.0.0.9:8000", args)
    stamp = head["provenance"]
    assert stamp["command"] == "python3 bench/affinity_bench.py --conversations 4" and stamp["commit"]
    assert {"bench/affinity_bench.py", "bench/loadgen.py", "bench/provenance.py"} <= set(stamp["scripts"])
    assert head["load"]["conversations"] == 4 and "commit" not in head
