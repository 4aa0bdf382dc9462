"""A local stand-in for llama-server's HTTP side, in its real formats: ``/health``,
``/slots`` (server-context.cpp's slot ``to_json``: a list of {"id", "n_ctx",
"speculative", "is_processing", ...}), ``/metrics`` (Prometheus text, ``# HELP`` /
``# TYPE`` / ``llamacpp:NAME VALUE``; 501 without ``--metrics``), ``/completion`` and
``/v1/chat/completions`` (with ``"stream": true``, server-sent events as llama-server
sends them, chunked: ``data: {...}`` and a blank line per event; /completion's last event
has ``"stop": true``, chat's OpenAI-style chunks end with ``data: [DONE]``; an error once
the stream began is the event ``data: {"error": {...}}``, and the stream ends there), and
the API key's 401 (``/health`` alone is public, as llama-server's own list says).

A chat completion's ``timings`` (its last event, or its body) say how much of its prompt came
from the server's prompt cache (``cache_n``) and how much was computed (``prompt_n``): a
word is a token, and the cache holds every prompt it answered with its answer, as
llama-server's slots and ``--cache-ram`` do.

With ``sleep_idle_seconds`` it sleeps as llama-server's ``--sleep-idle-seconds`` does
(server-queue.cpp, server-context.cpp): after that long with no task, it frees the model.
``/health``, ``/props`` (``is_sleeping``), ``/models`` and ``/metrics`` (its cached figures)
answer without waking it; ``/slots`` and a completion wake it (``wake_delay``: reloading
the model) and start the idle time again. Awake, ``/metrics`` is a task of the main loop
that does not start the idle time again, and waits for the loop as ``/slots`` does
(``hang_loop``). Tests set what it answers."""

from __future__ import annotations

import http.server
import json
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Behaviour:
    processing: list = field(default_factory=lambda: [False, False])  # one per slot
    deferred: int = 0
    metrics: bool = True
    hang_loop: float = 0.0  # seconds a task of the main loop waits (/slots; /metrics awake): the loop stuck
    api_key: str = ""
    completion_delay: float = 0.0
    completion_status: int = 200
    health_status: int = 200
    body: str | None = None  # a 200's whole body instead of the completion (not streamed)
    stream_end: bool = True  # False: a stream's body ends without its last event
    stream_error: bool = False  # an error event after the first token, and the stream ends
    stream_cut: bool = False  # the connection closed after the first token, mid-body
    requests: list = field(default_factory=list)  # (method, path) as they came
    bodies: list = field(default_factory=list)  # the POSTs' JSON bodies, as they came
    sleep_idle_seconds: float | None = None  # --sleep-idle-seconds; None: never sleeps
    wake_delay: float = 0.0  # seconds a wake takes (the model loaded again)
    model_path: str = "/opt/llamarack/models/m0/model.gguf"  # /props: the process's --model
    build_info: str = "b1-0c1e57098"  # /props: llama_build_info(), "b<number>-<commit>"
    wakes: int = 0  # how many times a request woke it
    last_task: float = field(default_factory=time.monotonic)  # when a task last started the idle time again
    cached: list = field(default_factory=list)  # the prompts it answered, as tokens (words), with their answers

    def sleeping(self) -> bool:
        return self.sleep_idle_seconds is not None and time.monotonic() - self.last_task >= self.sleep_idle_seconds

    def task(self) -> None:
        """A task that needs the model (a slot read, a completion): wakes it, and the idle time starts again."""
        if self.sleeping():
            time.sleep(self.wake_delay)
            self.wakes += 1
        self.last_task = time.monotonic()


def _slot(i: int, processing: bool) -> dict:
    return {"id": i, "n_ctx": 4096, "speculative": False, "is_processing": processing, "n_past": 12,
            "id_task": 40 + i, "n_prompt_tokens": 8, "n_prompt_tokens_processed": 8, "n_prompt_tokens_cache": 0,
            "params": {"n_predict": 16, "temperature": 0.8},
            "next_token": [{"has_next_token": processing, "has_new_line": False, "n_remain": 4, "n_decoded": 12}]}


