"""The server operation's commands, in pyinfra's fixture style: facts in, commands out."""

import dataclasses
import hashlib
import json
import logging
from pathlib import Path

from pyinfra.facts.files import FileContents, Link, Sha256File
from pyinfra.facts.server import Command

from roles.model.reads import ArtifactState, GgufShape, ModelArtifact
from roles.driver.reads import CharDevices, DriverState, Gpu, NvidiaSmi, RecordedGpus
from roles.llamacpp.reads import BuildFlags, LlamaServerFlags, ServerFlags
from roles.server.reads import FoundUnit, HostMemory, ServedUnits
from roles.server.files.secret_digest import digest
from roles.server.operations import service
from roles.server.reads import KEY_DIGEST_SALT, key_digest_command
from llamarack import remote
from llamarack.layout import API_KEY_PATH, UNIT_PATH
from roles.settings import load_settings
from tests.support.ophost import fact_key, run_op

ROOT = "/opt/lr"
SHAPE = json.loads((Path(__file__).resolve().parents[1] / "facts/GgufShape/tiny_q4_k_m.json").read_text())["fact"]
# The pinned build's spelling: its --help has --cache-ram (the prompt cache in host RAM).
FLAGS = BuildFlags(("--load-mode", "none"), True, True, True, has_cache_ram=True)
HOST_MIB = 257585  # MemTotal (MiB) of a host of 256 GiB: ample for 8 units at the default --cache-ram
V100 = Gpu(0, "Tesla V100-SXM2-16GB", "GPU-1", 16384, "7.0", "550.127.05")


def char_devices(case: str) -> tuple:
    """A real ``/proc/devices`` (tests/facts/CharDevices/<case>.json) as the fact reads it."""
    fixture = Path(__file__).resolve().parents[1] / "facts/CharDevices" / f"{case}.json"
    return CharDevices().process(json.loads(fixture.read_text())["output"])


DEVICES_580 = char_devices("driver_580_h200")


def settings(**data):
    return load_settings("gpu01", {"python_env_backend": "venv", "llamarack_root": ROOT, **data})


STARTED = 1764640411  # when the running server became active (Unix seconds, as systemd says)
UNIT_RUNNING = {"ActiveState": "active", "SubState": "running", "ActiveEnterTimestamp": f"@{STARTED}"}
UNIT_DEAD = {"ActiveState": "inactive", "SubState": "dead", "ActiveEnterTimestamp": ""}


def found_unit(name="llamarack-server.service", sha1=None, running=False, prev=False, pin=None, lines=()):
    """A unit file on the host, as ``ServedUnits`` reads it."""
    return FoundUnit(name, sha1, tuple(lines), prev, dict(UNIT_RUNNING if running else UNIT_DEAD),
                     None if pin is None else (json.dumps(pin),))  # fmt: skip


# The units' check after each start as this llamarack puts it on a host
CHECK_SHA256 = hashlib.sha256(remote.source("wait_healthy").encode()).hexdigest()
# state/units.json of a host serving the one V100's unit
UNITS_JSON = json.dumps({"units": [{"index": 0, "unit": "llamarack-server.service", "port": 8080,
                                    "listen": "127.0.0.1", "parallel": 1, "cards": ["GPU-1"]}]}, indent=1)  # fmt: skip


