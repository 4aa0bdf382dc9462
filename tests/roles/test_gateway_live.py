"""The gateway's config as the role writes it (``haproxy_config``), run by a real HAProxy
(Debian's 2.6) in front of three local llama-server stand-ins: conversation affinity (the
same conversation on the same unit every turn, by its opening or its X-Session-Id;
different ones spread; a drained unit takes none, its own go to another; the imbalance
bound), ``leastconn``, and health checks that leave a sleeping server asleep yet catch a
hung one. Only the host's paths change for the local run (the admin socket in a temporary
folder, no chroot, user or syslog)."""

import contextlib
import json
import shutil
import subprocess
import threading
import time
import urllib.request

import pytest

from roles.gateway.plan import backends_of, haproxy_config, serving_host
from roles.gateway.settings import ADMIN_SOCKET
from roles.settings import load_settings
from tests.support.fake_llama_server import Behaviour, FakeLlamaServer
from tests.unit.test_haproxy_runtime import free_port, runtime

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None, reason="no haproxy here (apt-get install haproxy)")

SERVING = {"python_env_backend": "venv", "server_listen": "0.0.0.0", "server_allow_unauthenticated": True}
NAMES = ("lab-a", "lab-b", "lab-c")
LOCAL_ONLY = ("chroot ", "user ", "group ", "daemon", "log /dev/log")


def local_config(data: dict, fakes: list, sock: str) -> str:
    """The role's config for a gateway with ``data``, in front of ``fakes`` (a serving host
    each, one unit of 2 slots), made to run here."""
    settings = load_settings("lab-gw", {"python_env_backend": "venv", "gateway_bind": "127.0.0.1", **data},
                             groups=("lab", "gateways"))  # fmt: skip
    backends = []
    for name, fake in zip(NAMES, fakes):
        host = serving_host(name, "127.0.0.1", load_settings(name, SERVING))
        backends += backends_of(host, {"units": [{"index": 0, "port": fake.port, "listen": "0.0.0.0", "parallel": 2}]})
    text = haproxy_config(settings, backends, None).replace(ADMIN_SOCKET, sock)
    return "\n".join(line for line in text.splitlines() if not line.strip().startswith(LOCAL_ONLY)) + "\n"


