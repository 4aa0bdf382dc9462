"""Day 2: a llama.cpp bump across a converged host, through the real deploy.py.

The rack made its model once, on one host, and shipped it to the others
(``model_ship_artifacts``): that host keeps the checkpoint in its blob cache, the
receivers keep none. The bump goes to that host.

A new commit rebuilds llama.cpp, converts and quantizes the model again with
the new converter and llama-quantize, and restarts the server on both, with
the checkpoint taken from the host's blob cache. The lab pins the model's
revision by its full sha, so the served artifact's record plans the new one:
the hub is asked nothing at all, not even its listing (its own request log
says so), and the disk the model step asks for counts none of the checkpoint.
The next run changes nothing and asks the hub nothing. A bump whose new unit
does not answer /health (a build that passes its smoke run, then refuses the
served model) is rolled back, and the previous unit serves again; that bump
gives the revision as a short sha, which the hub is asked to list again (and
nothing more: the files still come from the cache). Tests run in order and
share the host.
"""

import json
import urllib.request

import pytest

from llamarack_lab import TINY_MODEL_REVISION, mirror, services
from llamarack_lab.hub_server import HubServer
from llamarack_lab.pytest_plugin import parse_pyinfra_totals
from tests.lab import deploying

pytestmark = pytest.mark.lab

ADDRESSES = {"lab-v100-a": "10.77.0.11", "lab-v100-b": "10.77.0.12", "lab-v100-32": "10.77.0.13"}  # inventory/lab.py's
OPT = "/opt/llamarack"
BLOBS = f"{OPT}/cache/blobs"
UNIT = "/etc/systemd/system/llamarack-server.service"

# The base tree's tools/server/main.cpp, and a change that passes the smoke run (its
# model is smoke/smoke-Q4_K_M.gguf) but refuses the artifact the unit serves: a
# regression only the served model shows, so only the unit's /health check can catch it.
MAIN_CPP = "int llama_server(int argc, char ** argv);\n\nint main(int argc, char ** argv) {\n" \
           "    return llama_server(argc, argv);\n}\n"  # fmt: skip
REFUSES_THE_SERVED_MODEL = {"tools/server/main.cpp": (MAIN_CPP, """#include <cstdio>
#include <cstring>

int llama_server(int argc, char ** argv);

int main(int argc, char ** argv) {
    for (int i = 1; i + 1 < argc; i++) {
        size_t n = strlen(argv[i + 1]);
        if (strcmp(argv[i], "--model") == 0 && n >= 11 && strcmp(argv[i + 1] + n - 11, "/model.gguf") == 0) {
            fputs("llamarack lab test: this build refuses the served model\\n", stderr);
            return 1;
        }
    }
    return llama_server(argc, argv);
}
""")}


def deploy(lab_rack, *data: str):
    return deploying.deploy(lab_rack, SEEN["host"], *data)


def sh(lab_rack, command: str, host: str = "") -> str:
    return deploying.sh(lab_rack, host or SEEN["host"], command)


def url() -> str:
    return f"http://{ADDRESSES[SEEN['host']]}:8080"


def health() -> int:
    with urllib.request.urlopen(f"{url()}/health", timeout=30) as r:
        return r.status


def completion(tokens: int) -> dict:
    request = urllib.request.Request(f"{url()}/completion", data=json.dumps({"prompt": "hello", "n_predict": tokens}).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())


def record(lab_rack, model: str = "current", host: str = "") -> dict:
    return json.loads(sh(lab_rack, f"cat {OPT}/models/{model}/stamp.json", host))


def serving(lab_rack) -> dict:
    """What the running server runs, read from its process: the binary and the model."""
    pid = sh(lab_rack, "systemctl show -p MainPID --value llamarack-server.service")
    argv = sh(lab_rack, f"tr '\\0' '\\n' < /proc/{pid}/cmdline").splitlines()
    return {"binary": argv[0], "model": argv[argv.index("--model") + 1], "pid": pid}


def file_gets(hub: HubServer, since: int) -> list:
    return [r.path for r in hub.requests[since:] if r.method == "GET" and "/resolve/" in r.path]


