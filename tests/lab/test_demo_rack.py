"""The README's demo as a test: the whole rack deployed, every host serving its model.

    pyinfra -y inventory/lab.py deploy.py

llama.cpp is compiled once (the hosts share its inputs and their CPU): the
first host that needs it compiles it, the others receive it sealed through
this machine; every host proves the build by a smoke run before switching it in, fetches
and quantizes the model, and serves it under systemd. Then each host's
served model must answer /completion from this machine, and a second run
must change nothing.
"""

import json
import re
import shlex
import subprocess
import sys
import urllib.request

import pytest

from llamarack_lab.pytest_plugin import count_remote_work, parse_pyinfra_totals
from tests.lab import deploying

pytestmark = pytest.mark.lab


def demo(lab_rack):
    return lab_rack.run_pyinfra(deploying.ROOT / "deploy.py", inventory=deploying.ROOT / "inventory/lab.py",
                                timeout=3600)  # fmt: skip


def completion(ip: str, tokens: int) -> dict:
    request = urllib.request.Request(f"http://{ip}:8080/completion",
                                     data=json.dumps({"prompt": "hello", "n_predict": tokens}).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())


def test_demo_deploy_serves_on_every_host(lab_rack):
    rc, out = demo(lab_rack)
    assert rc == 0, out[-6000:]
    for host in lab_rack.hosts:
        assert f"[{host.name}]" in out and f"serving: http://{host.ip}:8080/v1/chat/completions" in out
        answer = completion(host.ip, 16)
        assert answer["tokens_predicted"] == 16 and answer["content"], (host.name, answer)
        # The build that serves computed before it was switched in, on this host's CPU.
        proof = json.loads(deploying.sh(lab_rack, host.name, "cat /opt/llamarack/builds/current/build-info.json"))["proof"]
        assert proof["attempts"][-1]["ok"] and proof["tokens"] == 8, (host.name, proof)
    # At most one compile in the run: every host that needed the build but one received it,
    # or all did where a host already held it (the rack is shared with earlier lab tests; on a
    # fresh one, three of four receive).
    needed = len(re.findall(r"llama\.cpp build \S+ needed: ", out))
    assert 0 <= needed - out.count("not compiling it") <= 1, out[-6000:]


def test_demo_second_run_changes_nothing(lab_rack):
    before = {h.name: deploying.state(lab_rack, h.name) for h in lab_rack.hosts}
    rc, out = demo(lab_rack)
    assert rc == 0, out[-6000:]
    totals = parse_pyinfra_totals(out)
    assert totals["success"] == 0 and totals["error"] == 0, out[-6000:]
    # the hosts' real state, not only pyinfra's count: files, config, unit, packages, server process
    assert {h.name: deploying.state(lab_rack, h.name) for h in lab_rack.hosts} == before


# The budget: what a converged host may cost.
MAX_REMOTE_COMMANDS = 15


def test_a_converged_run_reads_each_fact_once_in_a_few_commands(lab_rack):
    before = {h.name: deploying.state(lab_rack, h.name) for h in lab_rack.hosts}
    rc, out = lab_rack.run_pyinfra(deploying.ROOT / "deploy.py", "--debug",
                                   inventory=deploying.ROOT / "inventory/lab.py", timeout=600)  # fmt: skip
    assert rc == 0, out[-6000:]
    assert parse_pyinfra_totals(out)["success"] == 0, out[-6000:]
    assert {h.name: deploying.state(lab_rack, h.name) for h in lab_rack.hosts} == before
    work = count_remote_work(out, [h.name for h in lab_rack.hosts])
    for host, seen in work.items():
        assert 0 < seen["remote_commands"] <= MAX_REMOTE_COMMANDS, (host, seen)
        assert seen["facts_read_more_than_once"] == {}, (host, seen)
        # what the roles check is still read, through the one store
        for fact in ("PythonEnvPackages", "NvidiaDriverPackages", "Sha1File", "ServedUnits", "SystemUser"):
            assert any(fact in line and f"[{host}]" in line for line in out.splitlines()), (host, fact)


def audit(*args: str) -> tuple[int, dict, str]:
    r = subprocess.run([sys.executable, "-m", "llamarack", "audit", str(deploying.ROOT / "inventory/lab.py"), "--json",
                        *args], cwd=deploying.ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    return r.returncode, json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}, r.stderr


def test_audit_of_the_converged_rack_finds_no_drift_in_one_command_per_host(lab_rack):
    before = {h.name: deploying.state(lab_rack, h.name) for h in lab_rack.hosts}
    rc, report, err = audit("--debug")
    assert rc == 0, (report, err[-3000:])
    assert report["schema"] == "llamarack-audit/1"
    for h in lab_rack.hosts:
        seen = report["hosts"][h.name]
        assert seen["reachable"] and seen["error"] is None and seen["drift"] == [], seen
        assert seen["items"]["health"]["found"] == 200 and seen["items"]["service"]["found"]["active"] == "active"
        # the wanted build, or one rebuilt beside it after a tampered file (<stamp>-r<time>)
        assert seen["items"]["build"]["wanted"]["inputs_changed"] == [], seen["items"]["build"]
    work = count_remote_work(err, [h.name for h in lab_rack.hosts])
    assert all(w["remote_commands"] == 1 for w in work.values()), work
    assert {h.name: deploying.state(lab_rack, h.name) for h in lab_rack.hosts} == before