def facts(unit_sha1=None, running=False, key_digest="missing", build="b1", model="m1", shape=SHAPE,
          smi=DriverState("ok", (V100,)), recorded=(), sealed_at=STARTED - 600, prev=False, pin=None,
          devices=DEVICES_580, units=None, units_json=None, host_mib=HOST_MIB, check=CHECK_SHA256):
    """The facts of a host; ``units``: its unit files (``ServedUnits``), by default the one unit
    of ``unit_sha1`` (none without it), recorded in ``units_json`` (by default: as the unit of
    the one V100 when there is a unit); ``check``: the sha256 of the units' check after each
    start (``libexec/unit_check.py``; by default this llamarack's, None: missing)."""
    if units is None:
        units = {} if unit_sha1 is None else {"llamarack-server.service": found_unit(sha1=unit_sha1, running=running,
                                                                                   prev=prev, pin=pin)}  # fmt: skip
    if units_json is None and unit_sha1 is not None:
        units_json = UNITS_JSON
    return {
        CharDevices: devices,
        NvidiaSmi: smi,
        fact_key(RecordedGpus, path=f"{ROOT}/state/gpus.json"): recorded,
        fact_key(Link, path=f"{ROOT}/builds/current"): {"link_target": build} if build else None,
        fact_key(Link, path=f"{ROOT}/models/current"): {"link_target": model} if model else None,
        fact_key(LlamaServerFlags, root=ROOT): FLAGS if build else None,
        fact_key(ServedUnits, state=f"{ROOT}/state", health=True): units,
        fact_key(FileContents, path=f"{ROOT}/state/units.json"): units_json.splitlines() if units_json else None,
        fact_key(Command, command=key_digest_command()): key_digest,
        fact_key(HostMemory): host_mib,
        fact_key(Sha256File, path=f"{ROOT}/libexec/unit_check.py"): check,
        **(served(model, shape, sealed_at) if model else {}),
    }


def served(model: str, shape, sealed_at: int) -> dict:
    """The facts of the model directory models/current names, read through the link or by its name."""
    artifact = ArtifactState(model, 10, 10, {"stamp": model, "sealed_at": sealed_at})
    return {fact_key(GgufShape, path=f"{ROOT}/models/{model}/model.gguf"): shape,
            fact_key(GgufShape, path=f"{ROOT}/models/current/model.gguf"): shape,
            fact_key(ModelArtifact, path=f"{ROOT}/models/current"): artifact}  # fmt: skip


# The unit the default settings want on one V100 16 GB (build b1, model m1: the tiny Llama's
# shape, tests/facts/GgufShape/tiny_q4_k_m.json), checked by hand line by line: every layer
# and the output layer (n_layer + 1 = 3) on the card, the trained context (2048) with f16 KV,
# the devices driver 580 registered. A change of the template or the planner shows here as a
# diff to read before the file is replaced.
UNIT = (Path(__file__).resolve().parent / "expected/llamarack-server.service").read_text()
UNIT_SHA1 = hashlib.sha1(UNIT.encode()).hexdigest()


def first_run(s, **kw):
    return run_op(service, facts(**kw), settings=s, gpus=(V100,))


def unit_of(commands) -> str:
    """The unit file's text among an operation's commands (its upload)."""
    return next(c[2] for c in commands if isinstance(c, tuple) and c[1] == f"{UNIT_PATH}.new")


def test_first_run_writes_the_unit_then_switches_with_health_and_rollback():
    commands, noops = first_run(settings())
    assert noops == []
    # the unit's switch first, then state/units.json (the one unit, its port and card): a
    # switch that fails stops the operation, and the record keeps naming what serves
    made, upload, removed, chmod, switch = commands[:5]
    assert upload[0] == "upload" and upload[1] == f"{UNIT_PATH}.new"
    assert made.startswith("umask 077 && mkdir -m 700 /tmp/llamarack-upload-") and removed.startswith("rm -rf /tmp/llamarack-upload-")
    install, _, record, _, rename = commands[5:]
    assert install == f"install -d -m 755 {ROOT}/state" and record == ("upload", f"{ROOT}/state/units.json.new",
                                                                     UNITS_JSON + "\n")  # fmt: skip
    assert rename.startswith(f"chmod 644 {ROOT}/state/units.json.new && ")
    unit = upload[2]
    assert f"ExecStart={ROOT}/builds/b1/bin/llama-server --model {ROOT}/models/m1/model.gguf" in unit
    # the default backend is cuda: every layer and the output layer (n_layer + 1 = 3) on the card
    assert "--ctx-size 2048" in unit and "--n-gpu-layers 3" in unit
    assert "--cache-type-k f16 --cache-type-v f16" in unit  # auto: f16 gives the trained context
    assert "# llamarack health: http://127.0.0.1:8080/health" in unit
    assert unit == UNIT
    assert chmod == f"chmod 644 {UNIT_PATH}.new"
    assert "systemctl restart llamarack-server.service" in switch
    assert "rollback" in switch and f"mv -f {UNIT_PATH}.prev {UNIT_PATH}" in switch
    assert f"health {UNIT_PATH} 600 || rollback" in switch


