"""Host and model text on its way to a unit file and to the operator's terminal: each hostile
case ends in a refusal that names what is wrong, or a safe answer.

- a GGUF's ``general.architecture`` reaches ``Description=``: every character some reader
  takes for a line break is spelled visibly, and the line is bounded;
- the audit reads the unit in place as systemd does (lines end at ``\\n`` only);
- the audit's table escapes what hosts print (a GPU process's name, an error);
- a comma in a process name is read, not a host's facts "unreadable".
"""

import json
import re
from pathlib import Path

import pytest

from roles.server import unitfile
from llamarack.audit import HostAudit, Item, as_table, printable
from roles.model.shapes import shape_from_config
from roles.driver.reads import GpuProcess, GpuProcesses
from roles.llamacpp.reads import BuildFlags
from roles.server.audit import unit_item
from roles.server.reads import FoundUnit
from roles.server.plan import wanted_units
from roles.settings import load_settings

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "configs"
LLAMA8B = shape_from_config(json.loads((CONFIGS / "llama-3.1-8b-instruct.config.json").read_text()), "Q4_K_M")
FLAGS = BuildFlags(("--load-mode", "none"), True, True, True, has_rope_scaling=True)
UUID = "GPU-f267499c-37f0-6227-95d2-9659518eaae9"
# Every character str.splitlines ends a line at, and the C0/C1 controls around them.
LINE_BREAKS = ["\n", "\r", "\r\n", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\x00", "\x1b",
               "\x7f", "\x9b"]  # fmt: skip


def settings(**data):
    return load_settings("gpu01", {"python_env_backend": "venv", "llamacpp_backend": "cpu", **data})


def unit_for(architecture: str) -> str:
    shape = {**LLAMA8B, "architecture": architecture}
    _, (unit,) = wanted_units(settings(), FLAGS, "/opt/llamarack/builds/b1", "/opt/llamarack/models/m1", shape, ())
    return unit.text


@pytest.mark.parametrize("brk", LINE_BREAKS, ids=ascii)
def test_a_line_break_in_the_architecture_stays_on_the_description_line(brk):
    unit = unit_for(f"llama{brk}ExecStart=/bin/sh -c id{brk}[Service]")
    for lines in (unit.split("\n"), unit.splitlines()):
        assert sum(line.startswith("ExecStart=") for line in lines) == 1
        assert [line for line in lines if line.startswith("ExecStart=")][0].startswith(
            "ExecStart=/opt/llamarack/builds/b1/bin/llama-server ")
    assert unit.split("\n") == unit.splitlines() + [""]  # no reader finds another line
    (description,) = [line for line in unit.split("\n") if line.startswith("Description=")]
    assert description.isprintable() and "ExecStart=/bin/sh -c id" in description


@pytest.mark.parametrize("brk", LINE_BREAKS, ids=ascii)
def test_a_line_break_in_a_value_systemd_must_read_back_is_refused(brk):
    with pytest.raises(unitfile.UnitValueError, match="cannot be written into a unit file"):
        unitfile.value("User", f"llm{brk}x")
    with pytest.raises(unitfile.UnitValueError, match="cannot be written into a unit file as one comment line"):
        unitfile.comment(f"# health{brk}x")
    with pytest.raises(unitfile.UnitValueError, match="a control character"):
        unitfile.exec_line(["/b/llama-server", f"--alias{brk}x"])


@pytest.mark.parametrize("architecture, kept", [
    ("x" * (2 << 20), "x" * 61 + "..., ctx "),
    ("\u2028" * (2 << 20), "\\u2028" * 10),  # cut to 64 characters, spelled, then bounded
    ("llama", "llama, ctx "),
    ("y" * 64, "y" * 64 + ", ctx "),
], ids=["2MiB", "2MiB-of-U+2028", "llama", "64"])  # fmt: skip
def test_a_huge_architecture_is_cut_to_a_name_and_the_description_bounded(architecture, kept):
    unit = unit_for(architecture)
    (description,) = [line for line in unit.split("\n") if line.startswith("Description=")]
    assert len(description) <= len("Description=") + unitfile.TEXT_MAX and f"m1 ({kept}" in description
    assert max(len(line) for line in unit.split("\n")) < 1000


