#!/usr/bin/env python3
"""A bounded, paced load generator for llama-server or the gateway in front of it (standard library only).

    python3 bench/loadgen.py URL [--requests N] [--concurrency C] [--pace S] [--time-limit S]
                             [--api completion|chat] [--n-predict K] [--stream-share F]
                             [--api-key-file F] [--out FILE]

C clients send at most N requests in all to URL's ``/completion`` (or
``/v1/chat/completions``), and stop by themselves: after N, after the time
limit (no request starts later; one under way gets what is left of it, at
least 30 s), or when the caller sets ``stop``. Only to private, loopback or
link-local addresses (the lab's, a rack's own network): a name is resolved
first, and any address outside those ranges is refused.

Paced (``--pace S``): each client starts a request at most every S seconds (at
once after an answer slower than S). A closed loop (``--pace 0``) starts the
next request the moment an answer comes back: while no server is up the
gateway answers 503 within a millisecond, so a few seconds of outage turn
into thousands of failed requests, while a case without an outage sends few.
Paced, the clients send at most C / S requests a second whatever the answers,
so failed counts compare across cases, and ``seconds_with_failure`` says for
how long clients saw failures.

A share of the requests streams (``--stream-share F``: request i streams when
floor((i + 1) F) passes floor(i F), i.e. every k-th for F = 1/k): it asks
``"stream": true`` and reads llama-server's SSE stream (``data: {...}`` events)
to its end. Each request asks K tokens (``ignore_eos``: a model's early end of
text does not make an empty completion).

Every answer is checked. A request failed, with its reason, when it got:
no answer ("connection refused", "connection closed", "timed out", "no
connection"); another status than 200 ("HTTP 503"); a 200 whose body is empty
("empty body"), not a JSON object ("body not JSON"), holds ``error`` ("error in
body") or no completion ("empty completion": ``content`` of /completion,
``choices[0].message.content`` of chat); a streamed 200 with an error event
("stream: error event"), an event that is not JSON ("stream: event not
JSON"), no token ("stream: no token"), or that ends before its last event
(``"stop": true`` of /completion, ``data: [DONE]`` of chat: "stream: no end").

Records each request (its index, when it started, whether it streamed, its
status, its latency, a stream's first token, the reason it failed and what was
seen) and sums them up: sent, ok, failed, streamed, p50 and p99 latency of the
answered ones, the streams' first token p50, ``seconds_with_failure`` (the
distinct whole seconds since the start in which a request that started then
failed, listed in ``failure_seconds``) and the failures by reason.
Exit status: 0 no request failed, 1 some did, 2 refused.
"""

from __future__ import annotations

import argparse
import collections
import http.client
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
from typing import Iterable, Iterator, Optional

PROMPT = "Write one sentence about the sea."
MIN_REQUEST_S = 30.0
COMPACT_FIELDS = ("started_s", "status", "latency_s", "reason", "streamed")  # ``Record.compact``


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
    streamed: bool = False
    status: Optional[int] = None
    latency_s: Optional[float] = None  # to the whole answer (a stream's end)
    first_token_s: Optional[float] = None  # a stream's first token event
    error: Optional[str] = None  # why it failed: the reason, one of the module's named ones
    detail: Optional[str] = None  # what was seen (an exception, an error status's body)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    def compact(self) -> list:
        """``[started_s, status or None, latency_s, reason or None, streamed]`` (``COMPACT_FIELDS``)."""
        return [self.started_s, self.status, self.latency_s, self.error, self.streamed]


def percentile(values: list, q: float) -> Optional[float]:
    """The nearest-rank ``q`` percentile (0-100) of ``values``, or None for none."""
    if not values:
        return None
    ranked = sorted(values)
    return ranked[max(0, math.ceil(q / 100 * len(ranked)) - 1)]


def streams(index: int, share: float) -> bool:
    """Whether request ``index`` streams: ``share`` of any run of indices from 0, evenly spread."""
    return math.floor((index + 1) * share + 1e-9) > math.floor(index * share + 1e-9)


def completion_text(api: str, body: dict) -> object:
    """The completion a non-streamed answer carries (None where it has none)."""
    if api == "completion":
        return body.get("content")
    choices = body.get("choices")
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = first.get("message")
    return message.get("content") if isinstance(message, dict) else None