def test_the_unit_allows_the_device_names_the_driver_registered():
    unit = unit_of(first_run(settings())[0])
    allowed = [line for line in unit.splitlines() if line.startswith("DeviceAllow=")]
    assert allowed[:2] == ["DeviceAllow=char-nvidia rw", "DeviceAllow=char-nvidiactl rw"]
    assert "DeviceAllow=char-nvidia-uvm rw" in allowed and "DeviceAllow=char-nvidia-frontend rw" not in allowed
    # the same host on a driver before 550.40: major 195 is nvidia-frontend, and the unit changes
    old = unit_of(first_run(settings(), devices=char_devices("driver_535"))[0])
    assert "DeviceAllow=char-nvidia-frontend rw" in old.splitlines() and "DeviceAllow=char-nvidia rw" not in old
    # a CPU build opens no driver device
    cpu = unit_of(first_run(settings(llamacpp_backend="cpu"))[0])
    assert "DeviceAllow=" not in cpu and "DevicePolicy=closed" in cpu


def test_converged_host_is_a_noop():
    s = settings()
    converged = facts(unit_sha1=UNIT_SHA1, running=True)
    # preflight's GPUs are used: nvidia-smi is not asked again (a read the test does not give fails it)
    del converged[NvidiaSmi], converged[fact_key(RecordedGpus, path=f"{ROOT}/state/gpus.json")]
    commands, noops = run_op(service, converged, settings=s, gpus=(V100,))
    assert commands == []
    assert noops == ["llama-server serves m1 with build b1, ctx 2048, f16/f16 KV (auto): the largest that fits 16384 MiB"]


def test_a_model_sealed_after_the_server_started_is_served_by_a_restart():
    """Remade in place (edited after its seal, say): same directory, same unit text, new file."""
    s = settings()
    commands, noops = first_run(s, unit_sha1=UNIT_SHA1, running=True,
                                sealed_at=STARTED + 30)  # fmt: skip
    assert noops == [] and "systemctl restart llamarack-server.service" in commands[-1]


def test_a_switch_cut_off_before_its_health_check_is_checked_again_keeping_the_proven_unit():
    """The unit in place is the wanted one and runs, but .prev is there: it never passed
    /health. The next run switches again; the switch keeps .prev, the proven unit."""
    s = settings()
    commands, noops = first_run(s, unit_sha1=UNIT_SHA1, running=True, prev=True)
    assert noops == [] and "systemctl restart llamarack-server.service" in commands[-1]
    switch = commands[-1]
    assert f"if [ ! -f {UNIT_PATH}.prev ] && [ -f {UNIT_PATH} ]; then cp -p {UNIT_PATH} {UNIT_PATH}.prev; fi" in switch
    assert switch.index("health ") < switch.index(f"rm -f {UNIT_PATH}.prev")


def test_same_unit_but_stopped_is_started_again():
    s = settings()
    commands, _ = first_run(s, unit_sha1=UNIT_SHA1, running=False)
    assert "systemctl restart llamarack-server.service" in commands[-1]


def test_plan_failure_refuses_without_touching_anything():
    commands, _ = first_run(settings(server_memory_reserve_mib=16384))
    assert len(commands) == 1
    assert commands[0].startswith("printf '%s\\n' 'gpu01: memory: found 16384 MiB on the card")
    assert commands[0].endswith("exit 1")


def test_missing_build_or_model_fails_when_executing_and_is_a_change_in_dry_runs():
    commands, _ = run_op(service, facts(build=None), settings=settings())
    assert "no current llama.cpp build under /opt/lr" in commands[0] and commands[0].endswith("exit 1")
    commands, _ = run_op(service, facts(model=None, shape=None), executing=False,
                         settings=settings())
    assert commands == ["echo 'write llamarack-server.service once the model is made'"]


