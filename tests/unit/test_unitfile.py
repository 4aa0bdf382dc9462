"""Values in the served unit are escaped for systemd, and systemd itself reads them back.

systemd's own parser is the judge: ``systemd --test --user`` loads the
rendered unit and dumps what it understood (the unit's Description, User,
WorkingDirectory and each Exec command line), and ``systemd-analyze
security --offline`` rates the sandbox. Both run offline, without a running
systemd; they need root (to run the dump as ``nobody``) and systemd installed.
"""

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from roles.server import unitfile
from llamarack.layout import UNIT_NAME
from roles.settings import load_settings
from roles.server.plan import render_unit

SYSTEMD = Path("/lib/systemd/systemd")
needs_systemd = pytest.mark.skipif(
    not (SYSTEMD.exists() and shutil.which("runuser") and os.geteuid() == 0),
    reason="systemd's --test dump needs /lib/systemd/systemd and root (it runs as nobody)",
)
needs_analyze = pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="no systemd-analyze")

# A GGUF's general.architecture is the model file's own text: here, the attack
# of a root ExecStartPre), plus specifiers, quotes and a line join.
EVIL_ARCH = 'llama\n[Service]\nExecStartPre=+/bin/sh -c id\nUser=root %h "q" \\'
ODD_ARGS = ["--model", "/models/odd dir/model.gguf", "--alias", "%h%%n", 'say "hi"', "it's",
            "back\\slash", "$HOME", "${USER}", "$$", ";", "", "  lead", "a=b c", "ünïcode"]  # fmt: skip


def settings(**data):
    return load_settings("gpu01", {"python_env_backend": "venv", **data})


def render(description="llamarack llama-server: m", args=None, **data):
    args = args or ["/opt/llamarack/builds/b1/bin/llama-server", *ODD_ARGS]
    return render_unit(settings(**data), args, description)


