"""The wheel is the product: ``pip install llamarack`` (a wheel, not the checkout) gives the
deploy, ``llamarack rollback``, ``llamarack rollout`` and the driver upgrade, each run here
from a fresh venv against this machine (``@local``) as far as changes nothing; and another
pyinfra deploy, outside this repository, imports a role and runs it."""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

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

# A host of this machine, its state under a folder of the test's (the deploys are --dry).
INVENTORY = '''
hosts = [("@local", {{"llamacpp_backend": "cpu", "python_env_backend": "venv", "llamarack_root": {root!r},
                     "llamarack_allow_shared_dirs": True}})]
'''


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Built from a copy: setuptools leaves build/ and *.egg-info in the tree it builds.
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", "build", "*.egg-info", "__pycache__", ".gl", ".whl", ".carry", ".pytest_cache", ".venv"))  # fmt: skip
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp / "dist"), str(src)], check=True, capture_output=True, timeout=300)  # fmt: skip
    (built,) = (tmp / "dist").glob("llamarack-*.whl")
    return built


def test_the_wheel_carries_the_roles_and_the_deploys(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for role in ("preflight", "driver", "toolchain", "python_env", "llamacpp", "model", "server", "gateway"):
        assert f"roles/{role}/__init__.py" in names
    assert {"roles/deploy.py", "roles/driver/upgrade.py", "roles/cli.py", "llamarack/cli.py"} <= names
    assert "roles/server/templates/llama-server.service.j2" in names
    assert {"roles/llamacpp/files/llamacpp_proof.py", "roles/model/files/model_fetch.py"} <= names
    # nothing at the top level but the two packages
    assert {n.split("/")[0] for n in names if "/" in n and ".dist-info/" not in n} == {"llamarack", "roles"}
    # the lab is its own package (lab/): none of it, its fake driver included, in the product's wheel
    assert not [n for n in names if n.startswith(("lab/", "llamarack_lab/", "llamarack/lab/")) or "fake_nvidia" in n]
    top = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("top_level.txt"))).decode()
    assert "llamarack_lab" not in top
    points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "[llamarack.commands]" in points and "rollout = roles.cli:rollout" in points


def test_another_deploy_imports_a_role_from_the_wheel(wheel, tmp_path):
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


def _fresh_venv(wheel: Path, where: Path) -> Path:
    """A new venv with the wheel installed, and no checkout: its dependencies (pyinfra...) are
    this interpreter's, put on its path (a ``.pth`` line), as pip would have installed them."""
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin/python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--ignore-installed",
                    "--no-index", "-q", str(wheel)], check=True, capture_output=True, timeout=300)  # fmt: skip
    return venv


def test_a_fresh_venv_runs_the_deploy_rollback_rollout_and_driver_upgrade_from_the_wheel(wheel, tmp_path):
    venv = _fresh_venv(wheel, tmp_path)
    away = tmp_path / "operator"  # no checkout here, nor on the path
    away.mkdir()
    (away / "inventory.py").write_text(INVENTORY.format(root=str(tmp_path / "root")))
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": "",
           "VIRTUAL_ENV": str(venv)}  # fmt: skip

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(args, cwd=away, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=600)  # fmt: skip

    site = venv / f"lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
    where = run(str(venv / "bin/python"), "-c", "import llamarack, roles; print(llamarack.__file__, roles.__file__)")
    assert where.stdout.split() == [str(site / "llamarack/__init__.py"), str(site / "roles/__init__.py")]

    deploy = run(str(venv / "bin/python"), "-m", "pyinfra", "inventory.py", "roles.deploy.main", "--dry")
    assert deploy.returncode == 0 and "llamarack preflight" in deploy.stdout, deploy.stdout[-3000:]
    # the rollout's stage, by its name: the same preflight (which refuses this machine: no driver)
    stage = run(str(venv / "bin/python"), "-m", "pyinfra", "inventory.py", "roles.deploy.stage", "--dry")
    assert stage.returncode == 0 and "llamarack preflight" in stage.stdout, stage.stdout[-3000:]
    # the rollback reads the host and finds nothing to put back: its refusal, and nothing changed
    rollback = run(str(venv / "bin/llamarack"), "rollback", "inventory.py")
    assert rollback.returncode != 0 and "rollback: no previous unit" in rollback.stdout, rollback.stdout[-3000:]
    rollout = run(str(venv / "bin/llamarack"), "rollout", "inventory.py", "--dry")
    assert rollout.returncode == 0 and "canary:\n  @local" in rollout.stdout, rollout.stdout[-3000:]
    upgrade = run(str(venv / "bin/python"), "-m", "pyinfra", "inventory.py", "roles.driver.upgrade.driver_upgrade",
                  "--dry", "--data", "nvidia_driver_version=580.95.05-1")
    assert upgrade.returncode == 0 and "Reboot onto the new driver" in upgrade.stdout, upgrade.stdout[-3000:]
    assert not (tmp_path / "root").exists()  # nothing was made