@contextlib.contextmanager
def gateway(tmp_path, data: dict = (), behaviours: tuple = ()):
    """(the gateway's URL, its admin socket, the three stand-ins), HAProxy running with the
    role's config (``data``: the gateway's settings) and every unit UP."""
    behaviours = list(behaviours) + [Behaviour() for _ in range(len(NAMES) - len(behaviours))]
    with contextlib.ExitStack() as stack:
        fakes = [stack.enter_context(FakeLlamaServer(b)) for b in behaviours]
        sock, port = str(tmp_path / "admin.sock"), free_port()
        config = tmp_path / "haproxy.cfg"
        config.write_text(local_config({"gateway_port": port, "gateway_stats_port": free_port(), **dict(data)},
                                       fakes, sock))  # fmt: skip
        check = subprocess.run(["haproxy", "-c", "-q", "-f", str(config)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        proc = subprocess.Popen(["haproxy", "-db", "-f", str(config)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            deadline = time.monotonic() + 15
            while runtime(sock, "wait-up", "0", *(f"{n}_0" for n in NAMES)).returncode != 0:
                assert time.monotonic() < deadline and proc.poll() is None, "haproxy did not start"
                time.sleep(0.2)
            yield f"http://127.0.0.1:{port}", sock, fakes
        finally:
            proc.terminate()
            proc.wait(10)


def post(url: str, path: str, body: dict, headers: dict = ()) -> dict:
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **dict(headers)})  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())


def served(url: str, fakes: list, path: str, body: dict, headers: dict = ()) -> str:
    """The stand-in (its host's name) that answers ``body`` (one request at a time)."""
    before = [len(f.behaviour.bodies) for f in fakes]
    post(url, path, body, headers)
    found = [n for n, f, b in zip(NAMES, fakes, before) if len(f.behaviour.bodies) > b]
    assert len(found) == 1, found
    return found[0]


def chat(url: str, fakes: list, messages: list, headers: dict = ()) -> str:
    """One turn (``messages``: the whole history so far); the unit that answered it."""
    return served(url, fakes, "/v1/chat/completions", {"messages": list(messages), "max_tokens": 4}, headers)


def conversation(url: str, fakes: list, opening: list, turns: int = 6, headers: dict = ()) -> list:
    """A conversation of ``turns`` turns, each sending the history again with the answer and a
    new question (the history grows past the 256 bytes and the size of the first turn); the
    unit of each turn."""
    messages, units = list(opening), []
    for turn in range(turns):
        units.append(chat(url, fakes, messages, headers))
        messages += [{"role": "assistant", "content": f"answer {turn} " * 40},
                     {"role": "user", "content": f"and then, question {turn}?"}]  # fmt: skip
    return units


def user(text) -> dict:
    return {"role": "user", "content": text}


def test_a_conversation_stays_on_its_unit_and_different_ones_spread(tmp_path):
    with gateway(tmp_path) as (url, _, fakes):
        homes = []
        for n in range(12):
            units = conversation(url, fakes, [user(f"Conversation {n}: tell me about the number {n * 37}.")])
            assert len(set(units)) == 1, (n, units)  # every turn on the unit of the first
            homes.append(units[0])
        assert set(homes) == set(NAMES), homes  # deterministic: the same ring, the same openings
        assert max(homes.count(n) for n in NAMES) <= 6, homes
        # a system prompt before it (the same for all): the first user message keys it
        system = {"role": "system", "content": "You are a helpful assistant."}
        homes = [conversation(url, fakes, [system, user(f"Question {n}: why is the sky blue?")]) for n in range(9)]
        assert all(len(set(h)) == 1 for h in homes) and len({h[0] for h in homes}) > 1, homes
        # content as a list of parts, as multimodal clients send it
        parts = [{"role": "user", "content": [{"type": "text", "text": f"Describe picture {n}."}]} for n in range(6)]
        homes = [conversation(url, fakes, [p], turns=3) for p in parts]
        assert all(len(set(h)) == 1 for h in homes) and len({h[0] for h in homes}) > 1, homes


def test_the_session_header_keys_the_conversation(tmp_path):
    with gateway(tmp_path) as (url, _, fakes):
        for n in range(6):
            session = {"X-Session-Id": f"session-{n}"}
            units = [chat(url, fakes, [user(f"an unrelated opening {turn}")], session) for turn in range(5)]
            assert len(set(units)) == 1, units  # the header, not the body
        homes = {chat(url, fakes, [user("the same opening")], {"X-Session-Id": f"s{n}"}) for n in range(12)}
        assert len(homes) > 1, homes


def test_a_growing_completion_prompt_stays_on_its_unit(tmp_path):
    with gateway(tmp_path) as (url, _, fakes):
        homes = set()
        for n in range(6):
            prompt, units = f"<|user|>Story {n}: once upon a time, " + "there was a rack " * 20, []
            for turn in range(4):
                units.append(served(url, fakes, "/completion", {"prompt": prompt, "n_predict": 4}))
                prompt += f" and then {turn}" * 10
            assert len(set(units)) == 1, units
            homes.add(units[0])
        assert len(homes) > 1, homes


def test_a_drained_unit_takes_no_new_conversation_and_its_own_move(tmp_path):
    with gateway(tmp_path) as (url, sock, fakes):
        openings = [[user(f"Conversation {n} about ships")] for n in range(12)]
        homes = [chat(url, fakes, o) for o in openings]
        drained = homes[0]
        assert runtime(sock, "set", "drain", f"{drained}_0").returncode == 0
        # a returning conversation of the drained unit goes to another, and stays there
        moved = conversation(url, fakes, openings[0], turns=4)
        assert drained not in moved and len(set(moved)) == 1, moved
        # no new conversation, and no returning one, reaches it
        before = len(fakes[NAMES.index(drained)].behaviour.bodies)
        for n in range(20):
            chat(url, fakes, [user(f"New conversation {n} about trains")])
        for o in openings:
            chat(url, fakes, o)
        assert len(fakes[NAMES.index(drained)].behaviour.bodies) == before
        # the others keep their units
        assert [chat(url, fakes, o) for i, o in enumerate(openings) if homes[i] != drained] == \
            [h for h in homes if h != drained]  # fmt: skip
        assert runtime(sock, "set", "ready", f"{drained}_0").returncode == 0
        assert chat(url, fakes, openings[0]) == drained  # back on its unit once it is ready


def concurrent(url: str, count: int, headers: dict) -> list:
    """``count`` requests of one conversation at once (the stand-ins answer after a second)."""
    errors = []

    def one(i):
        try:
            post(url, "/v1/chat/completions", {"messages": [user(f"request {i}")], "max_tokens": 4}, headers)
        except Exception as e:  # noqa: BLE001 (counted below)
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
        time.sleep(0.02)  # one after another: each sees the ones before it in flight
    for t in threads:
        t.join()
    return errors


def test_the_imbalance_bound_holds(tmp_path):
    slow = [Behaviour(completion_delay=1.0) for _ in NAMES]
    with gateway(tmp_path, {"gateway_balance_factor": 150}, slow) as (url, _, fakes):
        assert concurrent(url, 12, {"X-Session-Id": "one-hot-session"}) == []
        counts = sorted(len(f.behaviour.bodies) for f in fakes)
        # 12 in flight over 3 units: the conversation's unit takes no more than 150% of the mean (4);
        # the rest go to the next unit of the ring that is under the bound
        assert sum(counts) == 12 and counts[-1] == 6 and counts[-2] > 0, counts
    slow = [Behaviour(completion_delay=1.0) for _ in NAMES]
    with gateway(tmp_path, {}, slow) as (url, _, fakes):  # the default, 300%: light load stays on its unit
        assert concurrent(url, 3, {"X-Session-Id": "one-hot-session"}) == []
        assert sorted(len(f.behaviour.bodies) for f in fakes) == [0, 0, 3]


def test_leastconn_spreads_a_conversation(tmp_path):
    with gateway(tmp_path, {"gateway_balance": "leastconn"}) as (url, _, fakes):
        units = conversation(url, fakes, [user("Conversation about leastconn")], turns=9)
        assert len(set(units)) > 1, units  # no affinity: idle units take turns


def test_the_checks_leave_a_sleeping_server_asleep_and_catch_a_hung_one(tmp_path):
    asleep = [Behaviour(sleep_idle_seconds=0.5, wake_delay=0.3) for _ in NAMES]
    with gateway(tmp_path, {"gateway_check_timeout": 1}, asleep) as (url, sock, fakes):
        time.sleep(5)  # two check intervals and more
        seen = json.loads(runtime(sock, "show").stdout)["servers"]
        assert {n: s["status"] for n, s in seen.items()} == {f"{n}_0": "UP" for n in NAMES}
        for f in fakes:
            asked = {path for _, path in f.behaviour.requests}
            assert asked == {"/health", "/metrics"}, asked  # never /slots
            assert f.behaviour.sleeping() and f.behaviour.wakes == 0
        body = {"messages": [user("wake up")], "max_tokens": 4}
        started = time.monotonic()
        assert post(url, "/v1/chat/completions", body)["choices"]
        assert time.monotonic() - started >= 0.3  # it waited for the wake
        assert sum(f.behaviour.wakes for f in fakes) == 1
        # a hung main loop: /health still answers, /metrics does not within gateway_check_timeout
        hung = fakes[1]
        hung.behaviour.sleep_idle_seconds, hung.behaviour.hang_loop = None, 5.0
        deadline = time.monotonic() + 20
        while json.loads(runtime(sock, "show").stdout)["servers"]["lab-b_0"]["status"] != "DOWN":
            assert time.monotonic() < deadline, "the hung unit stayed in service"
            time.sleep(0.5)
        assert json.loads(runtime(sock, "show").stdout)["servers"]["lab-b_0"]["check"] == "L7TOUT"
