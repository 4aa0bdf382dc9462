"""A checkpoint whose own code tries to leave the converter's sandbox cannot, on a real systemd.

The checkpoint is the lab's tiny Llama with one change a hub could make: its
``tokenizer_config.json`` names the ``HybridDNATokenizer`` class, for which
llama.cpp's converter calls ``AutoTokenizer.from_pretrained(...,
trust_remote_code=True)``, and an ``auto_map`` that points ``AutoTokenizer`` at
the repository's own ``tokenization_escape.py``. That module runs at import:
it writes ``llamarack-escape`` wherever it can (the host's /tmp, /var/tmp,
/dev/shm, /root, /etc, the llamarack root, the served model, the blob cache,
the staging, its own checkpoint), reads /etc/shadow, connects to the lab's
hub, records what each attempt gave in its working directory (the one place
it may write), and then fails the conversion.

The deploy must fail cleanly at the convert step (the step's log tail, no
traceback of llamarack's), the code must have run as the pipeline's user with
the hub offline, none of its files may exist anywhere on the host afterwards
(the private /tmp, /var/tmp and /dev/shm are gone with the unit), and the
model served before serves on, untouched. Needs the lab:
``pytest -m lab tests/lab/test_model_sandbox.py``.
"""

import json
import shlex
import shutil

import pytest

from llamarack_lab import faults, services
from llamarack_lab.hub_server import HubServer
from llamarack_lab.profiles import GATEWAY
from llamarack_lab.pytest_plugin import parse_pyinfra_totals
from tests.lab import deploying

pytestmark = pytest.mark.lab

HOST = "lab-v100-b"
ROOT = "/opt/llamarack"
REPO = "lab/escape"
ESCAPE = "llamarack-escape"
# Written only in the unit's own private /tmp, /var/tmp and /dev/shm: gone with it.
PRIVATE = ["/tmp", "/var/tmp", "/dev/shm"]
# Refused: the system, the homes, the root, what is served, the cache (the pipeline
# user's own, read-only in the sandbox), the staging (root's) and the checkpoint.
REFUSED = ["/root", "/etc", ROOT, f"{ROOT}/models", f"{ROOT}/models/current", f"{ROOT}/cache/blobs",
           "STAGING", "WORK/hf"]  # fmt: skip

MODULE = '''# A hostile checkpoint's tokenizer code (llamarack's lab test): it runs at import.
import json, os, pwd, socket
work = os.getcwd()
report = {"uid": os.getuid(), "user": pwd.getpwuid(os.getuid()).pw_name, "cwd": work,
          "hf_hub_offline": os.environ.get("HF_HUB_OFFLINE"), "writes": {}, "reads": {}}
for where in PRIVATE + REFUSED:
    d = where.replace("STAGING", os.path.dirname(work)).replace("WORK", work)
    try:
        with open(os.path.join(d, ESCAPE), "w") as f:
            f.write("escaped\\n")
        report["writes"][where] = "written"
    except OSError as e:
        report["writes"][where] = f"{type(e).__name__}: {e.strerror}"
try:
    with open(os.path.join(work, "hf", "config.json"), "a") as f:
        f.write(" ")
    report["writes"]["WORK/hf/config.json"] = "written"
except OSError as e:
    report["writes"]["WORK/hf/config.json"] = f"{type(e).__name__}: {e.strerror}"
try:
    with open("/etc/shadow") as f:
        report["reads"]["/etc/shadow"] = "read"
except OSError as e:
    report["reads"]["/etc/shadow"] = f"{type(e).__name__}: {e.strerror}"
try:
    socket.create_connection((HUB_HOST, HUB_PORT), timeout=5).close()
    report["connect"] = "connected"
except OSError as e:
    report["connect"] = f"{type(e).__name__}: {e}"
with open(os.path.join(work, "escape-report.json"), "w") as f:
    json.dump(report, f)
print("llamarack-escape-test: " + json.dumps(report), flush=True)
raise RuntimeError("llamarack-escape-test: done")
'''


