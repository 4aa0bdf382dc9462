#!/usr/bin/env python3
"""Conversations through the gateway, with and without conversation affinity: how much of
each returning turn llama-server serves from its prompt cache, and the time to first token.

    python3 bench/affinity_bench.py [--conversations N] [--concurrency C] [--turns T]
                                    [--cases leastconn,affinity] [--url URL] [--out FILE]
        (as root; the lab rack up with its gateway, converged)

The load: C clients, N conversations in all of T turns each. A conversation opens with the
rack's one system prompt and a question of its own; each turn sends the whole history
again (``/v1/chat/completions``, streamed) with the answer it got and a new question, as a
chat client does. Every answer is read to its end (``data: [DONE]``): a turn whose status
is not 200, whose stream holds an error or no token, or that ends early failed. Each
turn's ``timings`` (llama-server's last event) give ``prompt_n`` (tokens computed) and
``cache_n`` (tokens taken from the cache); a returning turn's prefix is the previous turn's
whole prompt, and its cached share ``min(1, cache_n / prefix)``.

Each case sets the gateway's ``gateway_balance`` by a deploy of the gateway alone (``pyinfra
-y inventory/lab.py deploy.py --limit lab-gw --data gateway_balance=B``), waits until the
audit finds every backend UP, and runs the load with openings of its own (a case finds no
cache of the one before). The rack is left on the default (affinity).

Writes bench/results/affinity.json, stamped by ``bench/provenance.py`` (the commit, the tree's
state, the scripts' sha256, the command, the machine): the machine's load average, the load's
shape and, per case, every turn's record and the summary:
turns sent and failed, the returning turns' cached share (all their cached prefix tokens over
all their prefix tokens, and the share of turns with 80% or more), and the time to first
token (p50, p90) of first and returning turns. With ``--url`` the load goes to that gateway
as it is configured (one case, named ``as-is``), and nothing is deployed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "lab"), str(ROOT / "bench")]

import provenance  # noqa: E402  (this folder's)
from loadgen import body_lines, check_address, no_answer, percentile  # noqa: E402  (this folder's)

INVENTORY = ROOT / "inventory/lab.py"
DEPLOY = ROOT / "deploy.py"
RESULT = ROOT / "bench/results/affinity.json"
GATEWAY, GATEWAY_PORT = "lab-gw", 8000
SYSTEM = "You are the rack's assistant. Answer in a few words."
TOPICS = ("ships", "rivers", "clocks", "bridges", "bees", "volcanoes", "lighthouses", "glaciers", "comets", "forests")
CONVERSATIONS, CONCURRENCY, TURNS, MAX_TOKENS = 24, 6, 6, 16
THINK_S = 0.3  # at most, between a turn's answer and the next question
TURN_LIMIT_S = 300.0
CACHED_ENOUGH = 0.8


@dataclass
class Turn:
    conversation: int
    turn: int
    started_s: float  # since the load began
    status: Optional[int] = None
    ttft_s: Optional[float] = None  # the first token's event, since the request was sent
    latency_s: Optional[float] = None  # to the stream's end
    prompt_n: Optional[int] = None  # prompt tokens computed
    cache_n: Optional[int] = None  # prompt tokens taken from the cache
    prefix_n: Optional[int] = None  # a returning turn's prefix: the previous turn's whole prompt
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def cached_share(self) -> Optional[float]:
        if not (self.ok and self.prefix_n and self.cache_n is not None):
            return None
        return min(1.0, self.cache_n / self.prefix_n)


def read_stream(response, started: float) -> tuple:
    """(the answer's text, the last event's ``timings``, when the first token came, why the
    stream is no whole answer or None) of a streamed chat completion."""
    text, timings, first, done = [], {}, None, False
    for raw in body_lines(response):
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        try:
            event = json.loads(data)
            piece = ((event.get("choices") or [{}])[0].get("delta") or {}).get("content")
        except (ValueError, AttributeError, IndexError):
            return "".join(text), timings, first, "stream: event not JSON"
        if "error" in event:
            return "".join(text), timings, first, "stream: error event"
        if piece:
            text.append(piece)
            first = first or round(time.monotonic() - started, 4)
        timings = event.get("timings") or timings
    fault = None if done and text else ("stream: no token" if not text else "stream: no end")
    return "".join(text), timings, first, fault


def send(url: str, messages: list, record: Turn) -> str:
    """One turn: POST the history, read the stream into ``record``; the answer's text."""
    body = {"messages": messages, "max_tokens": MAX_TOKENS, "stream": True, "ignore_eos": True}
    request = urllib.request.Request(url.rstrip("/") + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    started, text = time.monotonic(), ""
    try:
        with opener.open(request, timeout=TURN_LIMIT_S) as r:
            record.status = r.status
            text, timings, record.ttft_s, record.error = read_stream(r, started)
            record.prompt_n, record.cache_n = timings.get("prompt_n"), timings.get("cache_n")
    except urllib.error.HTTPError as e:
        record.status, record.error = e.code, f"HTTP {e.code}"
    except (OSError, http.client.HTTPException, ValueError) as e:
        record.error = no_answer(e)
    record.latency_s = round(time.monotonic() - started, 4)
    return text


def conversation(url: str, number: int, opening: str, turns: int, clock: float, rng: random.Random) -> list:
    """One conversation of ``turns`` turns (the history sent again each turn); its records.
    It stops at its first failed turn: the history it would send has no answer in it."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": opening}]
    records, prompt = [], None
    for turn in range(turns):
        record = Turn(number, turn, round(time.monotonic() - clock, 3), prefix_n=prompt)
        answer = send(url, messages, record)
        records.append(record)
        if not record.ok:
            break
        prompt = (record.prompt_n or 0) + (record.cache_n or 0)
        messages += [{"role": "assistant", "content": answer},
                     {"role": "user", "content": f"Tell me more about {rng.choice(TOPICS)}, point {turn + 2}."}]
        time.sleep(rng.random() * THINK_S)
    return records


def run_load(url: str, case: str, conversations: int, concurrency: int, turns: int,
             stop: Optional[threading.Event] = None) -> list:  # fmt: skip
    """``conversations`` conversations, ``concurrency`` at once, each opening with a question of
    its own (``case`` names them apart); every turn's record. ``stop``: no conversation starts
    once it is set (one under way finishes)."""
    check_address(url)
    clock, lock, records, left = time.monotonic(), threading.Lock(), [], list(range(conversations))
    stop = stop or threading.Event()

    def client(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            with lock:
                if not left:
                    return
                number = left.pop(0)
            opening = f"[{case} {number}] What do you know about {TOPICS[number % len(TOPICS)]} of kind {number}?"
            done = conversation(url, number, opening, turns, clock, rng)
            with lock:
                records.extend(done)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(records, key=lambda r: (r.conversation, r.turn))


def summary(records: list) -> dict:
    """Turns sent and failed; the returning turns' cached share; time to first token."""
    ok = [r for r in records if r.ok]
    returning = [r for r in ok if r.turn > 0 and r.prefix_n]
    shares = [r.cached_share for r in returning if r.cached_share is not None]
    prefix = sum(r.prefix_n for r in returning)
    cached = sum(min(r.cache_n or 0, r.prefix_n) for r in returning)
    first = [r.ttft_s for r in ok if r.turn == 0 and r.ttft_s is not None]
    later = [r.ttft_s for r in returning if r.ttft_s is not None]
    return {"sent": len(records), "failed": len(records) - len(ok),
            "reasons": sorted({r.error or f"HTTP {r.status}" for r in records if not r.ok}),
            "conversations": len({r.conversation for r in records}), "returning_turns": len(returning),
            "cached_share": round(cached / prefix, 4) if prefix else None,
            "turns_cached_enough": round(sum(s >= CACHED_ENOUGH for s in shares) / len(shares), 4) if shares else None,
            "cached_share_p10": percentile(shares, 10), "cached_share_min": min(shares, default=None),
            "prompt_n_returning_mean": round(sum(r.prompt_n or 0 for r in returning) / len(returning), 1)
            if returning else None,
            "ttft_first_p50_s": percentile(first, 50), "ttft_first_p90_s": percentile(first, 90),
            "ttft_returning_p50_s": percentile(later, 50), "ttft_returning_p90_s": percentile(later, 90)}  # fmt: skip


def pyinfra(*args: str) -> subprocess.CompletedProcess:
    from llamarack_lab.pytest_plugin import pyinfra_command

    return subprocess.run([*pyinfra_command(), "-y", str(INVENTORY), str(DEPLOY), *args], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3600)  # fmt: skip


def backends_up(timeout: float = 120) -> bool:
    """Whether the audit finds every backend of the gateway UP within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        r = subprocess.run([sys.executable, "-m", "llamarack", "audit", str(INVENTORY), "--limit", GATEWAY],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
        if r.returncode == 0 or time.monotonic() > deadline:
            return r.returncode == 0
        time.sleep(2)


def set_balance(balance: str) -> dict:
    """Deploy the gateway alone with ``gateway_balance`` = ``balance``, then wait for its backends."""
    started = time.monotonic()
    r = pyinfra("--limit", GATEWAY, "--data", f"gateway_balance={balance}")
    if r.returncode != 0:
        raise SystemExit(f"the gateway's deploy with gateway_balance={balance} failed:\n{r.stdout[-3000:]}")
    if not backends_up():
        raise SystemExit("the gateway's backends are not all UP after its deploy (llamarack audit --limit lab-gw)")
    return {"balance": balance, "deploy_s": round(time.monotonic() - started, 1)}


def header(argv: list, url: str, args: argparse.Namespace) -> dict:
    """What ran, where (the shared stamp), and the load's shape."""
    return {"benchmark": "affinity", "provenance": provenance.stamp(__file__, argv=argv),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "load": {"url": url, "api": "/v1/chat/completions (streamed)", "conversations": args.conversations,
                     "concurrency": args.concurrency, "turns": args.turns, "max_tokens": MAX_TOKENS,
                     "think_s": THINK_S, "turn_fields": list(Turn.__dataclass_fields__)}}  # fmt: skip


def parse(argv: list) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--conversations", type=int, default=CONVERSATIONS)
    p.add_argument("--concurrency", type=int, default=CONCURRENCY)
    p.add_argument("--turns", type=int, default=TURNS)
    p.add_argument("--cases", default="leastconn,affinity", help="gateway_balance values, in order")
    p.add_argument("--url", help="a gateway to load as it is (nothing deployed)")
    p.add_argument("--out", type=Path, default=RESULT)
    return p.parse_args(argv)


def main(argv: list) -> int:
    args = parse(argv)
    if args.url:
        url, cases = args.url, ["as-is"]
    else:
        from llamarack_lab import rack as rackmod

        rack = rackmod.load()
        if rack is None or not rackmod.healthy(rack):
            raise SystemExit("no healthy lab rack is up: llamarack lab up, then deploy it until it converges")
        url, cases = f"http://{rack.host(GATEWAY)['ip']}:{GATEWAY_PORT}", args.cases.split(",")
    result = header(argv, url, args)
    try:
        for case in cases:
            gateway = set_balance(case) if case != "as-is" else {}
            records = run_load(url, case, args.conversations, args.concurrency, args.turns)
            result[case] = {**gateway, "summary": summary(records), "turns": [asdict(r) for r in records]}
            print(json.dumps({case: result[case]["summary"]}, indent=1))
    finally:
        if cases[-1] not in ("affinity", "as-is"):
            set_balance("affinity")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