SEEN = {}  # what earlier tests of this module saw


@pytest.fixture(scope="module")
def lab_mirror():
    return services.prepare()


@pytest.fixture(scope="module")
def hub():
    """A second hub on the lab bridge, serving the same tiny model as the lab's, whose
    request log (every request, with its path) the tests read."""
    with HubServer({services.HUB_REPO: services.prepare_hub()}, host="10.77.0.1") as server:
        yield server


def cached(lab_rack, host: str, files: dict) -> list:
    """The modes of ``files``' blobs (content ids) in ``host``'s blob cache, "none" for each it lacks."""
    paths = " ".join(f"{BLOBS}/{cid.replace(':', '/')}" for cid in files.values())
    return sh(lab_rack, f"for f in {paths}; do stat -c %a $f 2>/dev/null || echo none; done", host).split()


def test_the_host_that_made_the_model_has_its_checkpoint_in_the_blob_cache(lab_rack):
    rc, out = deploying.deploy(lab_rack, ",".join(ADDRESSES))
    assert rc == 0, out[-6000:]
    files = record(lab_rack, host="lab-v100-a")["files"]
    modes = {host: cached(lab_rack, host, files) for host in ADDRESSES}
    # Every file the artifact was made from is in its maker's cache under its content id,
    # read-only (a host that received the artifact keeps none of them).
    makers = [host for host, m in modes.items() if m == ["444"] * len(files)]
    assert makers, modes
    print("\nblob caches:", modes)
    SEEN["host"] = makers[0]
    assert sh(lab_rack, f"stat -c %a {BLOBS}") == "700"
    rc, out = deploy(lab_rack)
    assert rc == 0 and parse_pyinfra_totals(out)["success"] == 0, out[-6000:]
    stamp = record(lab_rack)
    SEEN.update(model=sh(lab_rack, f"readlink {OPT}/models/current"), build=sh(lab_rack, f"readlink {OPT}/builds/current"),
                serving=serving(lab_rack), files=stamp["files"])  # fmt: skip
    assert stamp["files"] == files


def test_a_llamacpp_bump_rebuilds_and_converts_again_without_downloading(lab_rack, lab_mirror, hub):
    commit = SEEN["bump"] = mirror.add_named_commit(lab_mirror, "lab-test-bump", "lab test: a later llama.cpp",
                                                    mirror.GOOD_BUMP)  # fmt: skip
    since = len(hub.requests)
    rc, out = deploy(lab_rack, f"llamacpp_commit={commit}", f"model_hf_endpoint={hub.url}")
    assert rc == 0, out[-6000:]
    # The hub was asked nothing: the revision is a full sha, so the served artifact's record
    # (files, content ids, sizes) planned the new artifact, and the checkpoint came from
    # the host's cache. The disk the model step asked for counts none of the checkpoint.
    assert hub.requests[since:] == [], hub.requests[since:]
    n = len(SEEN["files"])
    assert f"{n} file(s)" in out and f"{n} of them in the host's blob cache (0.00 GB to download)" in out, out[-6000:]
    print("\nbump's fetch line:", next(line for line in out.splitlines() if "host's blob cache" in line).strip())
    model, build = sh(lab_rack, f"readlink {OPT}/models/current"), sh(lab_rack, f"readlink {OPT}/builds/current")
    assert model != SEEN["model"] and build != SEEN["build"]
    assert commit[:9] in sh(lab_rack, f"{OPT}/builds/current/bin/llama-server --version 2>&1")
    # Converted and quantized again, with the new commit's converter and llama-quantize.
    stamp = record(lab_rack)
    assert stamp["llamacpp_commit"] == commit and stamp["files"] == SEEN["files"]
    fetch_log = sh(lab_rack, f"cat {OPT}/models/current/fetch.log")
    assert fetch_log.count("from the cache, not downloaded") == len(SEEN["files"]), fetch_log
    assert sh(lab_rack, f"test -s {OPT}/models/current/convert.log && test -s {OPT}/models/current/quantize.log && echo made") == "made"
    # Restarted on both, answering; the previous artifact and build stay for a rollback.
    now = serving(lab_rack)
    assert now["binary"] == f"{OPT}/builds/{build}/bin/llama-server" and now["model"] == f"{OPT}/models/{model}/model.gguf"
    assert health() == 200 and completion(4)["tokens_predicted"] == 4
    assert sh(lab_rack, f"test -f {OPT}/models/{SEEN['model']}/model.gguf && test -d {OPT}/builds/{SEEN['build']} && echo kept") == "kept"
    SEEN["bumped"] = now