def hostile_checkpoint(tmp_path):
    """The lab's tiny model, with a tokenizer whose code the converter imports."""
    ckpt = tmp_path / "escape"
    shutil.copytree(services.prepare_hub(), ckpt)
    config = json.loads((ckpt / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "HybridDNATokenizer"  # the converter then trusts the repository's code
    config["auto_map"] = {"AutoTokenizer": ["tokenization_escape.EscapeTokenizer", None]}
    (ckpt / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    values = (f"PRIVATE = {PRIVATE!r}\nREFUSED = {REFUSED!r}\nESCAPE = {ESCAPE!r}\n"
              f"HUB_HOST = {GATEWAY!r}\nHUB_PORT = {services.HUB_PORT!r}\n")  # fmt: skip
    (ckpt / "tokenization_escape.py").write_text(MODULE.replace("import json, os, pwd, socket\n",
                                                               "import json, os, pwd, socket\n" + values, 1))
    return ckpt


def served(lab_rack) -> str:
    """What the host serves: the model link, its GGUF's sha256, the unit's."""
    return deploying.sh(lab_rack, HOST, f"readlink {ROOT}/models/current; sha256sum {ROOT}/models/current/model.gguf "
                                        "/etc/systemd/system/llamarack-server.service")  # fmt: skip


@pytest.fixture
def escape_hub(lab_rack, tmp_path):
    rc, out = deploying.deploy(lab_rack, HOST)  # converged on the lab's model first
    assert rc == 0, out[-4000:]
    deploying.sh(lab_rack, HOST, f"rm -rf {ROOT}/models/.staging/*")  # what other tests left unfinished
    with HubServer({REPO: hostile_checkpoint(tmp_path)}, host=GATEWAY) as hub:
        yield hub
    # The lab's settings again for the tests that follow: the refused work goes, nothing changes.
    deploying.sh(lab_rack, HOST, f"rm -rf {ROOT}/models/.staging/*")
    rc, out = deploying.deploy(lab_rack, HOST)
    assert rc == 0 and parse_pyinfra_totals(out)["success"] == 0, out[-4000:]


def test_a_checkpoints_code_cannot_leave_the_converters_sandbox(lab_rack, escape_hub):
    hub = escape_hub
    before = served(lab_rack)
    rc, out = deploying.deploy(lab_rack, HOST, f"model_hf_endpoint={hub.url}", f"model_repo={REPO}",
                               f"model_revision={hub.repo(REPO).sha}",
                               "model_hf_include=*.json,*.safetensors,*.model,*.py")  # fmt: skip
    # Refused cleanly: the convert step failed, with its log's tail; nothing of llamarack broke.
    # (the one host failed: pyinfra stops with "No hosts remaining", before its results table)
    assert rc != 0 and ("[lab-v100-b]  Error" in out or "[lab-v100-b] Error" in out), out[-6000:]
    assert "llamarack-escape-test: done" in out, out[-6000:]
    # the fetch took the checkpoint's code (from the hub, or from the blob cache on a rerun)
    assert deploying.sh(lab_rack, HOST, f"ls {ROOT}/models/.staging/*/work/hf/tokenization_escape.py"), \
        "the fetch did not take the checkpoint's code"

    # The code ran (its report is in its working directory), as the pipeline's user, offline.
    found = deploying.sh(lab_rack, HOST, f"ls {ROOT}/models/.staging/*/work/escape-report.json")
    assert len(found.splitlines()) == 1, f"no report: the checkpoint's code did not run ({found!r})"
    work = found.rsplit("/", 1)[0]
    report = json.loads(deploying.sh(lab_rack, HOST, f"cat {shlex.quote(found)}"))
    assert report["user"] == "llamarack-model" and report["uid"] != 0 and report["cwd"] == work, report
    assert report["hf_hub_offline"] == "1", report
    # It could write only where the unit's private mounts are, and nowhere else.
    assert {w: report["writes"][w] for w in PRIVATE} == {w: "written" for w in PRIVATE}, report
    for where in REFUSED + ["WORK/hf/config.json"]:
        assert report["writes"][where] != "written", (where, report)
    assert report["reads"]["/etc/shadow"] != "read" and report["connect"] != "connected", report

    # Nothing it wrote is anywhere on the host: the private /tmp, /var/tmp and /dev/shm went with the unit.
    left = deploying.sh(lab_rack, HOST, f"find / /tmp /var/tmp /dev/shm /run -xdev -name {ESCAPE} 2>/dev/null; true")
    assert left == "", left
    # What it made stays the pipeline user's, in a staging that stays root's; its log is root's.
    owners = deploying.sh(lab_rack, HOST, f"stat -c '%U %a' {shlex.quote(work)} {shlex.quote(work)}/.. "
                                          f"{shlex.quote(work)}/../convert.log")  # fmt: skip
    assert owners.splitlines() == ["llamarack-model 700", "root 710", "root 644"], owners

    # The model served before serves on, untouched.
    assert served(lab_rack) == before
    ip = lab_rack.rack.host(HOST)["ip"]
    assert faults.health(ip) == 200 and faults.completion(ip)
