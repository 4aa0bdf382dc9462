"""Driver role: the check after a reboot, run for real (the holds are JSON fixtures in tests/operations/)."""


from roles.driver.operations import driver_answers
from tests.roles.stackhost import run_op

def test_check_after_reboot_fails_when_nvidia_smi_still_fails(tmp_path):
    import subprocess

    (command,), _ = run_op(driver_answers, {}, reason="a reboot")
    assert command == ("out=$(nvidia-smi --query-gpu=index,driver_version --format=csv,noheader 2>&1) || "
                       "{ printf '%s\\n' 'gpu01: driver still fails after a reboot:' \"$out\" >&2; exit 1; }")
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'Failed to initialize NVML: Driver/library version mismatch'\nexit 18\n")
    fake.chmod(0o755)
    result = subprocess.run(["sh", "-c", command], env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 1
    assert "gpu01: driver still fails after a reboot:" in result.stderr
    assert "Driver/library version mismatch" in result.stderr
    fake.write_text("#!/bin/sh\necho '0, 550.127.05'\n")
    result = subprocess.run(["sh", "-c", command], env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
                            capture_output=True, text=True)  # fmt: skip
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
