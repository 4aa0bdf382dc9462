#!/usr/bin/env python3
"""A bounded load generator for llama-server or the gateway in front of it (standard library only).

    python3 bench/loadgen.py URL [--requests N] [--concurrency C] [--time-limit S]
                             [--api completion|chat] [--n-predict K] [--api-key-file F] [--out FILE]

Sends at most N requests, C at a time, to URL's ``/completion`` (or
``/v1/chat/completions``), and stops by itself: after N, after S seconds (no
request starts later; one under way gets what is left of S, at least 30 s), or
when its caller sets ``stop``. Only to private, loopback or link-local
addresses (the lab's, a rack's own network): a name is resolved first, and
any address outside those ranges is refused. Records each request (when it
started, its status, its latency, the error if any) and sums them up: sent,
ok, failed (an error status, or no answer), p50 and p99 latency of the
answered ones. Exit status: 0 no request failed, 1 some did, 2 refused.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Optional

PROMPT = "Write one sentence about the sea."
MIN_REQUEST_S = 30.0


class Refused(ValueError):
    pass


def check_address(url: str) -> None:
    """Refuse ``url`` unless every address its host resolves to is private, loopback or
    link-local (and not a wildcard or multicast one)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Refused(f"{url!r}: not an http(s) URL")
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 80, proto=socket.IPPROTO_TCP)
    except socket.gaierror as e:
        raise Refused(f"{parts.hostname}: cannot resolve ({e})")
    for info in infos:
        ip = ipaddress.ip_address(info[4][0].split("%")[0])
        if not (ip.is_private or ip.is_loopback or ip.is_link_local) or ip.is_unspecified or ip.is_multicast:
            raise Refused(f"{parts.hostname} is {ip}: not a private address; the load goes to the lab's or a "
                          "rack's own addresses only")  # fmt: skip


@dataclass
class Record:
    index: int
    started_s: float  # since the run began
    status: Optional[int] = None
    latency_s: Optional[float] = None
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


def percentile(values: list, q: float) -> Optional[float]:
    """The nearest-rank ``q`` percentile (0-100) of ``values``, or None for none."""
    if not values:
        return None
    ranked = sorted(values)
    return ranked[max(0, math.ceil(q / 100 * len(ranked)) - 1)]


@dataclass
class Load:
    """One bounded run: ``start()``, then ``wait()`` (or ``stop.set()`` and ``wait()``)."""

    url: str
    requests: int = 100
    concurrency: int = 4
    time_limit: float = 300.0
    api: str = "completion"
    n_predict: int = 8
    api_key: str = ""
    stop: threading.Event = field(default_factory=threading.Event)
    records: list = field(default_factory=list)

    def __post_init__(self):
        check_address(self.url)
        if self.api not in ("completion", "chat"):
            raise Refused(f"api {self.api!r}: completion or chat")
        self._next, self._lock, self._threads = 0, threading.Lock(), []
        self._began = self._ended = None

    def start(self) -> "Load":
        self._began = time.monotonic()
        self._threads = [threading.Thread(target=self._worker, daemon=True) for _ in range(max(1, self.concurrency))]
        for t in self._threads:
            t.start()
        return self

    def wait(self) -> dict:
        for t in self._threads:
            t.join()
        self._ended = time.monotonic()
        return self.summary()

    def _claim(self) -> Optional[int]:
        with self._lock:
            late = time.monotonic() - self._began >= self.time_limit
            if self._next >= self.requests or late or self.stop.is_set():
                return None
            self._next += 1
            return self._next - 1

    def _worker(self) -> None:
        while (index := self._claim()) is not None:
            record = Record(index, round(time.monotonic() - self._began, 3))
            self.one(record)
            with self._lock:
                self.records.append(record)

    def _request(self) -> urllib.request.Request:
        if self.api == "chat":
            path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}],
                                                  "max_tokens": self.n_predict}  # fmt: skip
        else:
            path, body = "/completion", {"prompt": PROMPT, "n_predict": self.n_predict}
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {self.api_key}"}
                                                          if self.api_key else {})}  # fmt: skip
        return urllib.request.Request(self.url.rstrip("/") + path, data=json.dumps(body).encode(), headers=headers)

    def one(self, record: Record) -> None:
        left = max(MIN_REQUEST_S, self.time_limit - (time.monotonic() - self._began))
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        started = time.monotonic()
        try:
            with opener.open(self._request(), timeout=left) as r:
                r.read()
                record.status = r.status
        except urllib.error.HTTPError as e:
            record.status, record.error = e.code, f"HTTP {e.code}"
        except Exception as e:  # no answer: refused, reset, timed out
            record.error = f"{type(e).__name__}: {e}"[:200]
        record.latency_s = round(time.monotonic() - started, 4)

    def summary(self) -> dict:
        answered = [r.latency_s for r in self.records if r.ok]
        failed = [r for r in self.records if not r.ok]
        return {"url": self.url, "api": self.api, "concurrency": self.concurrency, "limit_requests": self.requests,
                "limit_seconds": self.time_limit, "sent": len(self.records), "ok": len(answered),
                "failed": len(failed), "seconds": round((self._ended or time.monotonic()) - self._began, 2),
                "p50_s": percentile(answered, 50), "p99_s": percentile(answered, 99),
                "errors": sorted({r.error for r in failed if r.error})[:10]}  # fmt: skip


def parse(argv: list) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("url")
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--time-limit", type=float, default=300.0)
    p.add_argument("--api", choices=("completion", "chat"), default="completion")
    p.add_argument("--n-predict", type=int, default=8)
    p.add_argument("--api-key-file")
    p.add_argument("--out", help="write the summary and every request's record here (JSON)")
    return p.parse_args(argv)


def main(argv: list) -> int:
    a = parse(argv)
    key = open(a.api_key_file).readline().strip() if a.api_key_file else ""
    try:
        load = Load(a.url, a.requests, a.concurrency, a.time_limit, a.api, a.n_predict, key)
    except Refused as e:
        print(f"loadgen refused: {e}", file=sys.stderr)
        return 2
    summary = load.start().wait()
    print(json.dumps(summary, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"summary": summary, "requests": [asdict(r) for r in sorted(load.records, key=lambda r: r.index)]},
                      f, indent=1)  # fmt: skip
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
