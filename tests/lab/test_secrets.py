"""Neither secret (the hub token, the API key) is anywhere it should not be.

A deploy at the highest verbosity (``-vvv --debug``) with a hub that
requires a token and an API key, with a model change so that a fetch runs
and the token goes up. Then both secrets are looked for in the run's whole
output; in every process's command line and environment on the host,
sampled while the run goes; in every file of the host (all but /proc, /sys,
/dev and the rack's shared ccache), its journal and the unit. Only the key's
own file may hold the key (mode 640), and nothing may hold the token once
the fetch has read it.
"""

import shlex
import subprocess
import urllib.error
import urllib.request

import pytest

from llamarack_lab import services
from llamarack_lab.hub_server import HubServer
from llamarack_lab.pytest_plugin import parse_pyinfra_totals
from llamarack.layout import API_KEY_PATH, UNIT_PATH
from tests.lab import deploying

pytestmark = pytest.mark.lab

HOST = "lab-v100-b"
TOKEN = "hf_lab_secretgrep_5b8e01c2d4"
KEY = "sk-lab-secretgrep-93f7a6e1"

# Every process's argv and environment, every 20 ms, each distinct one printed once
# (NULs made spaces). In Python: a shell forking tr per process would slow the run.
SAMPLE = """
import os, time
seen = set()
while True:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for part in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    text = f.read().replace(b"\\0", b" ").replace(b"\\n", b" ")
            except OSError:
                continue
            if text and text not in seen:
                seen.add(text)
                os.write(1, text + b"\\n")
    time.sleep(0.02)
"""


class Sampler:
    """The sampling loop on the host, its output to a local file (no thread: the
    tests' process may have gevent's patching)."""

    def __init__(self, lab_rack, out):
        self.out = open(out, "wb")
        self.proc = subprocess.Popen(lab_rack.rack.ssh_command(HOST, f"python3 -c {shlex.quote(SAMPLE)}"),
                                     stdout=self.out)  # fmt: skip

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.out.close()
        lines = open(self.out.name, "rb").read().splitlines()
        self.lines = len(lines)
        self.saw_convert = any(b"convert_hf_to_gguf.py" in line for line in lines)
        self.hits = [line.decode(errors="replace")[:300] for line in lines
                     if TOKEN.encode() in line or KEY.encode() in line]  # fmt: skip


def holders(lab_rack) -> list[str]:
    """Every file on the host holding either secret, with its mode: 'MODE PATH'."""
    find = ("find / \\( -path /proc -o -path /sys -o -path /dev -o -path /var/cache/llamarack-ccache \\) -prune "
            "-o -type f -print0 | xargs -0 grep -lsF -e \"$1\" -e \"$2\" | xargs -r stat -c '%a %n'")  # fmt: skip
    r = lab_rack.ssh(HOST, f"sh -c {shlex.quote(find)} - {shlex.quote(TOKEN)} {shlex.quote(KEY)}", timeout=900)
    return sorted(r.stdout.splitlines())


def status(url: str, headers: dict | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture
def secrets(tmp_path):
    hub = HubServer({services.HUB_REPO: services.prepare_hub()}, token=TOKEN, host="10.77.0.1")
    files = {}
    for name, value in (("token", TOKEN), ("api-key", KEY)):
        files[name] = tmp_path / name
        files[name].write_text(value + "\n")
        files[name].chmod(0o600)
    with hub:
        yield hub, files


def test_neither_secret_is_in_output_argv_environment_files_journal_or_unit(lab_rack, secrets, tmp_path):
    hub, files = secrets
    rc, out = deploying.deploy(lab_rack, HOST)  # converged first: the run below has only the secrets' work
    assert rc == 0, out[-4000:]
    deploying.sh(lab_rack, HOST, "cd /opt/llamarack/models && cur=$(readlink current) && "
                 "for d in */; do [ \"${d%/}\" = current ] || [ \"${d%/}\" = \"$cur\" ] || rm -rf \"$d\"; done")
    # and the blob cache: else the checkpoint comes from the host's cache, and no token goes up
    deploying.sh(lab_rack, HOST, "rm -rf /opt/llamarack/cache")
    sampler = Sampler(lab_rack, tmp_path / "samples")
    try:
        rc, out = lab_rack.run_pyinfra(
            deploying.ROOT / "deploy.py", "-vvv", "--debug", "--limit", HOST,
            "--data", f"model_hf_endpoint={hub.url}", "--data", f"model_hf_token_file={files['token']}",
            "--data", f"server_api_key_file={files['api-key']}", "--data", "model_convert_outtype=f32",
            inventory=deploying.ROOT / "inventory/lab.py", timeout=1800,
        )  # fmt: skip
    finally:
        sampler.stop()
    assert rc == 0, out[-6000:]
    # The fetch ran with the token: every hub request was authorised, and the token went up.
    assert hub.downloads("model.safetensors") and all(r.auth == "ok" for r in hub.requests)
    assert sampler.saw_convert and sampler.lines > 50, sampler.lines  # it did see the run's processes
    assert TOKEN not in out and KEY not in out
    assert sampler.hits == []
    assert holders(lab_rack) == [f"640 {API_KEY_PATH}"]
    journal = lab_rack.ssh(HOST, f"journalctl -o cat --no-pager | grep -cF -e {shlex.quote(TOKEN)} -e {shlex.quote(KEY)}").stdout.strip()
    assert journal == "0"
    assert deploying.sh(lab_rack, HOST, f"grep -cF -e {TOKEN} -e {KEY} {UNIT_PATH} || true") == "0"
    # The key works (the server read its file); a second run with both changes nothing.
    url = f"http://{lab_rack.rack.host(HOST)['ip']}:8080/v1/models"
    assert status(url) == 401 and status(url, {"Authorization": f"Bearer {KEY}"}) == 200
    before = deploying.state(lab_rack, HOST)
    rc, out = lab_rack.run_pyinfra(
        deploying.ROOT / "deploy.py", "-vvv", "--limit", HOST, "--data", f"model_hf_endpoint={hub.url}",
        "--data", f"model_hf_token_file={files['token']}", "--data", f"server_api_key_file={files['api-key']}",
        "--data", "model_convert_outtype=f32", inventory=deploying.ROOT / "inventory/lab.py",
    )  # fmt: skip
    assert rc == 0 and parse_pyinfra_totals(out)["success"] == 0, out[-4000:]
    assert deploying.state(lab_rack, HOST) == before  # the key's file and mode, the unit, the server: untouched
    assert TOKEN not in out and KEY not in out
    # Back to the lab's settings for the tests that follow: the key's file goes.
    rc, out = deploying.deploy(lab_rack, HOST)
    assert rc == 0, out[-4000:]
    assert holders(lab_rack) == []
