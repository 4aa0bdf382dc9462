# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""One real completion from a llama-server: the model loaded, and it generates.

    python3 -c SOURCE BASE_URL N_PREDICT SECONDS [KEY_FILE]

POSTs ``{"prompt": ..., "n_predict": N_PREDICT}`` to BASE_URL/completion
(KEY_FILE: the server's API key file, its first line sent as a bearer token)
and checks llama-server's answer: status 200, a ``content`` string and
``tokens_predicted`` at least 1. Prints {"status", "tokens_predicted",
"seconds"}. Exit 0: it generated; else a message saying what came back.
"""

import json
import sys
import time
import urllib.error
import urllib.request

PROMPT = "The capital of France is"


def main(base: str, n_predict: str, seconds: str, key_file: str = "") -> object:
    token = ""
    if key_file:
        try:
            with open(key_file) as f:
                token = f.readline().strip()
        except OSError:
            pass
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    body = json.dumps({"prompt": PROMPT, "n_predict": int(n_predict), "cache_prompt": False}).encode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    started = time.monotonic()
    try:
        with opener.open(urllib.request.Request(base + "/completion", data=body, headers=headers),
                         timeout=float(seconds)) as r:
            status, text = r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return f"{base}/completion answered {e.code}: {e.read().decode(errors='replace')[:300]}"
    except Exception as e:
        return f"{base}/completion: no answer ({type(e).__name__}: {e})"
    try:
        answer = json.loads(text)
        predicted = int(answer.get("tokens_predicted") or 0)
        generated = isinstance(answer.get("content"), str)
    except (ValueError, TypeError, AttributeError):
        return f"{base}/completion answered {status} with no completion: {text[:300]!r}"
    if not (generated and predicted >= 1):
        return f"{base}/completion answered {status} but generated nothing: {text[:300]!r}"
    print(json.dumps({"status": status, "tokens_predicted": predicted,
                      "seconds": round(time.monotonic() - started, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
