"""Preflight through the real pyinfra CLI on @local (this machine: no GPU, so no working driver).

Depending on what the machine has installed, nvidia-smi is absent or present
without a loaded module; either way a CUDA host is refused by a driver rule.

These show the guard path end to end without the lab; the lab tests show
the same on booted hosts with fake drivers.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pyinfra(*args):
    result = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", "@local", "deploy.py", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return result.returncode, result.stdout + result.stderr


def test_bad_data_stops_before_any_operation():
    rc, out = pyinfra("--data", "llamacpp_comit=abc", "--data", "python_env_backend=venv")
    assert rc != 0
    assert "bad settings for host @local" in out
    assert "unknown setting 'llamacpp_comit'; did you mean 'llamacpp_commit'?" in out
    assert "Beginning operation run" not in out


DRIVER_REFUSALS = (
    "@local: driver-installed: found no nvidia-smi (no NVIDIA driver installed); needed an NVIDIA "
    "driver >= 520.61.05. Fix: install the NVIDIA driver",
    "@local: driver-module-loaded: found the NVIDIA kernel module is not loaded",
    "@local: gpu-on-bus: found no NVIDIA GPU on the PCI bus",  # nvidia-smi without a module, and no card
)


def test_cuda_host_without_driver_is_refused_and_nothing_runs():
    rc, out = pyinfra("--data", "python_env_backend=venv")
    assert rc != 0
    assert any(refusal in out for refusal in DRIVER_REFUSALS), out
    assert "Preflight refused this host" in out
    assert "executed 0 commands" in out


def test_dry_run_shows_the_refusal_without_running_it():
    rc, out = pyinfra("--data", "python_env_backend=venv", "--dry")
    assert any(refusal in out for refusal in DRIVER_REFUSALS), out
    assert "Beginning operation run" not in out