def body_fault(api: str, raw: bytes) -> Optional[str]:
    """Why a non-streamed 200's body is no completion, or None."""
    if not raw.strip():
        return "empty body"
    try:
        body = json.loads(raw)
    except ValueError:
        return "body not JSON"
    if not isinstance(body, dict):
        return "body not JSON"
    if "error" in body:
        return "error in body"
    text = completion_text(api, body)
    return None if isinstance(text, str) and text else "empty completion"


def stream_token(api: str, event: dict) -> bool:
    """Whether an SSE event carries generated text."""
    if api == "completion":
        text = event.get("content")
    else:
        choices = event.get("choices")
        delta = choices[0].get("delta") if isinstance(choices, list) and choices and isinstance(choices[0], dict) \
            else None  # fmt: skip
        text = delta.get("content") if isinstance(delta, dict) else None
    return isinstance(text, str) and bool(text)


def stream_fault(api: str, lines: Iterable[bytes]) -> tuple:
    """(why a streamed 200 is no completion, or None; when its first token event came, a
    ``time.monotonic()``, or None), reading the SSE body's ``lines`` to their end. The last
    event: ``"stop": true`` for /completion, ``data: [DONE]`` for chat."""
    tokens, ended, first = 0, False, None
    for raw in lines:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data:"):
            continue  # the blank line between events, a comment, an event's name
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            ended = True
            continue
        try:
            event = json.loads(data)
        except ValueError:
            return "stream: event not JSON", first
        if not isinstance(event, dict):
            return "stream: event not JSON", first
        if "error" in event:
            return "stream: error event", first
        if stream_token(api, event):
            tokens += 1
            first = first or time.monotonic()
        if api == "completion" and event.get("stop") is True:
            ended = True
    if not tokens:
        return "stream: no token", first
    return (None if ended else "stream: no end"), first


def body_lines(response) -> Iterator[bytes]:
    """A response body's lines as they come. ``read1``, not ``readline``: a chunked body cut
    short raises ``IncompleteRead`` (readline's peek hides the cut, and the body just ends)."""
    rest = b""
    while chunk := response.read1(65536):
        *whole, rest = (rest + chunk).split(b"\n")
        yield from (line + b"\n" for line in whole)
    if rest:
        yield rest


def no_answer(e: BaseException) -> str:
    """The reason of a request that got no (whole) answer."""
    if isinstance(e, urllib.error.URLError) and isinstance(e.reason, BaseException):
        e = e.reason
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, (ConnectionError, http.client.HTTPException)):
        return "connection closed"  # reset, or closed before the answer or the stream ended
    if isinstance(e, TimeoutError):
        return "timed out"
    return "no connection" if isinstance(e, OSError) else type(e).__name__


