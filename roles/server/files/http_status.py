# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Print the HTTP status of a GET of URL, or "none" when nothing answers.

    python3 -c SOURCE URL [KEY_FILE]

No proxy is asked (the URL is the server's own health URL, made from
validated settings), and a redirect is not followed: its status is the answer.
With KEY_FILE (a llama-server's API key file, its first line sent as a bearer
token; a file that is not there: no key), a status 200 is followed by whether
that server sleeps (``--sleep-idle-seconds``), as the ``/props`` beside URL
says (``is_sleeping``; asking does not wake it): ``200 asleep``, ``200 awake``,
or ``200 none`` when /props does not say.
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


def sleeping(url: str, key_file: str) -> str:
    """asleep, awake or none: what the /props beside ``url`` says of the server's sleep."""
    try:
        with open(key_file) as f:
            token = f.readline().strip()
    except OSError:
        token = ""
    try:
        with _open(url.rsplit("/", 1)[0] + "/props", token) as r:
            said = json.loads(r.read()).get("is_sleeping")
    except Exception:
        return "none"
    return {True: "asleep", False: "awake"}.get(said, "none")


if __name__ == "__main__":
    try:
        found = status(sys.argv[1])
    except Exception:
        found = "none"
    if found == "200" and len(sys.argv) > 2:
        found += " " + sleeping(sys.argv[1], sys.argv[2])
    print(found)