ERROR_EVENT = {"error": {"code": 500, "message": "the slot failed", "type": "server_error"}}


def _completion_events(n: int, end: bool) -> list:
    """/completion's stream: a partial result per token, then the final one (``"stop": true``)."""
    events = [{"index": 0, "content": " Paris", "tokens": [3681], "stop": False, "id_slot": 0,
               "tokens_predicted": i + 1, "tokens_evaluated": 6} for i in range(n)]
    final = {"index": 0, "content": "", "tokens": [], "id_slot": 0, "stop": True, "model": "tiny",
             "tokens_predicted": n, "tokens_evaluated": 6, "has_new_line": False, "truncated": False,
             "stop_type": "limit", "stopping_word": "", "tokens_cached": n + 6,
             "timings": {"prompt_n": 6, "prompt_ms": 1.2, "predicted_n": n, "predicted_ms": 4.5}}
    return [json.dumps(e) for e in events] + ([json.dumps(final)] if end else [])


def _timings(b: Behaviour, request: dict, n: int) -> dict:
    """A chat completion's ``timings``: its prompt's tokens (words) found at the head of a prompt
    the server answered before (``cache_n``), the rest computed (``prompt_n``). The prompt and
    its answer are cached."""
    tokens = [w for m in request.get("messages") or () for w in f"<{m.get('role')}> {m.get('content')}".split()]
    cache_n = max((next((i for i, (a, c) in enumerate(zip(tokens, old)) if a != c), min(len(tokens), len(old)))
                   for old in b.cached), default=0)  # fmt: skip
    b.cached = (b.cached + [tokens + ["<assistant>"] + ["Paris"] * n])[-64:]
    return {"cache_n": cache_n, "prompt_n": len(tokens) - cache_n, "prompt_ms": 1.5, "predicted_n": n,
            "predicted_ms": 4.5}


def _chat_events(n: int, end: bool, timings: dict | None = None) -> list:
    """/v1/chat/completions' stream: OpenAI-style chunks (the role, a delta per token, the
    finish reason with the usage and the timings), then ``[DONE]``."""
    head = {"created": 1767225600, "id": "chatcmpl-lab", "model": "tiny", "system_fingerprint": "b1-lab",
            "object": "chat.completion.chunk"}

    def chunk(delta, finish=None, **more):
        return json.dumps({"choices": [{"finish_reason": finish, "index": 0, "delta": delta}], **head, **more})

    events = [chunk({"role": "assistant", "content": None})] + [chunk({"content": " Paris"}) for _ in range(n)]
    usage = {"completion_tokens": n, "prompt_tokens": 6, "total_tokens": n + 6}
    return events + ([chunk({}, "length", usage=usage, **({"timings": timings} if timings else {})), "[DONE]"]
                     if end else [])