def test_the_second_run_changes_nothing_and_asks_the_hub_nothing(lab_rack, hub):
    since = len(hub.requests)
    before = sh(lab_rack, f"find {OPT} -path '*/__pycache__' -prune -o -printf '%p %s %T@ %l\\n' | sort | md5sum")
    rc, out = deploy(lab_rack, f"llamacpp_commit={SEEN['bump']}", f"model_hf_endpoint={hub.url}")
    assert rc == 0 and parse_pyinfra_totals(out)["success"] == 0, out[-6000:]
    assert hub.requests[since:] == []
    assert sh(lab_rack, f"find {OPT} -path '*/__pycache__' -prune -o -printf '%p %s %T@ %l\\n' | sort | md5sum") == before
    assert serving(lab_rack) == SEEN["bumped"]


def test_a_bump_whose_unit_fails_health_is_rolled_back_and_the_previous_unit_serves(lab_rack, lab_mirror, hub):
    bad = mirror.add_named_commit(lab_mirror, "lab-test-refuses-served", "lab test: refuses the served model",
                                  REFUSES_THE_SERVED_MODEL)  # fmt: skip
    unit_before = sh(lab_rack, f"sha256sum < {UNIT}")
    since = len(hub.requests)
    short = TINY_MODEL_REVISION[:12]  # a revision not given in full is listed again: it is all asked
    rc, out = deploy(lab_rack, f"llamacpp_commit={bad}", f"model_hf_endpoint={hub.url}", f"model_revision={short}")
    assert rc != 0
    listings = [r.path for r in hub.requests[since:] if r.path.startswith(f"/api/models/{services.HUB_REPO}/revision/{short}")]
    assert len(listings) == 1 and len(hub.requests) - since == 1, hub.requests[since:]
    # The build proved itself on the smoke model, the model was made again from the cache,
    # and only the new unit's /health check saw the failure.
    assert sh(lab_rack, f"readlink {OPT}/builds/current") != SEEN["bumped"]["binary"].split("/")[-3]
    assert record(lab_rack)["llamacpp_commit"] == bad and file_gets(hub, since) == []
    assert "this build refuses the served model" in out, out[-6000:]  # the new unit's journal
    assert "rolled back: the previous unit is serving again" in out, out[-6000:]
    assert sh(lab_rack, f"sha256sum < {UNIT}") == unit_before
    assert sh(lab_rack, f"test -e {UNIT}.prev || echo none") == "none"
    now = serving(lab_rack)
    assert (now["binary"], now["model"]) == (SEEN["bumped"]["binary"], SEEN["bumped"]["model"])
    assert health() == 200 and completion(4)["tokens_predicted"] == 4
    # What the restored unit runs was kept by the build prune.
    assert sh(lab_rack, f"test -x {now['binary']} && test -f {now['model']} && echo kept") == "kept"


def test_back_to_the_pinned_commit_serves_again_and_the_cache_keeps_what_records_name(lab_rack):
    rc, out = deploy(lab_rack)
    assert rc == 0, out[-6000:]
    assert sh(lab_rack, f"readlink {OPT}/models/current") == SEEN["model"]
    assert health() == 200
    rc, out = deploy(lab_rack)
    assert rc == 0 and parse_pyinfra_totals(out)["success"] == 0, out[-6000:]
    # Three artifacts (pinned, bump, refused bump) name the same checkpoint: one blob each file.
    names = sorted(f"{cid.replace(':', '/')}" for cid in SEEN["files"].values())
    assert sh(lab_rack, f"cd {BLOBS} && ls -d */* | sort").split() == names
