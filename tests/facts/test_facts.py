"""Fact fixtures, in pyinfra's style: raw command output in, parsed fact out.

Each ``<Fact>/<case>.json`` holds the ``output`` lines a host printed for the
fact's command, the expected ``fact`` and the ``source`` of the output.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.api.exceptions import FactProcessError

from tests.support.facts import ALL, FACTS as facts

HERE = Path(__file__).parent
CASES = sorted(HERE.glob("*/*.json"))


def as_json(value):
    """The fact as the fixtures write it (dataclasses as dicts, tuples as lists)."""

    def plain(v):
        if hasattr(v, "to_json"):  # a fact value: as pyinfra's CLI prints it
            return plain(v.to_json())
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        return v

    return json.loads(json.dumps(plain(value)))


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_fact_fixture(path):
    case = json.loads(path.read_text())
    fact = getattr(facts, path.parent.name)()
    assert as_json(fact.process(case["output"])) == case["fact"]


def test_every_fact_has_fixtures():
    assert set(ALL) == {p.parent.name for p in CASES}


@pytest.mark.parametrize(
    "fact, output",
    [
        (facts.NvidiaSmi, ["garbage"]),
        (facts.NvidiaKernelModule, ["NVRM version: something else"]),
        (facts.GccVersions, ["gcc not-a-version"]),
        (facts.CudaToolkits, ["toolkit /usr/local/cuda", "nvcc: NVIDIA (R) Cuda compiler driver"]),
        (facts.CmakeVersion, ["bash: cmake: broken"]),
        (facts.FreeDiskBytes, ["stat: cannot read file system information for '/opt': No such file or directory"]),
        (facts.FreeDiskBytes, ["/dev/vda 263174212 22473960 83840596 22% /"]),  # df's line: not this command's
        (facts.CachedBlobs, ["stat: cannot statx 'sha256/x': No such file or directory"]),
        (facts.CachedBlobs, ["sha256/" + "0" * 64 + " 12 yesterday"]),
        (facts.DeployedBy, ['{"llamarack": "$(id)"}']),
        (facts.DeployedBy, ["not json"]),
        (facts.CachedBlobs, ["../../etc/" + "0" * 64 + " 12 1000000000.000000000"]),
        (facts.SystemUser, ["getent: unknown database"]),
        (facts.RecordedGpus, ['[{"name": "x"}]']),  # whole JSON of another shape (a torn one is none)
        # real output on the first 100 bytes of the tiny GGUF (an interrupted copy)
        (facts.GgufShape, ['{"error": "truncated GGUF header", "path": "/tmp/trunc.gguf"}']),
        (facts.GgufShape, ["Traceback (most recent call last):"]),
        (facts.CpuFlags, ["flags\t\t: fpu sse2 $(reboot)"]),
    ],
)
def test_unexpected_output_is_a_fact_process_error(fact, output):
    with pytest.raises(FactProcessError):
        fact().process(output)


def test_an_unreadable_gpu_line_is_named_not_a_failed_fact():
    """One card's bad line must not hide the others: it is kept for a rule to refuse."""
    state = facts.NvidiaSmi().process(["0, Tesla T4, GPU-x, lots, 7.5, 550.1", "llamarack: exit 0"])
    assert state.state == "ok" and state.gpus == ()
    assert state.unreadable == ("0, Tesla T4, GPU-x, lots, 7.5, 550.1",)


def test_recorded_gpus_round_trip():
    gpus = facts.NvidiaSmi().process(json.loads((HERE / "NvidiaSmi/v100_two_gpus.json").read_text())["output"]).gpus
    record = facts.gpus_record(gpus)
    assert "driver_version" not in record
    read_back = facts.RecordedGpus().process(record.splitlines())
    assert [g.__class__(**{**g.__dict__, "driver_version": ""}) for g in gpus] == list(read_back)

    # a card the record keeps as missing says so, and only it: the listed ones' lines are as before
    gone = dataclasses.replace(gpus[1], missing=True)
    kept = facts.gpus_record((gpus[0], gone))
    assert kept.count('"missing": true') == 1 and '"missing": false' not in kept
    assert [g.missing for g in facts.RecordedGpus().process(kept.splitlines())] == [False, True]


def run_here(command: str) -> list[str]:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True).stdout.splitlines()


def test_commands_run_on_a_real_debian_host(tmp_path):
    """The commands are valid shell and their real output here parses."""
    gcc = facts.GccVersions()
    assert gcc.process(run_here(gcc.command())).default
    assert facts.NvidiaSmi().process(run_here(facts.NvidiaSmi().command())).state in {"missing", "no_module", "ok"}
    for toolkit in facts.CudaToolkits().process(run_here(facts.CudaToolkits().command())):
        assert toolkit.max_gcc and toolkit.version
    free = facts.FreeDiskBytes()
    found = free.process(run_here(free.command(str(tmp_path / "not yet" / "there"))))
    st = os.statvfs(tmp_path)
    assert abs(found - st.f_bavail * st.f_frsize) < 64 << 20  # the disk may move a little in between
    # no dirname on the PATH: the search for an existing parent stops, it does not spin
    r = subprocess.run(["/bin/sh", "-c", free.command(str(tmp_path / "not yet" / "there"))], capture_output=True,
                       text=True, timeout=10, env={"PATH": str(tmp_path / "no-bin")})  # fmt: skip
    assert r.stdout == "" and r.returncode != 0


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_fact_values_serialize_for_pyinfras_cli(path):
    """``pyinfra INVENTORY fact roles.<role>.reads.X`` and ``--json`` print facts with pyinfra's encoder."""
    from pyinfra_cli.util import json_encode

    case = json.loads(path.read_text())
    value = getattr(facts, path.parent.name)().process(case["output"])
    assert json.loads(json.dumps(value, default=json_encode)) == case["fact"]


def test_pyinfra_fact_command_prints_llamarack_facts():
    result = subprocess.run(
        [sys.executable, "-m", "pyinfra", "@local", "fact", "roles.driver.reads.NvidiaSmi",
         "roles.toolchain.reads.GccVersions"],
        capture_output=True, text=True, timeout=300, cwd=HERE.parents[1],
    )  # fmt: skip
    printed = result.stdout + result.stderr
    assert result.returncode == 0, printed
    assert "Cannot serialize" not in printed
    assert '"state":' in printed and '"default":' in printed


def test_active_since_reads_systemds_unix_timestamp():
    served = json.loads((HERE / "UnitState/served.json").read_text())["fact"]
    assert facts.active_since(served) == float(served["ActiveEnterTimestamp"][1:])
    assert facts.active_since(json.loads((HERE / "UnitState/unknown.json").read_text())["fact"]) is None
