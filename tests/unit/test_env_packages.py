"""The env listing reads an env's files with the host's python3: it must say what
the env's own interpreter says (its version, its distributions)."""

import json
import subprocess
import sys

from llamarack import remote
from roles.python_env.reads import PythonEnvPackages
from roles.python_env.reads import canonical

OWN_VIEW = ("import importlib.metadata, json, platform; print(json.dumps({'python': platform.python_version(), "
            "'packages': {d.metadata['Name']: d.version for d in importlib.metadata.distributions() "
            "if d.metadata['Name']}}))")  # fmt: skip


def interpreter(env) -> None:
    """The env's bin/python: without one the listing says nothing (no env yet)."""
    (env / "bin").mkdir(parents=True, exist_ok=True)
    (env / "bin/python").symlink_to(sys.executable)


def test_listing_matches_what_the_env_interpreter_sees(tmp_path):
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)  # with pip: one real distribution
    # from tmp_path: "-c" puts the working directory on sys.path (a checkout's egg-info would show)
    own = json.loads(subprocess.run([str(env / "bin/python"), "-c", OWN_VIEW], capture_output=True, text=True,
                                    check=True, cwd=tmp_path).stdout)  # fmt: skip
    out = subprocess.run(PythonEnvPackages().command(env=str(env)), shell=True, capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    fact = PythonEnvPackages().process(out.splitlines())
    assert fact.python_version == own["python"]
    assert fact.packages == {canonical(k): v for k, v in own["packages"].items()}
    assert "pip" in fact.packages


def test_egg_info_is_read_from_its_metadata(tmp_path):
    """An egg-info name may carry a Python tag (``-py3.11``): its PKG-INFO says the version."""
    site = tmp_path / "env/lib/python3.11/site-packages"
    (site / "llamarack_probe-1.2.3-py3.11.egg-info").mkdir(parents=True)
    (site / "llamarack_probe-1.2.3-py3.11.egg-info/PKG-INFO").write_text(
        "Metadata-Version: 2.1\nName: llamarack-probe\nVersion: 1.2.3\n")
    (tmp_path / "env/pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.2\n")
    interpreter(tmp_path / "env")
    out = subprocess.run(remote.command("env_packages", str(tmp_path / "env")), shell=True, capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    assert json.loads(out) == {"python": "3.11.2", "packages": {"llamarack-probe": "1.2.3"}}


def test_a_conda_env_reads_its_python_record(tmp_path):
    """A conda env has no pyvenv.cfg: conda-meta/python-*.json holds its version."""
    env = tmp_path / "conda-env"
    (env / "conda-meta").mkdir(parents=True)
    (env / "conda-meta/python-3.10.14-hd12c33a_0_cpython.json").write_text(json.dumps({"version": "3.10.14"}))
    (env / "lib/python3.10/site-packages/numpy-1.26.4.dist-info").mkdir(parents=True)
    (env / "lib/python3.10/site-packages/numpy-1.26.4.dist-info/METADATA").write_text(
        "Metadata-Version: 2.1\nName: numpy\nVersion: 1.26.4\n")
    interpreter(env)
    out = subprocess.run(remote.command("env_packages", str(env)), shell=True, capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    assert json.loads(out) == {"python": "3.10.14", "packages": {"numpy": "1.26.4"}}


def test_no_interpreter_is_no_env(tmp_path):
    out = subprocess.run(PythonEnvPackages().command(env=str(tmp_path / "none")), shell=True,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert out == ""