def tally(records: list) -> dict:
    """The records summed up: counts, latencies, the seconds with a failure, the reasons."""
    answered = [r.latency_s for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    streamed = [r for r in records if r.streamed]
    seconds = sorted({int(r.started_s) for r in failed})
    reasons = collections.Counter(r.error or f"HTTP {r.status}" for r in failed)
    return {"sent": len(records), "ok": len(answered), "failed": len(failed), "streamed": len(streamed),
            "streamed_failed": sum(1 for r in streamed if not r.ok),
            "p50_s": percentile(answered, 50), "p99_s": percentile(answered, 99),
            "first_token_p50_s": percentile([r.first_token_s for r in streamed if r.ok and r.first_token_s], 50),
            "seconds_with_failure": len(seconds), "failure_seconds": seconds,
            "reasons": dict(reasons.most_common()),
            "errors": sorted({r.detail or r.error or "" for r in failed})[:10]}  # fmt: skip


@dataclass
class Load:
    """One bounded run: ``start()``, then ``wait()`` (or ``stop.set()`` and ``wait()``)."""

    url: str
    requests: int = 100
    concurrency: int = 4
    time_limit: float = 300.0
    api: str = "completion"
    n_predict: int = 16
    api_key: str = ""
    pace: float = 0.0  # each client starts a request at most every ``pace`` seconds; 0: a closed loop
    stream_share: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)
    records: list = field(default_factory=list)

    def __post_init__(self):
        check_address(self.url)
        if self.api not in ("completion", "chat"):
            raise Refused(f"api {self.api!r}: completion or chat")
        if self.pace < 0 or not 0 <= self.stream_share <= 1 or self.n_predict < 1:
            raise Refused(f"pace {self.pace} (at least 0), stream share {self.stream_share} (0 to 1), "
                          f"n_predict {self.n_predict} (at least 1)")  # fmt: skip
        self._next, self._lock, self._threads = 0, threading.Lock(), []
        self._began = self._ended = None

    def start(self) -> "Load":
        self._began = time.monotonic()
        self._threads = [threading.Thread(target=self._worker, daemon=True) for _ in range(max(1, self.concurrency))]
        for t in self._threads:
            t.start()
        return self

    def since_start(self) -> float:
        """Seconds since ``start()``: the clock of the records' ``started_s``."""
        return time.monotonic() - self._began

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
            began = time.monotonic()
            record = Record(index, round(began - self._began, 3), streams(index, self.stream_share))
            self.one(record)
            with self._lock:
                self.records.append(record)
            if self.pace:  # the next start: a pace after this one's, or now when the answer was slower
                self.stop.wait(max(0.0, began + self.pace - time.monotonic()))

    def _request(self, stream: bool) -> urllib.request.Request:
        more = {"ignore_eos": True, **({"stream": True} if stream else {})}
        if self.api == "chat":
            path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}],
                                                  "max_tokens": self.n_predict, **more}  # fmt: skip
        else:
            path, body = "/completion", {"prompt": PROMPT, "n_predict": self.n_predict, **more}
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {self.api_key}"}
                                                          if self.api_key else {})}  # fmt: skip
        return urllib.request.Request(self.url.rstrip("/") + path, data=json.dumps(body).encode(), headers=headers)

    def one(self, record: Record) -> None:
        """Send one request and check its answer, into ``record``."""
        left = max(MIN_REQUEST_S, self.time_limit - (time.monotonic() - self._began))
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        started = time.monotonic()
        try:
            with opener.open(self._request(record.streamed), timeout=left) as r:
                record.status = r.status
                if r.status != 200:
                    record.error = f"HTTP {r.status}"
                elif record.streamed:
                    record.error, first = stream_fault(self.api, body_lines(r))
                    record.first_token_s = round(first - started, 4) if first else None
                else:
                    record.error = body_fault(self.api, r.read())
        except urllib.error.HTTPError as e:
            record.status, record.error = e.code, f"HTTP {e.code}"
            record.detail = f"HTTP {e.code}: {_said(e)}"
        except Exception as e:  # no (whole) answer: refused, reset, cut short, timed out
            record.error, record.detail = no_answer(e), f"{type(e).__name__}: {e}"[:200]
        record.latency_s = round(time.monotonic() - started, 4)

    def summary(self) -> dict:
        return {"url": self.url, "api": self.api, "concurrency": self.concurrency, "pace_s": self.pace,
                "stream_share": self.stream_share, "n_predict": self.n_predict, "limit_requests": self.requests,
                "limit_seconds": self.time_limit,
                "seconds": round((self._ended or time.monotonic()) - self._began, 2), **tally(self.records)}  # fmt: skip


def _said(e: urllib.error.HTTPError) -> str:
    """The start of an error answer's body, on one line."""
    try:
        return " ".join(e.read(300).decode(errors="replace").split())[:120]
    except Exception:
        return ""


def parse(argv: list) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("url")
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--pace", type=float, default=0.0, help="each client starts a request at most every S seconds")
    p.add_argument("--time-limit", type=float, default=300.0)
    p.add_argument("--api", choices=("completion", "chat"), default="completion")
    p.add_argument("--n-predict", type=int, default=16)
    p.add_argument("--stream-share", type=float, default=0.0, help="the share of requests that stream (SSE)")
    p.add_argument("--api-key-file")
    p.add_argument("--out", help="write the summary and every request's record here (JSON)")
    return p.parse_args(argv)


def main(argv: list) -> int:
    a = parse(argv)
    key = open(a.api_key_file).readline().strip() if a.api_key_file else ""
    try:
        load = Load(a.url, a.requests, a.concurrency, a.time_limit, a.api, a.n_predict, key, pace=a.pace,
                    stream_share=a.stream_share)  # fmt: skip
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