def _metrics(b: Behaviour, asleep: bool = False) -> str:
    busy = 0 if asleep else sum(1 for p in b.processing if p)
    gauges = {"prompt_tokens_seconds": 120.5, "predicted_tokens_seconds": 33.25,
              "requests_processing": busy, "requests_deferred": 0 if asleep else b.deferred,
              "n_busy_slots_per_decode": 1}
    out = []
    for name, value in {"prompt_tokens_total": 96, "tokens_predicted_total": 240}.items():
        out += [f"# HELP llamacpp:{name} a counter", f"# TYPE llamacpp:{name} counter", f"llamacpp:{name} {value}"]
    for name, value in gauges.items():
        out += [f"# HELP llamacpp:{name} a gauge", f"# TYPE llamacpp:{name} gauge", f"llamacpp:{name} {value:g}"]
    return "\n".join(out) + "\n"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    behaviour: Behaviour

    def _send(self, status: int, body, content_type="application/json"):
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, events: list, first_token: int, b: Behaviour) -> None:
        """A 200 of server-sent events, chunked as llama-server sends them (``first_token``:
        the index of the first event with a token, after which a fault acts)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i, data in enumerate(events):
            self._event(data)
            if i == first_token and b.stream_cut:  # mid-body: no last chunk
                self.close_connection = True
                return
            if i == first_token and b.stream_error:
                self._event(json.dumps(ERROR_EVENT))
                break
        self.wfile.write(b"0\r\n\r\n")

    def _event(self, data: str) -> None:
        """One event (``data: ...`` and a blank line), as one chunk."""
        event = f"data: {data}\n\n".encode()
        self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
        self.wfile.flush()

    def _authorised(self) -> bool:
        b = self.behaviour
        if not b.api_key or self.path in ("/health", "/v1/health"):
            return True
        if self.headers.get("Authorization") == f"Bearer {b.api_key}":
            return True
        self._send(401, {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}})
        return False

    def do_GET(self):
        b = self.behaviour
        b.requests.append(("GET", self.path))
        if not self._authorised():
            return
        if self.path == "/health":
            self._send(b.health_status, {"status": "ok"} if b.health_status == 200 else
                       {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
        elif self.path == "/slots":
            b.task()
            time.sleep(b.hang_loop)
            self._send(200, [_slot(i, p) for i, p in enumerate(b.processing)])
        elif self.path == "/metrics":
            if not b.metrics:
                self._send(501, {"error": {"code": 501, "message": "This server does not support metrics endpoint. "
                                           "Start it with `--metrics`", "type": "not_supported_error"}})
            else:
                asleep = b.sleeping()
                time.sleep(0 if asleep else b.hang_loop)  # asleep: the figures cached when it fell asleep
                self._send(200, _metrics(b, asleep), "text/plain; version=0.0.4")
        elif self.path == "/props":
            self._send(200, {"total_slots": len(b.processing), "model_alias": "tiny", "is_sleeping": b.sleeping(),
                             "model_path": b.model_path, "build_info": b.build_info,
                             "endpoint_slots": True, "endpoint_metrics": b.metrics})
        elif self.path in ("/models", "/v1/models"):
            self._send(200, {"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": "llamacpp"}]})
        else:
            self._send(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})

    def do_POST(self):
        b = self.behaviour
        b.requests.append(("POST", self.path))
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        b.bodies.append(request)
        if not self._authorised():
            return
        b.task()
        time.sleep(b.completion_delay)
        if b.completion_status != 200:
            self._send(b.completion_status, {"error": {"code": b.completion_status, "message": "no",
                                                       "type": "server_error"}})
        elif self.path in ("/completion", "/v1/chat/completions") and request.get("stream"):
            n = int(request.get("n_predict") or request.get("max_tokens") or 4)
            if self.path == "/completion":
                self._stream(_completion_events(n, b.stream_end), 0, b)
            else:
                self._stream(_chat_events(n, b.stream_end, _timings(b, request, n)), 1, b)
        elif b.body is not None:
            self._send(200, b.body)
        elif self.path == "/completion":
            n = int(request.get("n_predict") or 4)
            self._send(200, {"content": " Paris" * n, "tokens_predicted": n, "tokens_evaluated": 6, "stop": True})
        elif self.path == "/v1/chat/completions":
            self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris"},
                                          "finish_reason": "stop"}], "object": "chat.completion",
                             "usage": {"completion_tokens": 1, "prompt_tokens": 6, "total_tokens": 7},
                             "timings": _timings(b, request, 1)})
        else:
            self._send(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})

    def log_message(self, *args):
        pass


class FakeLlamaServer:
    """``with FakeLlamaServer() as s: s.url, s.port, s.behaviour``: serves on 127.0.0.1."""

    def __init__(self, behaviour: Behaviour | None = None, port: int = 0):
        self.behaviour = behaviour or Behaviour()
        handler = type("BoundHandler", (Handler,), {"behaviour": self.behaviour})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
