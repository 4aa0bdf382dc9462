"""Python env role: plans and operations (facts in, commands out), then end to end on this machine.

The end-to-end test runs the role through ``pyinfra @local`` with the venv
backend against a local package index of real wheels (tests/support/pypi_index.py),
with a light pin set: torch 2.13.0 (this machine's local CPU wheel) instead of
the reference 2.1.2+cu118, the reference transformers, accelerate and autoawq.
"""

import json
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from pyinfra.facts.files import Directory, File

from tests.support.facts import FACTS as facts
from roles.python_env.reads import PythonEnvPackages, RequirementsFile
from roles.python_env.operations import converter_pins, pip_pins
from roles.python_env.plan import awq_plan, converter_plan, unmet
from llamarack import remote
from roles.settings import load_settings
from tests.roles.stackhost import run_op
from tests.support.cache import llama_cpp_source
from tests.support.ophost import fact_key
from tests.support.pypi_index import PypiIndex, wheelhouse

ROOT = Path(__file__).resolve().parents[2]
FACTS = ROOT / "tests/facts"
ENV = "/opt/llamarack/envs/awq"
LIGHT = {"python_env_backend": "venv", "python_env_python_version": "3.11", "llamacpp_backend": "cpu",
         "python_env_torch_version": "2.13.0"}  # fmt: skip


def env_facts(env):
    """The env fact, and what pyinfra's files.put reads for the constraints file (not there yet)."""
    constraints = f"{ENV}/llamarack-constraints.txt"
    return {fact_key(PythonEnvPackages, env=ENV): env, fact_key(File, path=constraints): None,
            fact_key(Directory, path=constraints): None, fact_key(Directory, path=ENV): {"mode": 755}}  # fmt: skip


def fixture(fact, case):
    return getattr(facts, fact)().process(json.loads((FACTS / f"{fact}/{case}.json").read_text())["output"])


def test_reference_plan_installs_torch_first_then_the_rest_held_then_autoawq_without_deps():
    s = load_settings("gpu01", {"python_env_conda_installer_sha256": "a" * 64})
    plan = awq_plan(s, ENV, ("70",))
    torch, rest, awq = plan.steps
    assert torch.requirements == ("torch==2.1.2",) and torch.index_url.endswith("/whl/cu118")
    assert rest.requirements[:2] == ("transformers==4.44.2", "accelerate==0.33.0") and not rest.no_deps
    assert awq.requirements == ("autoawq==0.2.7",) and awq.no_deps
    assert plan.constraints == ("torch==2.1.2", "numpy<2")
    assert plan.torch_cuda == "11.8" and plan.gpu_archs == ("sm_70",)


def test_converged_env_is_a_no_op_and_local_version_labels_match_the_pin():
    env = fixture("PythonEnvPackages", "awq_venv")
    assert env.packages["torch"] == "2.13.0+cpu"
    plan = awq_plan(load_settings("lab", LIGHT), ENV)
    commands, noops = run_op(pip_pins, env_facts(env), plan=plan)
    assert commands == [] and noops[0].startswith(f"{ENV} already has torch==2.13.0, transformers==4.44.2")


def test_drift_is_named_and_put_back_in_order():
    env = fixture("PythonEnvPackages", "awq_venv")
    drifted = {**env.packages, "numpy": "2.2.6", "transformers": "4.45.0"}
    plan = awq_plan(load_settings("lab", LIGHT), ENV)
    assert unmet(plan, drifted, "3.11.2") == [
        "transformers 4.45.0 installed, wanted ==4.44.2",
        "numpy 2.2.6 installed, held at <2",
    ]
    env = facts.PythonEnv(env.python_version, drifted)
    commands, _ = run_op(pip_pins, env_facts(env), plan=plan)
    check = f"{ENV}/bin/python -c {shlex.quote(remote.source('pyenv_check'))}"
    indexes = f"{ENV}/llamarack-indexes.json"
    shown = shlex.quote(plan.to_json())
    runs = [c for c in commands if c.startswith(check)]
    assert runs[0] == f"{check} resolve {shown} {indexes}"
    assert runs[1:4] == [f"{check} install {shown} {indexes} {n}" for n in range(3)]
    assert runs[4] == f"{check} verify {shown}"
    assert commands.index(f"rm -f -- {indexes}") == commands.index(runs[4]) - 1
    # the steps name their indexes by place: torch's, then the main one
    assert [s["index"] for s in json.loads(plan.to_json())["steps"]] == [[0], [1], [1]]
    assert json.loads(plan.indexes_json()) == ["https://download.pytorch.org/whl/cu118", "https://pypi.org/simple"]


