# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Print the HTTP status of a GET of URL, or "none" when nothing answers.

    python3 -c SOURCE URL [KEY_FILE]

No proxy is asked (the URL is the server's own health URL, made from
validated settings), and a redirect is not followed: its status is the answer.
With KEY_FILE (a llama-server's API key file, its first line sent as a bearer
token; a file that is not there: no key), a status 200 is followed by what the
``/props`` beside URL says (asking does not wake a sleeping server): whether
that server sleeps (``--sleep-idle-seconds``: ``asleep``, ``awake``, or
``none`` when /props does not say), then the running process's own provenance
as one JSON object, ``{"build_info", "model_path", "total_slots"}`` (``{}``
when /props does not answer): ``200 awake {"build_info": "b1-0c1e57098", ...}``.
"""

import json
import sys
import urllib.error
import urllib.request


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def _open(url: str, token: str = "", timeout: float = 5.0):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)
    return opener.open(urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {}),
                       timeout=timeout)  # fmt: skip


def status(url: str, timeout: float = 5.0) -> str:
    try:
        with _open(url, timeout=timeout) as r:
            return str(r.status)
    except urllib.error.HTTPError as e:
        return str(e.code)


PROVENANCE = ("build_info", "model_path", "total_slots")


def props(url: str, key_file: str) -> tuple:
    """(asleep, awake or none; {build_info, model_path, total_slots}): what the /props beside
    ``url`` says of the server's sleep and of the process itself."""
    try:
        with open(key_file) as f:
            token = f.readline().strip()
    except OSError:
        token = ""
    try:
        with _open(url.rsplit("/", 1)[0] + "/props", token) as r:
            said = json.loads(r.read())
    except Exception:
        return "none", {}
    if not isinstance(said, dict):
        return "none", {}
    sleep = {True: "asleep", False: "awake"}.get(said.get("is_sleeping"), "none")
    return sleep, {k: said[k] for k in PROVENANCE if isinstance(said.get(k), (str, int)) and not isinstance(said[k], bool)}


if __name__ == "__main__":
    try:
        found = status(sys.argv[1])
    except Exception:
        found = "none"
    if found == "200" and len(sys.argv) > 2:
        sleep, provenance = props(sys.argv[1], sys.argv[2])
        found += f" {sleep} {json.dumps(provenance, sort_keys=True)}"
    print(found)