def systemd_reads(unit: str) -> dict:
    """What systemd makes of ``unit``: its dump's settings for the unit, one list per name."""
    with tempfile.TemporaryDirectory(prefix="llamarack-unit-") as d:
        os.chmod(d, 0o755)  # read by nobody
        (Path(d) / UNIT_NAME).write_text(unit)
        run = Path(d) / "run"
        run.mkdir()
        shutil.chown(run, "nobody")
        env = {"HOME": str(run), "XDG_RUNTIME_DIR": str(run), "SYSTEMD_UNIT_PATH": f"{d}:",
               "PATH": "/usr/bin:/bin", "SYSTEMD_LOG_LEVEL": "warning"}  # fmt: skip
        out = subprocess.run(["runuser", "-u", "nobody", "--", "env", *(f"{k}={v}" for k, v in env.items()),
                              str(SYSTEMD), "--test", "--user", f"--unit={UNIT_NAME}", "--no-pager"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    block = out.stdout.split(f"\t-> Unit {UNIT_NAME}:\n", 1)[1].split("\n\t-> Unit ", 1)[0]
    seen: dict = {}
    section = None
    for line in block.splitlines():
        if m := re.fullmatch(r"\t\t-> (\w+):", line):
            section = m.group(1)
            seen.setdefault(section, [])
        elif m := re.fullmatch(r"\t\t\tCommand Line: (.*)", line):
            seen[section].append(m.group(1))
        elif m := re.fullmatch(r"\t\t(\w+): (.*)", line):
            seen.setdefault(m.group(1), []).append(m.group(2))
    return seen


def exec_argv(command_line: str) -> list:
    """The argv systemd runs for a command line of its dump. The dump quotes a word
    that needs it in "...", with \\ before " $ ` and \\ (systemd's shell_escape);
    at exec time ``$$`` becomes ``$``, and a lone ``$NAME`` would be expanded."""
    words = []
    for m in re.finditer(r'"((?:[^"\\]|\\.)*)"|(\S+)', command_line):
        if m.group(2) is not None:
            words.append(m.group(2))
            continue
        escaped = re.findall(r"\\(.)", m.group(1))
        assert set(escaped) <= set('"$`\\'), f"an escape this test does not read: {m.group(1)}"
        words.append(re.sub(r"\\(.)", r"\1", m.group(1)))
    for w in words:
        assert "$" not in w.replace("$$", ""), f"{w!r} would expand an environment variable"
    return [w.replace("$$", "$") for w in words]


@needs_systemd
def test_model_metadata_cannot_add_a_command_and_every_argument_survives():
    args = ["/opt/llamarack/builds/b1/bin/llama-server", *ODD_ARGS]
    unit = render(f"llamarack llama-server: m ({EVIL_ARCH}, ctx 4096)", args)
    seen = systemd_reads(unit)
    assert len(seen["ExecStart"]) == 1 and "ExecStartPre" not in seen
    assert exec_argv(seen["ExecStart"][0]) == args
    assert seen["User"] == ["llamarack"] and seen["WorkingDirectory"] == ["/opt/llamarack"]
    # The architecture is shown, on its one line, with nothing expanded.
    (description,) = seen["Description"]
    assert description == ('llamarack llama-server: m (llama\\x0a[Service]\\x0aExecStartPre=+/bin/sh -c id'
                           '\\x0aUser=root %h "q" \\x5c, ctx 4096)')  # fmt: skip
    assert unit.count("\nExecStart") == 1 and "\nUser=root" not in unit


@needs_systemd
@pytest.mark.parametrize("word", ODD_ARGS)
def test_each_odd_argument_is_read_back_alone(word):
    args = ["/opt/llamarack/builds/b1/bin/llama-server", word]
    assert exec_argv(systemd_reads(render(args=args))["ExecStart"][0]) == args


@needs_systemd
def test_a_description_ending_in_a_backslash_does_not_swallow_the_next_line():
    seen = systemd_reads(render("ends in \\"))
    assert seen["Description"] == ["ends in \\x5c"] and len(seen["ExecStart"]) == 1


@needs_systemd
def test_a_huge_description_with_line_separators_is_one_bounded_line_to_systemd():
    """\\x85 and U+2028 end a line for str.splitlines, not for systemd: both are spelled,
    and a 2 MiB text (systemd refuses such a line) is cut."""
    seen = systemd_reads(render("m (\x85ExecStart=/bin/spoofed\u2028[Service]\u2029" + "x" * (2 << 20) + ")"))
    (description,) = seen["Description"]
    assert description.startswith("m (\\x85ExecStart=/bin/spoofed\\u2028[Service]\\u2029xxx")
    assert len(description) <= unitfile.TEXT_MAX and description.endswith("...")
    assert len(seen["ExecStart"]) == 1 and "ExecStartPre" not in seen


def test_values_that_cannot_be_written_are_refused():
    for bad in (["/b/llama-server", "two\nlines"], ["relative/llama-server"], ["/b/odd dir/llama-server"],
                ["+/bin/sh"], ["/b/../llama-server"], []):  # fmt: skip
        with pytest.raises(unitfile.UnitValueError):
            unitfile.exec_line(bad)
    for bad in ("", " x", "x\n", "x\\"):
        with pytest.raises(unitfile.UnitValueError):
            unitfile.value("User", bad)
    with pytest.raises(unitfile.UnitValueError):
        unitfile.comment("# a\nb")


def test_plain_words_stay_unquoted():
    line = unitfile.exec_line(["/opt/lr/bin/llama-server", "--host", "0.0.0.0", "--port", "8080", "a b", "50%"])
    assert line == '/opt/lr/bin/llama-server --host 0.0.0.0 --port 8080 "a b" "50%%"'


@needs_analyze
def test_the_unit_sandbox_rates_ok():
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / UNIT_NAME
        path.write_text(render(args=["/opt/llamarack/builds/b1/bin/llama-server", "--model", "/m/model.gguf"]))
        out = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", str(path)],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    score = float(re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out.stdout).group(1))
    assert score <= 2.0, out.stdout


@needs_analyze
def test_the_unit_passes_verify_but_for_the_missing_binary():
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / UNIT_NAME
        path.write_text(render(f"m ({EVIL_ARCH})"))
        out = subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    problems = [line for line in out.stderr.splitlines() if line.strip()]
    assert problems == [f"{UNIT_NAME}: Command /opt/llamarack/builds/b1/bin/llama-server is not executable: "
                        "No such file or directory"], out.stderr  # fmt: skip


def _char_devices(case: str) -> tuple:
    """The ``CharDevices`` fact of a fixture (real ``/proc/devices`` output)."""
    from roles.driver.reads import CharDevices

    fixture = Path(__file__).parents[1] / "facts" / "CharDevices" / f"{case}.json"
    return CharDevices().process(__import__("json").loads(fixture.read_text())["output"])


def test_the_driver_devices_allowed_are_the_names_the_host_registered():
    from roles.server.plan import device_names

    # driver 580 (the lent H200): major 195 is "nvidia" and "nvidiactl"; no "nvidia-frontend"
    new = device_names(_char_devices("driver_580_h200"), cuda=True)
    assert new[:2] == ("nvidia", "nvidiactl") and "nvidia-frontend" not in new
    assert {"nvidia-uvm", "nvidia-caps"} <= set(new)
    # a driver before 550.40: major 195 is "nvidia-frontend"
    old = device_names(_char_devices("driver_535"), cuda=True)
    assert old[0] == "nvidia-frontend" and "nvidia" not in old and {"nvidia-uvm", "nvidia-caps"} <= set(old)
    # nothing registered (the module not loaded when read): both eras' names, and uvm
    assert device_names(_char_devices("no_driver"), cuda=True) == ("nvidia-frontend", "nvidia", "nvidiactl",
                                                                  "nvidia-uvm")  # fmt: skip
    # a CPU build opens no driver device
    assert device_names(_char_devices("driver_580_h200"), cuda=False) == ()


@needs_systemd
@pytest.mark.parametrize("case", ["driver_580_h200", "driver_535"])
def test_systemd_reads_one_device_rule_per_registered_driver_name(case):
    from roles.server.plan import device_names

    devices = _char_devices(case)
    names = device_names(devices, cuda=True)
    args = ["/opt/llamarack/builds/b1/bin/llama-server", "--model", "/m/model.gguf"]
    unit = render_unit(settings(), args, "m", devices=names)
    seen = systemd_reads(unit)
    assert seen["DevicePolicy"] == ["closed"]
    # ProtectClock= adds systemd's own "char-rtc r"; every other rule is one driver name
    assert set(seen["DeviceAllow"]) - {"char-rtc r"} == {f"char-{name} rw" for name in names}
    registered_195 = {d.name for d in devices if d.major == 195}
    assert registered_195 and registered_195 <= set(names), (registered_195, names)


def test_a_cuda_unit_names_its_cards_and_weights_for_the_switch_and_a_cpu_unit_does_not():
    from roles.server.plan import RESIDENCY_MARK

    args = ["/opt/llamarack/builds/b1/bin/llama-server", "--model", "/m/model.gguf"]
    cuda = render_unit(settings(), args, "m", residency_on=(("GPU-1c315d8b-7c35-20bc-491b-dbfb0494e2cd",), 4460))
    assert f"{RESIDENCY_MARK}GPU-1c315d8b-7c35-20bc-491b-dbfb0494e2cd 4460\n" in cuda
    plain = render_unit(settings(), args, "m")
    # ... and its check after each start, boot included, as root: the switch's own, from the unit's lines
    post = [line for line in cuda.split("\n") if line.startswith("ExecStartPost=")]
    assert post == ["ExecStartPost=+/usr/bin/python3 -I -S /opt/llamarack/libexec/unit_check.py "
                    "http://127.0.0.1:8080/health llamarack-server.service 600 "
                    '"GPU-1c315d8b-7c35-20bc-491b-dbfb0494e2cd 4460"'], cuda  # fmt: skip
    kept = [line for line in cuda.split("\n") if not line.startswith(RESIDENCY_MARK) and line not in post]
    assert RESIDENCY_MARK not in plain and "ExecStartPost" not in plain
    assert [line for line in kept if line not in plain.split("\n")] == [
        "# Started only once it answers /health from its planned cards, at boot as at a switch:",
        "# else the unit fails (and restarts), and the gateway's check takes it out. \"+\": the",
        "# check runs as root outside the sandbox (nvidia-smi, this start's journal)."]
