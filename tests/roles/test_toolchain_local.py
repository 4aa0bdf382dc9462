"""The gcc guard against a real CUDA 11.8 toolkit, through pyinfra @local.

This machine is Debian 12: its default gcc is 12, and Debian's non-free
nvidia-cuda-toolkit 11.8 (installed by .ci/run) refuses gcc later than 11
in its crt/host_config.h. The toolchain role must read that header, keep gcc
12 as the default and choose g++-11 for nvcc. The lab cannot show this: its
hosts build for the CPU.
"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gcc_guard_chooses_gcc_11_for_cuda_11_8_beside_default_gcc_12(tmp_path):
    default_gcc = subprocess.run(["gcc", "-dumpfullversion"], capture_output=True, text=True, check=True).stdout
    assert default_gcc.startswith("12."), "this test expects Debian 12's gcc 12 as the default"
    result = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", "@local", "tests/roles/deploys/toolchain_only.py",
         "--data", f"llamarack_root={tmp_path}", "--data", "llamarack_allow_shared_dirs=True", "--data", "llamacpp_backend=cuda",
         "--data", "toolchain_cuda_source=system", "--data", "toolchain_cuda_home=/usr",
         "--data", "python_env_backend=venv"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    plan = json.loads((tmp_path / "toolchain-plan.json").read_text())
    assert plan["cuda_version"] == "11.8" and plan["cuda_home"] == "/usr"
    assert plan["max_gcc"] == 11  # read from /usr/include/crt/host_config.h
    assert plan["gcc_major"] == 11 and plan["install_gcc"] is False  # gcc-11 came with the toolkit
    assert "gcc-11 for nvcc" not in result.stdout
    # The system's default compiler is left alone.
    assert subprocess.run(["gcc", "-dumpfullversion"], capture_output=True, text=True).stdout == default_gcc
