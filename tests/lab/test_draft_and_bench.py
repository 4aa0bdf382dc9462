"""Speculative decoding with a draft model, and llama-bench after a new build or model, on a lab host.

One lab host (lab-v100-a: a CPU build of llama.cpp, a fake V100 16 GB)
deployed from an inventory that asks for a draft model: the lab hub's
tiny Llama again (a draft must share the model's vocabulary), quantized
to Q8_0 where the model is Q4_K_M, so the model role makes a second
artifact through the same fetch, convert, quantize and seal. Tests run in
order and share the host.
"""

import json
import subprocess
import sys

import pytest

from llamarack_lab.pytest_plugin import count_remote_work, parse_pyinfra_totals
from tests.lab import deploying

pytestmark = pytest.mark.lab

HOST = "lab-v100-a"
URL = "http://10.77.0.11:8080"  # inventory/lab.py's address of HOST
OPT = "/opt/llamarack"
UNIT = "llamarack-server.service"
DRAFT = {
    "model_draft_repo": "lab/tiny-llama",
    "model_draft_revision": "024052eec5467f84406c4ab1607cdf939e5bb195",  # inventory/lab.py's model_revision
    "model_draft_quant": "Q8_0",
    "server_draft_max": 8,
    "server_draft_min": 1,
}


@pytest.fixture(scope="module")
def inventory(tmp_path_factory):
    """inventory/lab.py with the draft asked for every host."""
    path = tmp_path_factory.mktemp("inventory") / "lab_draft.py"
    path.write_text((deploying.ROOT / "inventory/lab.py").read_text() + f"\nlab[1].update({DRAFT!r})\n")
    return path


def deploy(lab_rack, inventory, *args: str):
    return lab_rack.run_pyinfra(deploying.ROOT / "deploy.py", "--limit", HOST, *args, inventory=inventory,
                                timeout=3000)  # fmt: skip


def sh(lab_rack, command: str) -> str:
    return deploying.sh(lab_rack, HOST, command)


def server_cmdline(lab_rack) -> list[str]:
    pid = sh(lab_rack, f"systemctl show -p MainPID --value {UNIT}")
    return sh(lab_rack, f"tr '\\0' '\\n' < /proc/{pid}/cmdline").splitlines()


def flag(cmdline: list, name: str) -> str:
    return cmdline[cmdline.index(name) + 1]


