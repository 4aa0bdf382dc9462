"""The `lab` click group, without touching the machine."""

from click.testing import CliRunner

from llamarack_lab.cli import lab


def test_status_without_rack(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMARACK_LAB_DIR", str(tmp_path))
    r = CliRunner().invoke(lab, ["status"])
    assert (r.exit_code, r.output) == (3, "no rack is up\n")


def test_bad_specs_fail_before_doing_anything(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMARACK_LAB_DIR", str(tmp_path / "state"))
    r = CliRunner().invoke(lab, ["up", "--gpus", "a100"])
    assert r.exit_code == 1 and "unknown GPU profile 'a100'" in r.output
    r = CliRunner().invoke(lab, ["up", "--driver-version", "latest"])
    assert r.exit_code == 1 and "not a driver version" in r.output
    assert not (tmp_path / "state").exists()


def test_driver_needs_a_rack(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMARACK_LAB_DIR", str(tmp_path))
    r = CliRunner().invoke(lab, ["driver", "lab-t4", "--version", "570.124.06"])
    assert r.exit_code == 1 and "no lab rack is up" in r.output
    r = CliRunner().invoke(lab, ["driver", "lab-t4"])
    assert r.exit_code == 2


def test_commands():
    assert sorted(lab.commands) == ["down", "driver", "memory", "ssh", "status", "up"]