def test_fresh_env_installs_everything():
    plan = awq_plan(load_settings("lab", LIGHT), ENV)
    commands, _ = run_op(pip_pins, env_facts(None), plan=plan)
    check = f"{ENV}/bin/python -c {shlex.quote(remote.source('pyenv_check'))}"
    assert sum(c.startswith(f"{check} install ") for c in commands) == 3


def test_converter_plan_takes_the_file_with_overrides_and_no_index_lines():
    lines = fixture("RequirementsFile", "llamacpp_0c1e57098")
    s = load_settings("lab", {**LIGHT, "python_env_converter_overrides": ["torch==2.13.0"]})
    plan = converter_plan(s, "/e", lines, "3.11.2")
    torch, rest = plan.steps
    assert torch.requirements == ("torch==2.13.0",) and torch.index_url == "https://download.pytorch.org/whl/cpu"
    assert rest.requirements == ("numpy~=2.2.6", "sentencepiece>=0.1.98,<0.3.0", "transformers==4.57.6",
                                 "gguf>=0.1.0", "protobuf>=4.21.0,<5.0.0")  # fmt: skip
    assert plan.constraints == ("torch==2.13.0",)


def test_converter_waits_for_the_source_while_planning():
    s = load_settings("lab", LIGHT)
    commands, _ = run_op(converter_pins, {fact_key(RequirementsFile, path="/src/req.txt"): None}, settings=s,
                         requirements_path="/src/req.txt", env="/e")  # fmt: skip
    assert commands == ["true 'converter env planned once' /src/req.txt exists"]


# --- end to end on this machine --------------------------------------------

LIGHT_SET = ["torch==2.13.0", "transformers==4.44.2", "accelerate==0.33.0", "datasets==3.0.1",
             "pyarrow==17.0.0", "zstandard==0.23.0"]  # fmt: skip


@pytest.fixture(scope="module")
def index():
    houses = [wheelhouse(LIGHT_SET, ["numpy<2"]), wheelhouse(["autoawq==0.2.7"], no_deps=True),
              wheelhouse(["numpy~=2.2.6", "sentencepiece>=0.1.98,<0.3.0", "transformers==4.57.6",
                          "gguf>=0.1.0", "protobuf>=4.21.0,<5.0.0", "torch==2.13.0"])]  # fmt: skip
    server = PypiIndex(houses, "127.0.0.1").start()
    yield server
    server.stop()