def test_api_key_is_uploaded_as_a_file_never_in_a_command(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("sk-test-123\n")
    key_file.chmod(0o600)  # read_token refuses a secret others may read
    commands, _ = first_run(settings(server_api_key_file=str(key_file)))
    uploads = [c for c in commands if isinstance(c, tuple)]
    assert ("upload", f"{API_KEY_PATH}.new", "sk-test-123\n") in uploads
    assert not any("sk-test-123" in c for c in commands if isinstance(c, str))
    assert any(c.startswith(f"chmod 640 {API_KEY_PATH}.new && chgrp llamarack") for c in commands
               if isinstance(c, str))
    unit = next(c[2] for c in uploads if c[1] == f"{UNIT_PATH}.new")
    assert f"--api-key-file {API_KEY_PATH}" in unit


def test_key_on_host_without_a_setting_is_removed():
    commands, _ = first_run(settings(), key_digest="pbkdf2-sha256:" + "0" * 64)
    assert f"rm -f {API_KEY_PATH}" in commands


def test_cuda_hosts_offload_and_cpu_hosts_do_not():
    unit = unit_of(first_run(settings(llamacpp_backend="cuda"))[0])
    assert "--n-gpu-layers 3" in unit
    unit = unit_of(first_run(settings(llamacpp_backend="cuda", server_gpu_layers=0))[0])
    assert "--n-gpu-layers 0" in unit  # CPU only on a CUDA build: valid, and said
    unit = unit_of(first_run(settings(llamacpp_backend="cpu"))[0])
    assert "--n-gpu-layers" not in unit


def test_cards_preflight_missed_come_from_the_record_never_from_nvidia_smi_again():
    # preflight knew no GPU (a driver waiting for the reboot the driver role then did,
    # on a host with no record yet): the record the driver role wrote after it counts
    no_smi = facts(recorded=(V100,))
    del no_smi[NvidiaSmi]  # asking nvidia-smi again would fail the test
    commands, _ = run_op(service, no_smi, settings=settings())
    assert "largest that fits 16384 MiB" in unit_of(commands)
    no_smi[fact_key(RecordedGpus, path=f"{ROOT}/state/gpus.json")] = ()
    commands, _ = run_op(service, no_smi, settings=settings())
    assert "(CPU; trained 2048)" in unit_of(commands)


def test_api_key_on_a_build_without_api_key_file_is_refused(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("sk-test-123\n")
    key_file.chmod(0o600)  # read_token refuses a secret others may read
    old = {**facts(), fact_key(LlamaServerFlags, root=ROOT): ServerFlags(("--no-mmap",), False, False, False)}
    commands, _ = run_op(service, old, settings=settings(server_api_key_file=str(key_file)), gpus=(V100,))
    assert len(commands) == 1 and "gpu01: api-key-file: found server_api_key_file set" in commands[0]
    assert commands[0].endswith("exit 1") and "sk-test-123" not in commands[0]


def test_diff_shows_how_the_unit_changes(caplog):
    old_unit = ["[Service]", "ExecStart=/opt/lr/builds/b0/bin/llama-server --ctx-size 512"]
    with_old = facts(unit_sha1="0" * 40, running=True, units={
        "llamarack-server.service": found_unit(sha1="0" * 40, running=True, lines=old_unit)})
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        commands, _ = run_op(service, with_old, diff=True, settings=settings(), gpus=(V100,))
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert f"Will modify {UNIT_PATH}" in text
    assert "--ctx-size 512" in text and "builds/b1/bin/llama-server" in text  # the old line and the new
    assert commands  # --diff shows; the change itself is still made when executing
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        run_op(service, with_old, diff=False, settings=settings(), gpus=(V100,))
    assert "Will modify" not in "\n".join(r.getMessage() for r in caplog.records)


def test_the_same_board_gets_the_same_context_whatever_its_driver_reports():
    from dataclasses import replace

    notes = set()
    for reported in (16130, 16160, 16384):  # one V100 16 GB under three drivers
        card = replace(V100, memory_mib=reported, pci_device_id="0x1DB110DE")
        commands, _ = run_op(service, facts(), settings=settings(server_cache_type_k="f16", server_cache_type_v="f16",
                                                                 server_memory_reserve_mib=16000), gpus=(card,))  # fmt: skip
        notes.add(next(line for line in unit_of(commands).splitlines() if line.startswith("Description=")))
    assert len(notes) == 1 and "16130 MiB" in notes.pop()


def test_the_host_says_nothing_about_the_api_key_a_guess_could_be_checked_against(tmp_path):
    key = "sk-test-123"
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    on_host = digest((key + "\n").encode(), KEY_DIGEST_SALT)
    unit = UNIT.replace(" --metrics\n", f" --api-key-file {API_KEY_PATH} --metrics\n")
    assert unit_of(first_run(settings(server_api_key_file=str(key_file)))[0]) == unit
    converged = facts(unit_sha1=hashlib.sha1(unit.encode()).hexdigest(), running=True, key_digest=on_host)
    commands, noops = run_op(service, converged, settings=settings(server_api_key_file=str(key_file)), gpus=(V100,))
    assert commands == [] and len(noops) == 1  # the same key: nothing uploaded, nothing restarted
    # What the fact prints (-vvv) and its command line (-vv): no plain hash of the
    # key, and a digest that another run (another salt) would not repeat.
    plain = {hashlib.new(h, (key + s).encode()).hexdigest() for h in ("sha1", "sha256", "md5") for s in ("", "\n")}
    assert not any(p in on_host or p in key_digest_command() for p in plain)
    assert key not in key_digest_command() and on_host != digest((key + "\n").encode(), "another run")


def test_two_switches_at_once_run_one_after_the_other(tmp_path, monkeypatch):
    """A switch whose run died (SSH dropped, pyinfra killed) goes on on the host; the next
    run's switch must wait for it, not restart the service under its /health check."""
    import subprocess
    import time

    from llamarack import remote
    from roles.server import switch
    from roles.server.plan import UnitRef

    unit = tmp_path / "unit"
    unit.write_text("old\n")
    monkeypatch.setattr(switch, "SWITCH_LOCK", str(tmp_path / "switch.lock"))
    monkeypatch.setattr(remote, "command", lambda name, *args: f"sleep 0.3; echo health >> {tmp_path}/log #")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, body in (("systemctl", f'echo "$1" >> {tmp_path}/log; [ "$1" = restart ] && sleep 0.3; true'),
                       ("journalctl", "true")):  # fmt: skip
        (bin_dir / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    script = switch.switch_script(settings(llamarack_root=str(tmp_path / "root"), llamarack_allow_shared_dirs=True),
                                  (UnitRef(None, "llamarack-server.service", str(unit), 8080),))  # fmt: skip
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    runs = []
    for text in ("new-1\n", "new-2\n"):
        (tmp_path / "unit.new").write_text(text)
        runs.append(subprocess.Popen(["sh", "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        time.sleep(0.1)  # the first has moved its unit in and restarts when the second starts
        if len(runs) == 1:
            while (tmp_path / "unit.new").exists():
                time.sleep(0.01)
    outs = [r.communicate(timeout=30)[0].decode() for r in runs]
    assert [r.returncode for r in runs] == [0, 0], outs
    steps = (tmp_path / "log").read_text().split()
    # Each switch's restart is followed by its own /health check before the other restarts.
    assert steps == ["daemon-reload", "enable", "restart", "health"] * 2, steps
    assert unit.read_text() == "new-2\n" and not (tmp_path / "unit.prev").exists()


OLD_UNIT = [
    "# llamarack health: http://127.0.0.1:8080/health",
    f"ExecStart={ROOT}/builds/b0/bin/llama-server --model {ROOT}/models/m0/model.gguf --port 8080",
]


def test_a_unit_put_back_by_rollback_is_kept_while_the_settings_want_what_it_replaced():
    s = settings()
    pin = {"unit_sha1": "0" * 40, "replaced_sha1": UNIT_SHA1, "at": STARTED}
    held = facts(unit_sha1="0" * 40, units={"llamarack-server.service": found_unit(
        sha1="0" * 40, running=True, pin=pin, lines=OLD_UNIT)})  # fmt: skip
    commands, noops = run_op(service, held, settings=s, gpus=(V100,))
    assert commands == [] and noops == ["llama-server serves the unit `llamarack rollback` put back"]
    # stopped: started again as it is, and checked, never replaced by the wanted unit
    stopped = facts(unit_sha1="0" * 40, units={"llamarack-server.service": found_unit(
        sha1="0" * 40, running=False, pin=pin, lines=OLD_UNIT)})  # fmt: skip
    commands, _ = run_op(service, stopped, settings=s, gpus=(V100,))
    assert len(commands) == 1 and 'systemctl restart "$svc" && health "$u" 600' in commands[0]
    assert f"for u in {UNIT_PATH}; do" in commands[0]
    assert "upload" not in str(commands)


def test_changed_settings_release_the_rollback_pin_and_switch_to_what_they_want():
    s = settings()
    pin = {"unit_sha1": "0" * 40, "replaced_sha1": "1" * 40, "at": STARTED}  # settings wanted another unit then
    commands, _ = first_run(s, unit_sha1="0" * 40, running=True, pin=pin)
    assert commands[0] == f"rm -f {ROOT}/state/rollback.json"
    assert commands[2][0] == "upload" and commands[2][2] == UNIT
    # a pin that holds nothing once the host serves the wanted unit again changes nothing (the
    # audit agrees: no drift); the next switch releases it
    commands, noops = first_run(s, unit_sha1=UNIT_SHA1, running=True, pin=pin)
    assert commands == [] and len(noops) == 1 and "llama-server serves" in noops[0]


def test_rollback_switches_the_previous_unit_in_and_pins_it():
    from roles.llamacpp.reads import BuildSeals, Seals
    from roles.server.operations import rollback

    s = settings()
    current = [f"ExecStart={ROOT}/builds/b1/bin/llama-server --model {ROOT}/models/m1/model.gguf"]
    state = {fact_key(FileContents, path=f"{ROOT}/state/previous.service"): OLD_UNIT,
             fact_key(ServedUnits, state=f"{ROOT}/state", health=True): {"llamarack-server.service": found_unit(lines=current)},
             fact_key(BuildSeals, root=ROOT): Seals({"b0": []})}  # fmt: skip
    commands, _ = run_op(rollback, state, settings=s)
    check, copy, switch, pin = commands
    assert check.startswith(f"test -e {ROOT}/builds/b0/bin/llama-server && test -e {ROOT}/models/m0/model.gguf || ")
    assert copy == f"cp -p {ROOT}/state/previous.service {UNIT_PATH}.new && chmod 644 {UNIT_PATH}.new"
    assert f"health {UNIT_PATH} 600 || rollback" in switch and f"mv -f {UNIT_PATH}.prev {ROOT}/state/previous.service" in switch
    assert f"> {ROOT}/state/rollback.json.new" in pin
    # nothing recorded, or a previous build whose files changed since its seal: refused, nothing touched
    none = {**state, fact_key(FileContents, path=f"{ROOT}/state/previous.service"): None}
    (refused,), _ = run_op(rollback, none, settings=s)
    assert "rollback: no previous unit" in str(refused)
    tampered = {**state, fact_key(BuildSeals, root=ROOT): Seals({"b0": ["build/bin/llama-server: size 1 (sealed: 2)"]})}
    (refused,), _ = run_op(rollback, tampered, settings=s)
    assert "build b0 differs from its seal" in str(refused)


def test_a_detached_script_finishes_when_the_session_that_started_it_dies(tmp_path, monkeypatch):
    """The switch runs as a transient service of its own (``switch.detached``): killing the
    command that started it (pyinfra's SSH session dying) leaves it going to its end, and a
    waiter that lives gets its output and its exit status."""
    import os
    import signal
    import subprocess
    import time

    from roles.server import switch

    monkeypatch.setattr(switch, "DETACHED_DIR", str(tmp_path))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # systemd-run starts the command in the background, detached, as PID 1 would; systemctl
    # is-active says "active" while it runs.
    (bin_dir / "systemd-run").write_text(
        '#!/bin/sh\nfor a; do case $a in --unit=*) unit=${a#--unit=} ;; esac; done\n'
        'while [ "$1" != /bin/sh ]; do shift; done\n'
        f'setsid sh -c \'"$@" & echo $! > {tmp_path}/$0.pid; wait\' "$unit" "$@" > /dev/null 2>&1 &\n'
        f'while [ ! -f {tmp_path}/$unit.pid ]; do sleep 0.01; done\n')  # fmt: skip
    (bin_dir / "systemctl").write_text(
        f'#!/bin/sh\nkill -0 $(cat {tmp_path}/$2.pid) 2>/dev/null && echo active || echo inactive\n')
    for tool in ("systemd-run", "systemctl"):
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}

    ok = switch.detached("echo switched; echo why >&2", "a test")
    done = subprocess.run(["sh", "-c", ok], env=env, capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout) == (0, "switched\nwhy\n"), done
    failed = subprocess.run(["sh", "-c", switch.detached("echo rolled back; exit 3", "a test")], env=env,
                            capture_output=True, text=True, timeout=30)  # fmt: skip
    assert (failed.returncode, failed.stderr, failed.stdout) == (3, "rolled back\n", ""), failed
    assert not list(tmp_path.glob("llamarack-switch.*"))  # the waiter cleaned up

    slow = switch.detached(f"sleep 1; echo finished > {tmp_path}/marker", "a test")
    waiter = subprocess.Popen(["sh", "-c", slow], env=env, start_new_session=True)
    time.sleep(0.3)
    os.killpg(waiter.pid, signal.SIGKILL)  # the session and everything it started in its group
    waiter.wait()
    deadline = time.monotonic() + 10
    while not (tmp_path / "marker").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "marker").read_text() == "finished\n"


def test_a_detached_script_may_not_end_its_own_heredoc():
    import pytest

    from roles.server import switch

    with pytest.raises(ValueError):
        switch.detached(f"echo\n{switch._END}\nrm -rf /", "a test")


def test_a_process_serving_another_model_than_its_unit_is_restarted_through_the_switch():
    """The unit file is the wanted one and runs, but its process's /props names another model:
    the files were switched and the process never restarted. The next run restarts it."""
    s = settings()
    said = {"build_info": "b1-dccad28c6", "model_path": f"{ROOT}/models/m0/model.gguf", "total_slots": 1}
    unit = found_unit(sha1=UNIT_SHA1, running=True, lines=UNIT.splitlines())
    stale = {"llamarack-server.service": dataclasses.replace(unit, health=200, props=said)}
    commands, noops = first_run(s, unit_sha1=UNIT_SHA1, running=True, units=stale)
    assert noops == [] and "systemctl restart llamarack-server.service" in commands[-1]
    assert f"health {UNIT_PATH} 600 || rollback" in commands[-1]
    # the same process serving the unit's own model is left alone
    said["model_path"] = f"{ROOT}/models/m1/model.gguf"
    same = {"llamarack-server.service": dataclasses.replace(unit, health=200, props=dict(said))}
    assert first_run(s, unit_sha1=UNIT_SHA1, running=True, units=same)[0] == []


def test_the_units_check_after_each_start_is_put_where_missing_or_changed():
    """A CUDA unit's ExecStartPost= runs the switch's own check (wait_healthy) from
    libexec/unit_check.py, as root, outside the sandbox; the host gets that file (mode 644, by
    a rename) before any unit that names it, and again only when it differs."""
    assert f"ExecStartPost=+/usr/bin/python3 -I -S {ROOT}/libexec/unit_check.py http://127.0.0.1:8080/health " \
           "llamarack-server.service 600 " in UNIT  # fmt: skip
    for check in (None, "0" * 64):
        commands, _ = first_run(settings(), check=check)
        install, made, upload, removed, rename = commands[:5]
        assert install == f"install -d -m 755 {ROOT}/libexec" and made.startswith("umask 077 && mkdir")
        assert upload == ("upload", f"{ROOT}/libexec/unit_check.py.new", remote.source("wait_healthy"))
        assert rename.startswith(f"chmod 644 {ROOT}/libexec/unit_check.py.new && ")
        assert unit_of(commands[5:]) == UNIT  # then the unit that runs it
    commands, _ = run_op(service, facts(unit_sha1=UNIT_SHA1, running=True, check=None), settings=settings(),
                         gpus=(V100,))  # fmt: skip
    put = ("upload", f"{ROOT}/libexec/unit_check.py.new", remote.source("wait_healthy"))
    assert put in commands  # a converged host missing it gets it back
    cpu = settings(llamacpp_backend="cpu")
    commands, _ = run_op(service, facts(check=None), settings=cpu, gpus=(V100,))
    assert "ExecStartPost" not in unit_of(commands) and put not in commands