def test_audit_names_an_unreachable_host_and_reports_the_others(lab_rack, tmp_path):
    inventory = tmp_path / "inventory.py"
    inventory.write_text((deploying.ROOT / "inventory/lab.py").read_text()
                         + '\ngone = ([("lab-gone", {"ssh_hostname": "10.77.0.250", "ssh_connect_timeout": 2})], lab[1])\n')
    r = subprocess.run([sys.executable, "-m", "llamarack", "audit", str(inventory), "--json"],
                       cwd=deploying.ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    report = json.loads(r.stdout)
    assert r.returncode == 2, r.stdout[-2000:]
    assert report["hosts"]["lab-gone"]["reachable"] is False
    assert report["hosts"]["lab-v100-a"]["drift"] == [] and report["hosts"]["lab-v100-a"]["reachable"]


def test_drift_is_still_repaired_by_the_next_run(lab_rack):
    """What a converged run checks is unchanged: an env package removed, the driver
    hold lost, the unit edited, the service stopped; one run puts all four back."""
    host, unit = "lab-v100-b", "/etc/systemd/system/llamarack-server.service"
    before = deploying.sh(lab_rack, host, f"sha256sum {unit}; apt-mark showhold")
    deploying.sh(lab_rack, host, "/opt/llamarack/envs/awq/bin/python -m pip uninstall -y -q accelerate && "
                                 "apt-mark unhold $(apt-mark showhold) && "
                                 f"echo '# edited by hand' >> {unit} && systemctl daemon-reload && "
                                 "systemctl stop llamarack-server.service")  # fmt: skip
    # The audit sees each drift, on that host only.
    rc, report, err = audit()
    assert rc == 1, (report, err[-3000:])
    assert set(report["hosts"][host]["drift"]) == {"awq_env", "driver", "unit", "service", "health"}, report["hosts"][host]
    assert all(report["hosts"][h.name]["drift"] == [] for h in lab_rack.hosts if h.name != host)
    rc, out = deploying.deploy(lab_rack, host)
    assert rc == 0, out[-6000:]
    assert deploying.sh(lab_rack, host, f"sha256sum {unit}; apt-mark showhold") == before
    assert deploying.sh(lab_rack, host, "systemctl is-active llamarack-server.service") == "active"
    assert deploying.sh(lab_rack, host, "/opt/llamarack/envs/awq/bin/python -c "
                                        "'import importlib.metadata as m; print(m.version(\"accelerate\"))'") == "0.33.0"
    assert completion(lab_rack.rack.host(host)["ip"], 4)["tokens_predicted"] == 4
    deploying.converges(lab_rack, host)
    # what the audit called drift is what the deploy repaired: the audit is clean now
    rc, report, err = audit("--limit", host)
    assert rc == 0 and report["hosts"][host]["drift"] == [], (report, err[-3000:])


def test_a_model_edited_in_place_is_remade_and_served_never_the_edit(lab_rack):
    """A tampered model: 8 bytes of the served GGUF overwritten, same size. The seal's
    signature (size, mtime, inode) tells; the artifact is remade beside it, swapped in,
    and the server restarted on it."""
    host, gguf = "lab-v100-b", "/opt/llamarack/models/current/model.gguf"
    sealed = json.loads(deploying.sh(lab_rack, host, "cat /opt/llamarack/models/current/stamp.json"))["gguf"]["sha256"]
    # in the tensor data, past the header: the file still reads as a GGUF of the same shape
    deploying.sh(lab_rack, host, f"printf 'TAMPERED' | dd of={gguf} bs=1 seek=$(( $(stat -c %s {gguf}) - 4096 )) "
                                 "conv=notrunc status=none")  # fmt: skip
    assert deploying.sh(lab_rack, host, f"sha256sum {gguf}").split()[0] != sealed
    rc, report, err = audit("--limit", host)
    assert rc == 1 and report["hosts"][host]["drift"] == ["model"], report
    rc, out = deploying.deploy(lab_rack, host)
    assert rc == 0, out[-6000:]
    assert "was sealed after llamarack-server.service started: restarting it" in out, out[-6000:]
    assert deploying.sh(lab_rack, host, f"sha256sum {gguf}").split()[0] == sealed
    assert deploying.sh(lab_rack, host, "ls -A /opt/llamarack/models/.staging") == ""
    assert completion(lab_rack.rack.host(host)["ip"], 4)["tokens_predicted"] == 4
    deploying.converges(lab_rack, host)


def test_a_model_gone_from_a_host_is_received_from_one_that_holds_it(lab_rack):
    """``model_ship_artifacts``: a host whose artifact is gone, deployed with one that holds it,
    receives it sealed through the control machine (its logs, with their timings, are the
    holder's: nothing was made) instead of fetching, converting and quantizing it again."""
    lost, holder, model = "lab-v100-a", "lab-v100-b", "/opt/llamarack/models/current"
    name = deploying.sh(lab_rack, holder, f"readlink {model}")
    assert deploying.sh(lab_rack, lost, f"readlink {model}") == name
    deploying.sh(lab_rack, lost, "systemctl stop llamarack-server.service && rm -rf -- "
                                 + shlex.quote(f"/opt/llamarack/models/{name}"))  # fmt: skip
    rc, out = deploying.deploy(lab_rack, f"{lost},{holder}", "model_ship_artifacts=true")
    assert rc == 0, out[-6000:]
    assert f"model {name}: receiving it from {holder} (" in out and "not making it" in out, out[-6000:]
    assert "follow each step with" not in out, out[-6000:]  # nothing was fetched
    logs = f"cd {model} && sha256sum model.gguf stamp.json quantize.log | cut -c1-64"
    theirs, ours = deploying.sh(lab_rack, holder, logs).split(), deploying.sh(lab_rack, lost, logs).split()
    assert ours[0] == theirs[0] and ours[2] == theirs[2] and ours[1] != theirs[1]  # sealed as its own
    assert completion(lab_rack.rack.host(lost)["ip"], 4)["tokens_predicted"] == 4
    deploying.converges(lab_rack, lost)


def test_a_switch_cut_off_before_its_health_check_never_costs_the_proven_unit(lab_rack):
    """A cut-off switch: the switch copies the unit to .prev, moves the new one in and is killed
    before /health. The next run, whose own new unit fails too (port 80: the service user
    may not bind it), must roll back to the unit that last passed /health, not to the
    unproven one it found in place."""
    host, unit = "lab-v100-b", "/etc/systemd/system/llamarack-server.service"
    good = deploying.sh(lab_rack, host, f"sha256sum < {unit}")
    deploying.sh(lab_rack, host, f"cp -p {unit} {unit}.prev && sed -i 's|^ExecStart=.*|ExecStart=/bin/false|' {unit} && "
                                 "systemctl daemon-reload && (systemctl restart llamarack-server.service || true)")  # fmt: skip
    rc, out = deploying.deploy(lab_rack, host, "server_port=80", "llamarack_roles=server")
    assert rc != 0 and "rolled back: the previous unit is serving again" in out, out[-6000:]
    assert deploying.sh(lab_rack, host, f"sha256sum < {unit}") == good
    assert completion(lab_rack.rack.host(host)["ip"], 4)["tokens_predicted"] == 4
    deploying.converges(lab_rack, host)


def test_an_api_key_uploaded_under_sudo_is_never_readable_by_others(lab_rack, tmp_path):
    # lab-t4 is reached as the 'deploy' user with sudo (inventory/lab.py).
    key = "sk-lab-sudo-" + tmp_path.name
    key_file = tmp_path / "api-key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)  # read_token refuses a secret others may read
    # Meanwhile on the host, as a user who is neither root nor the SSH user: any
    # file under /tmp it can read that holds the key (pyinfra's own temporary
    # upload file, mode 644 in /tmp, would be one).
    watcher = ("nohup runuser -u nobody -- sh -c 'end=$(($(date +%s)+120)); while [ $(date +%s) -lt $end ]; do "
               f"grep -rls {key} /tmp 2>/dev/null; done' >> /root/key-watch.log 2>/dev/null & "
               "echo $! > /root/key-watch.pid")  # fmt: skip
    deploying.sh(lab_rack, "lab-t4", f"rm -f /root/key-watch.log; touch /root/key-watch.log; {watcher}")
    rc, out = lab_rack.run_pyinfra(deploying.ROOT / "deploy.py", "--limit", "lab-t4",
                                   "--data", f"server_api_key_file={key_file}", "--data", "llamarack_roles=server",
                                   inventory=deploying.ROOT / "inventory/lab.py")  # fmt: skip
    assert rc == 0, out[-4000:]
    assert key not in out
    assert deploying.sh(lab_rack, "lab-t4", "stat -c '%a %U %G' /etc/llamarack/server-api-key") == "640 root llamarack"
    assert deploying.sh(lab_rack, "lab-t4", "cat /etc/llamarack/server-api-key") == key
    deploying.sh(lab_rack, "lab-t4", "kill $(cat /root/key-watch.pid) || true")
    seen = deploying.sh(lab_rack, "lab-t4", "sort -u /root/key-watch.log")
    assert seen == "", seen
    assert deploying.sh(lab_rack, "lab-t4", f"grep -rls {key} /tmp /var/tmp /home || true") == ""
    request = urllib.request.Request("http://10.77.0.14:8080/v1/models", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        assert r.status == 200
    # Unset again: the key file goes, the rack is back as the demo left it.
    rc, out = lab_rack.run_pyinfra(deploying.ROOT / "deploy.py", "--limit", "lab-t4", "--data", "llamarack_roles=server",
                                   inventory=deploying.ROOT / "inventory/lab.py")  # fmt: skip
    assert rc == 0, out[-4000:]
    assert deploying.sh(lab_rack, "lab-t4", "test -e /etc/llamarack/server-api-key || echo gone") == "gone"
