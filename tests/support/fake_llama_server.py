"""A local stand-in for llama-server's HTTP side, in its real formats: ``/health``,
``/slots`` (server-context.cpp's slot ``to_json``: a list of {"id", "n_ctx",
"speculative", "is_processing", ...}), ``/metrics`` (Prometheus text, ``# HELP`` /
``# TYPE`` / ``llamacpp:NAME VALUE``; 501 without ``--metrics``), ``/completion`` and
``/v1/chat/completions``, and the API key's 401. Tests set what it answers."""

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
    hang_slots: float = 0.0  # seconds /slots takes (llama-server's queue stuck)
    api_key: str = ""
    completion_delay: float = 0.0
    completion_status: int = 200
    health_status: int = 200
    requests: list = field(default_factory=list)  # (method, path) as they came


def _slot(i: int, processing: bool) -> dict:
    return {"id": i, "n_ctx": 4096, "speculative": False, "is_processing": processing, "n_past": 12,
            "id_task": 40 + i, "n_prompt_tokens": 8, "n_prompt_tokens_processed": 8, "n_prompt_tokens_cache": 0,
            "params": {"n_predict": 16, "temperature": 0.8},
            "next_token": [{"has_next_token": processing, "has_new_line": False, "n_remain": 4, "n_decoded": 12}]}


def _metrics(b: Behaviour) -> str:
    gauges = {"prompt_tokens_seconds": 120.5, "predicted_tokens_seconds": 33.25,
              "requests_processing": sum(1 for p in b.processing if p), "requests_deferred": b.deferred,
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

    def _authorised(self) -> bool:
        b = self.behaviour
        if not b.api_key or self.path in ("/health", "/v1/health", "/models", "/v1/models"):
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
            time.sleep(b.hang_slots)
            self._send(200, [_slot(i, p) for i, p in enumerate(b.processing)])
        elif self.path == "/metrics":
            if not b.metrics:
                self._send(501, {"error": {"code": 501, "message": "This server does not support metrics endpoint. "
                                           "Start it with `--metrics`", "type": "not_supported_error"}})
            else:
                self._send(200, _metrics(b), "text/plain; version=0.0.4")
        else:
            self._send(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})

    def do_POST(self):
        b = self.behaviour
        b.requests.append(("POST", self.path))
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if not self._authorised():
            return
        time.sleep(b.completion_delay)
        if b.completion_status != 200:
            self._send(b.completion_status, {"error": {"code": b.completion_status, "message": "no",
                                                       "type": "server_error"}})
        elif self.path == "/completion":
            n = int(request.get("n_predict") or 4)
            self._send(200, {"content": " Paris" * n, "tokens_predicted": n, "tokens_evaluated": 6, "stop": True})
        elif self.path == "/v1/chat/completions":
            self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris"},
                                          "finish_reason": "stop"}], "object": "chat.completion",
                             "usage": {"completion_tokens": 1, "prompt_tokens": 6, "total_tokens": 7}})
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