def deploy(root, index, *extra):
    data = {**LIGHT, "llamarack_root": str(root), "llamarack_allow_shared_dirs": True, "python_env_index_url": index.url,
            "python_env_torch_index_url": index.url, "python_env_converter_torch_index_url": index.url,
            "python_env_converter_overrides": ["torch==2.13.0"],
            "test_converter_requirements": str(llama_cpp_source() / "requirements/requirements-convert_hf_to_gguf.txt")}  # fmt: skip
    # pyinfra's --data parses values: quote strings that would read as numbers.
    args = [a for k, v in data.items()
            for a in ("--data", f"{k}={json.dumps(v) if not isinstance(v, str) or k.endswith('_version') else v}")]
    result = subprocess.run([sys.executable, "-m", "pyinfra", "-y", "@local", "tests/roles/deploys/python_envs.py",
                             *args, *extra], cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    return result.returncode, result.stdout + result.stderr


def pip_list(python):
    out = subprocess.run([str(python), "-m", "pip", "list", "--format=json"], capture_output=True, text=True).stdout
    return {p["name"].lower(): p["version"] for p in json.loads(out)}


def test_venv_converges_then_changes_nothing_then_repairs_drift(tmp_path, index):
    rc, out = deploy(tmp_path, index)
    assert rc == 0, out
    awq = tmp_path / "envs/awq/bin/python"
    installed = pip_list(awq)
    assert installed["torch"].startswith("2.13.0") and installed["transformers"] == "4.44.2"
    assert installed["autoawq"] == "0.2.7" and installed["numpy"].startswith("1.")
    assert pip_list(tmp_path / "envs/convert/bin/python")["transformers"] == "4.57.6"
    check = subprocess.run([str(awq), "-c", "from awq import AutoAWQForCausalLM; import torch; print(torch.__version__)"],
                           capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stderr

    asked = len(index.requests)
    rc, out = deploy(tmp_path, index)
    assert rc == 0, out
    assert len(index.requests) == asked, "a converged env made pip calls"
    total = [l for l in out.splitlines() if "Grand total" in l][0].split()
    assert total[2:] == ["6", "-", "-", "6"], out

    # Drift: numpy 2 in the AWQ env (torch < 2.3 breaks with it; pyarrow 17 too).
    subprocess.run(f"PIP_CONFIG_FILE=/dev/null {awq} -m pip --isolated install -q --index-url {index.url} numpy==2.2.6",
                   shell=True, check=True, capture_output=True)  # fmt: skip
    rc, out = deploy(tmp_path, index)
    assert rc == 0, out
    assert pip_list(awq)["numpy"] == "1.26.4"


def pyenv_check(command: str, plan: str, indexes: str, tmp_path, *args, python=sys.executable) -> subprocess.CompletedProcess:
    """The host script run here as the role runs it: the index URLs in a file."""
    path = tmp_path / "indexes.json"
    path.write_text(indexes)
    return subprocess.run([str(python), str(ROOT / "roles/python_env/files/pyenv_check.py"), command, plan,
                           str(path), *args], capture_output=True, text=True, timeout=300)  # fmt: skip


class CommandLines:
    """Every process's command line on this machine, sampled every 10 ms while it runs:
    those that hold ``secret``."""

    def __init__(self, secret: str):
        self.secret, self.found, self._stop = secret.encode(), [], threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        while not self._stop.wait(0.01):
            for path in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    line = path.read_bytes()
                except OSError:
                    continue
                if self.secret in line:
                    self.found.append(line.replace(b"\0", b" ").decode(errors="replace"))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def test_a_locked_step_installs_hash_checked_and_its_index_password_is_on_no_command_line(index, tmp_path):
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "env")], check=True, timeout=120)
    python = tmp_path / "env/bin/python"
    wheel = next(n for n in index.files if n.startswith("zstandard-0.23.0-"))
    secret = "s3cr3t-index-pw"
    indexes = json.dumps([index.url.replace("http://", f"http://deploy:{secret}@")])

    def plan(digest: str) -> str:
        step = {"requirements": ["zstandard==0.23.0"], "index": [0], "no_deps": True, "hashes": [[digest]]}
        return json.dumps({"steps": [step], "constraints": []})

    with CommandLines(secret) as control:  # the watch sees a command line that holds it
        subprocess.run(["sh", "-c", "sleep 0.2", secret], check=True)
    assert control.found
    with CommandLines(secret) as seen:
        wrong = pyenv_check("install", plan("sha256:" + "0" * 64), indexes, tmp_path, "0", python=python)
        assert wrong.returncode != 0 and "DO NOT MATCH THE HASHES" in wrong.stdout + wrong.stderr
        assert "zstandard" not in pip_list(python)
        right = pyenv_check("install", plan(f"sha256:{index.sha256(wheel)}"), indexes, tmp_path, "0", python=python)
        assert right.returncode == 0, right.stdout + right.stderr
    assert pip_list(python)["zstandard"] == "0.23.0"
    assert seen.found == [] and secret not in wrong.stdout + wrong.stderr + right.stdout + right.stderr
    assert any("zstandard" in r for r in index.requests)


def test_resolve_check_names_the_autoawq_torch_conflict_of_the_reference_pins(tmp_path):
    # The reference pins as the role would resolve them; PyPI stands in for the cu118 index
    # (same torch 2.1.2 metadata but the CUDA libraries). pip >= 23.1 reads PEP 658
    # metadata, so nothing big is downloaded.
    s = load_settings("gpu01", {"python_env_backend": "venv", "llamacpp_backend": "cpu",
                                "python_env_torch_index_url": "https://pypi.org/simple"})  # fmt: skip
    plan = awq_plan(s, "/nowhere")
    result = pyenv_check("resolve", plan.to_json(), plan.indexes_json(), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "torch 2.1.2" in result.stdout.splitlines()[0]
    assert ("conflict: autoawq 0.2.7 requires torch>=2.5.1; the set has torch 2.1.2 "
            "(autoawq goes in with --no-deps: pip does not follow this)") in result.stdout
    assert "conflict: autoawq 0.2.7 requires intel-extension-for-pytorch>=2.4.0, which is not in the set" in result.stdout


def test_a_set_pip_cannot_resolve_fails_before_anything_is_installed(index, tmp_path):
    # autoawq with its dependencies followed, torch held at 2.13.0 by the constraint:
    # pip's resolver refuses, and the check names the packages that conflict.
    plan = {"steps": [{"requirements": ["autoawq==0.2.7", "transformers==4.44.2"], "index": [0],
                       "no_deps": False}], "constraints": ["torch==2.13.0", "transformers==4.40.0"]}  # fmt: skip
    result = pyenv_check("resolve", json.dumps(plan), json.dumps([index.url]), tmp_path)
    assert result.returncode == 1
    assert "conflict:" in result.stdout and "transformers" in result.stdout, result.stdout