@pytest.mark.parametrize("value", ["x" * (2 << 20), "\n" * (2 << 20), "%" * (2 << 20), "\\" * 1000,
                                   "a" * 510 + "\n"], ids=["2MiB", "2MiB-of-newlines", "2MiB-of-%", "backslashes",
                                                           "escape-at-the-cut"])  # fmt: skip
def test_free_text_is_bounded_before_doubling_and_never_cuts_an_escape(value):
    shown = unitfile.text(value)
    undoubled = shown.replace("%%", "%")
    assert len(undoubled) <= unitfile.TEXT_MAX and shown.isprintable() and undoubled.endswith("...")
    # What is kept is whole: every backslash starts a \\xNN, every % is doubled.
    assert re.fullmatch(r"(?:\\x[0-9a-f]{2}|[^\\%]|%%)*\.\.\.", shown), shown


def test_free_text_within_the_bound_is_kept_whole():
    assert unitfile.text("a" * unitfile.TEXT_MAX) == "a" * unitfile.TEXT_MAX
    assert unitfile.text("50% of \u2028 and \x85") == "50%% of \\u2028 and \\x85"


@pytest.mark.parametrize("brk", ["\x85", "\u2028", "\u2029", "\v", "\f", "\x1c", "\x1d", "\x1e"])
def test_the_audit_reads_the_unit_in_place_as_systemd_does(brk):
    """A unit edited on the host: systemd reads one Description line; so does the audit."""
    unit = (f"[Unit]\nDescription=m{brk}ExecStart=/bin/spoofed\n[Service]\n"
            "ExecStart=/opt/llamarack/builds/b1/bin/llama-server --port 8080\n")
    found = FoundUnit("llamarack-server.service", "0" * 40, tuple(unit.rstrip("\n").split("\n")), False, {})
    item = unit_item(settings(), found, None, "no current build or model to plan from")
    assert item.found["exec_start"] == "/opt/llamarack/builds/b1/bin/llama-server --port 8080"


def test_a_comma_in_a_process_name_is_read_and_the_host_stays_readable():
    lines = [f"457, python3 worker, rank 0,1, 1542, {UUID}", f"3197, /opt/lr/bin/llama-server, [N/A], {UUID}",
             f"9, a,,b,, 7, {UUID}"]  # fmt: skip
    assert GpuProcesses().process(lines) == (GpuProcess(457, "python3 worker, rank 0,1", 1542, UUID),
                                             GpuProcess(3197, "/opt/lr/bin/llama-server", None, UUID),
                                             GpuProcess(9, "a,,b,", 7, UUID))  # fmt: skip


HOSTILE = "\x1b[2J\x1b[31mowned\x1b]0;title\x07\r\u202e\u2028\x85\udc80"


@pytest.mark.parametrize("colour", [False, True])
def test_the_audit_table_escapes_what_hosts_print(colour):
    processes = {"llama_server": [], "others": [{"pid": 457, "name": HOSTILE + ", rank 0", "used_mib": 1542}]}
    audits = [
        HostAudit("gpu01", items={"gpu_processes": Item(processes, {"others": []}, drift=True),
                                  "unit": Item({"exec_start": HOSTILE}, {"sha256": HOSTILE}, drift=True)}),
        HostAudit("gpu02", reachable=False, error=f"ssh: {HOSTILE}"),
        HostAudit("gpu03", error=f"unreadable facts: {HOSTILE}", items={"health": Item(200, 200)}),
    ]  # fmt: skip
    table = as_table(audits, colour=colour)
    shown = table.replace("\x1b[", "") if colour else table  # click's own colours only
    assert all(line.isprintable() for line in shown.split("\n")), table
    assert "\\x1b[2J\\x1b[31mowned\\x1b]0;title\\x07\\x0d\\u202e\\u2028\\x85\\udc80" in table
    assert table.encode("utf-8")  # a lone surrogate would fail here


@pytest.mark.parametrize("text, shown", [
    ("plain text, ünïcode", "plain text, ünïcode"),
    ("\x1b[0m", "\\x1b[0m"),
    ("tab\there", "tab\\x09here"),
    ("\U000e0001", "\\U000e0001"),
])  # fmt: skip
def test_printable_spells_what_a_terminal_would_act_on(text, shown):
    assert printable(text) == shown