def completion(prompt: str, n: int) -> dict:
    import urllib.request

    body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True}).encode()
    request = urllib.request.Request(f"{URL}/completion", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        assert r.status == 200
        return json.loads(r.read().decode())


def test_first_deploy_makes_the_draft_and_serves_with_it(lab_rack, inventory):
    rc, out = deploy(lab_rack, inventory)
    assert rc == 0, out[-6000:]
    model, draft = sh(lab_rack, f"readlink {OPT}/models/current; readlink {OPT}/models/draft").split()
    assert model != draft  # its own artifact, its own stamp
    record = json.loads(sh(lab_rack, f"cat {OPT}/models/{draft}/stamp.json"))
    assert record["asked"]["repo"] == DRAFT["model_draft_repo"] and record["asked"]["quant"] == "Q8_0"
    assert record["quant"] == "Q8_0" and record["stamp"].startswith(draft)
    cmdline = server_cmdline(lab_rack)
    assert flag(cmdline, "--spec-type") == "draft-simple"
    assert flag(cmdline, "--spec-draft-model") == f"{OPT}/models/{draft}/model.gguf"
    assert (flag(cmdline, "--spec-draft-n-max"), flag(cmdline, "--spec-draft-n-min")) == ("8", "1")
    # the draft's KV is the plan's type, as the planner counted it
    assert flag(cmdline, "--spec-draft-type-k") == flag(cmdline, "--cache-type-k")
    assert "--spec-draft-ngl" not in cmdline  # a CPU build: no layers to place
    assert "--spec-draft-n-max" in " ".join(cmdline) and "--draft-max" not in cmdline
    # the draft shows in the unit's description, beside the model
    assert f"draft {draft}" in sh(lab_rack, f"systemctl show -p Description --value {UNIT}")


def test_the_server_answers_and_reports_the_draft(lab_rack):
    reply = completion("the llama rack of the", 48)
    assert reply["tokens_predicted"] == 48
    timings = reply["timings"]
    # llama-server reports the draft's work in the response's timings (server-common.cpp)
    assert timings["draft_n"] > 0, timings
    assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"], timings
    # the same weights at Q8_0 against Q4_K_M, greedy: most drafts are right
    assert timings["draft_n_accepted"] > 0, timings
    log = sh(lab_rack, f"journalctl -u {UNIT} --no-pager -o cat | grep -c 'draft acceptance' || true")
    print("timings:", json.dumps(timings), "| journal 'draft acceptance' lines:", log)


def test_the_drafts_kv_is_what_the_planner_counted(lab_rack):
    """llama.cpp's own report of the KV caches it made (the model's, then the draft's)
    against the planner's ledger, from the GGUF headers on the host. The library logs
    them at -lv 4 only, so the unit's own command line runs once more, on another
    port with -lv 4, until it answers /health."""
    import re
    import shlex

    from llamarack import remote
    from roles.server.planner import MIB, Knobs, ledger

    shapes = [json.loads(sh(lab_rack, remote.command("gguf_header", f"{OPT}/models/{link}/model.gguf")))
              for link in ("current", "draft")]  # fmt: skip
    cmdline = server_cmdline(lab_rack)
    ctx, k, v = int(flag(cmdline, "--ctx-size")), flag(cmdline, "--cache-type-k"), flag(cmdline, "--cache-type-v")
    book = ledger(shapes[0], Knobs(), [], 0, k, v, ctx, shapes[1])
    again = list(cmdline)
    again[again.index("--port") + 1], again[again.index("--host") + 1] = "18099", "127.0.0.1"
    wait = remote.command("wait_healthy", "http://127.0.0.1:18099/health", UNIT, "60")
    log = sh(lab_rack, f"{shlex.join(again + ['-lv', '4'])} > /tmp/kv-check.log 2>&1 & pid=$!; {wait}; "
                       "kill $pid; wait $pid; cat /tmp/kv-check.log; rm -f /tmp/kv-check.log")  # fmt: skip
    sizes = [float(m) for m in re.findall(r"llama_kv_cache: size = +([0-9.]+) MiB", log)]
    planned = [round((book.kv_on_card + book.kv_on_host) / MIB, 2),
               round((book.draft_kv_on_card + book.draft_kv_on_host) / MIB, 2)]  # fmt: skip
    print("llama_kv_cache sizes (MiB):", sizes, "planned:", planned)
    assert sizes == planned, log[-4000:]


def test_the_bench_ran_once_with_real_figures(lab_rack):
    record = json.loads(sh(lab_rack, f"cat {OPT}/state/bench.json"))
    build, model = sh(lab_rack, f"readlink {OPT}/builds/current; readlink {OPT}/models/current").split()
    assert record["key"] == {"build": build, "model": model}
    assert record["mode"] == "stopped" and record["backend"] == "cpu" and record["on_card"] is False
    for test, n in (("pp512", 512), ("tg128", 128)):
        assert record[test]["tokens_per_second"] > 0, record
        entry = next(e for e in record["llama_bench"]["entries"]
                     if (e["n_prompt"], e["n_gen"]) == ((n, 0) if test.startswith("pp") else (0, n)))  # fmt: skip
        assert round(entry["avg_ts"], 2) == record[test]["tokens_per_second"]
    # the card's roofline, recorded beside a CPU measurement it does not bound
    assert record["roofline"]["card"].startswith("Tesla V100") and record["roofline"]["bandwidth_gbs"] == 900
    assert record["roofline"]["tokens_per_second"] > 0 and record["roofline_fraction"] is None
    # the served flags: the plan's KV types, mmap off
    args = record["llama_bench"]["args"]
    assert args[args.index("-ctk") + 1] == record["served"]["cache_type_k"] and "-lm" in args
    # stopped for the bench, serving again
    assert sh(lab_rack, f"systemctl is-active {UNIT}") == "active"
    print("BENCH_JSON:", sh(lab_rack, f"base64 -w0 {OPT}/state/bench.json"))


def test_second_deploy_changes_nothing_and_does_not_bench(lab_rack, inventory):
    state = (f"sha256sum {OPT}/state/bench.json; find {OPT} -path '*/__pycache__' -prune -o "
             f"-printf '%p %s %T@ %l\\n' | sort | sha256sum; systemctl show -p MainPID --value {UNIT}")  # fmt: skip
    before = sh(lab_rack, state)
    rc, out = deploy(lab_rack, inventory, "--debug")
    assert rc == 0, out[-6000:]
    assert parse_pyinfra_totals(out)["success"] == 0, out[-6000:]
    assert sh(lab_rack, state) == before  # the record byte for byte, the tree, the same server process
    work = count_remote_work(out, [HOST])[HOST]
    assert work["remote_commands"] <= 2, work
    assert "llama-bench has measured build" in out


def test_audit_shows_the_bench(lab_rack, inventory):
    r = subprocess.run([sys.executable, "-m", "llamarack", "audit", str(inventory), "--limit", HOST, "--json"],
                       cwd=deploying.ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    report = json.loads(r.stdout)["hosts"][HOST]
    assert r.returncode == 0 and report["drift"] == [], (report, r.stderr[-3000:])
    record = json.loads(sh(lab_rack, f"cat {OPT}/state/bench.json"))
    bench = report["items"]["bench"]["found"]
    assert bench["pp512"] == record["pp512"]["tokens_per_second"]
    assert bench["tg128"] == record["tg128"]["tokens_per_second"]
    assert bench["roofline_tg"] == record["roofline"]["tokens_per_second"] and bench["backend"] == "cpu"
    table = subprocess.run([sys.executable, "-m", "llamarack", "audit", str(inventory), "--limit", HOST],
                           cwd=deploying.ROOT, capture_output=True, text=True, timeout=300).stdout  # fmt: skip
    assert f"pp512={record['pp512']['tokens_per_second']}" in table, table
    print(table)
