"""``pip install llamarack`` (a wheel, not the checkout) gives a working deploy: another
pyinfra deploy, outside this repository, imports a role and runs it."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

OTHER_DEPLOY = '''
from pyinfra import host

import llamarack
from roles.preflight.reads import gather
from roles.server.deploy import llama_server
from roles.server.plan import TEMPLATES
from roles.settings import settings_for

print("llamarack from", llamarack.__file__, "templates", TEMPLATES)
settings = settings_for(host)
# The facts preflight reads, without its rules: this machine may have an NVIDIA
# driver package without its module, which preflight rightly refuses.
llama_server(settings, gather(settings))
'''


def test_the_wheel_carries_the_roles_and_another_deploy_runs_one(tmp_path):
    # Built from a copy: setuptools leaves build/ and *.egg-info in the tree it builds.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", "build", "*.egg-info", "__pycache__", ".gl", ".whl", ".carry", ".pytest_cache"))  # fmt: skip
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, capture_output=True, timeout=300)  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("llamarack-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for role in ("preflight", "driver", "toolchain", "python_env", "llamacpp", "model", "server"):
        assert f"roles/{role}/__init__.py" in names
    assert "roles/server/templates/llama-server.service.j2" in names
    assert {"roles/llamacpp/files/llamacpp_proof.py", "roles/model/files/model_fetch.py"} <= names
    # nothing at the top level but the two packages
    assert {n.split("/")[0] for n in names if "/" in n and ".dist-info/" not in n} == {"llamarack", "roles"}
    # the lab is its own package (lab/): none of it, its fake driver included, in the product's wheel
    assert not [n for n in names if n.startswith(("lab/", "llamarack_lab/", "llamarack/lab/")) or "fake_nvidia" in n]
    assert "llamarack_lab" not in zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("top_level.txt"))).decode()

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "serve.py").write_text(OTHER_DEPLOY)
    result = subprocess.run(
        [sys.executable, "-m", "pyinfra", "@local", "serve.py", "--dry",
         "--data", "llamacpp_backend=cpu", "--data", "python_env_backend=venv",
         "--data", f"llamarack_root={tmp_path / 'root'}", "--data", "llamarack_allow_shared_dirs=True"],
        cwd=other, env={**os.environ, "PYTHONPATH": str(site)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    assert f"llamarack from {site}/llamarack/__init__.py templates {site}/roles/server/templates" \
        in result.stdout  # fmt: skip
    assert "llama-server | Service user llamarack" in result.stdout
    assert not (tmp_path / "root").exists()  # --dry: nothing was made
