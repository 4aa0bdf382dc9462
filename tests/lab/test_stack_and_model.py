"""The whole deploy.py on one lab host: Python envs, llama.cpp, the model.

The lab serves the outside sources (PyPI index of real wheels, a hub with a
tiny real Llama made locally, the llama.cpp mirror) from the machine; the
host reaches nothing else but apt. Tests run in order and share the host.
"""

from pathlib import Path

import pytest

from llamarack.lab.pytest_plugin import parse_pyinfra_totals

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
HOST = "lab-v100-b"
OPT = "/opt/llamarack"


def deploy(lab_rack, *data: str):
    args = ["--limit", HOST]
    for item in data:
        args += ["--data", item]
    return lab_rack.run_pyinfra(ROOT / "deploy.py", *args, inventory=ROOT / "inventory/lab.py", timeout=3600)


def sh(lab_rack, command: str, timeout: float = 300) -> str:
    result = lab_rack.ssh(HOST, command, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip()


def host_state(lab_rack) -> str:
    """llamarack's tree, installed packages and apt's own record of runs."""
    return sh(
        lab_rack,
        f"find {OPT} -path '*/__pycache__' -prune -o -printf '%p %s %T@ %l\\n' | sort;"
        " dpkg -l | md5sum; cat /var/log/apt/history.log 2>/dev/null | md5sum",
    )


def test_full_deploy_converges(lab_rack):
    rc, out = deploy(lab_rack)
    assert rc == 0, out[-6000:]


def test_awq_env_has_the_pins_and_imports(lab_rack):
    check = sh(
        lab_rack,
        f"{OPT}/envs/awq/bin/python -c 'import torch, transformers, accelerate, numpy;"
        " from awq import AutoAWQForCausalLM;"
        " print(torch.__version__, transformers.__version__, accelerate.__version__, numpy.__version__)'",
    )
    torch, transformers, accelerate, numpy = check.split()
    assert torch.startswith("2.13.0") and transformers == "4.44.2" and accelerate == "0.33.0"
    assert numpy.startswith("1.")


def test_model_is_a_q4_k_m_gguf_that_the_built_server_serves(lab_rack):
    gguf = f"{OPT}/models/current/model.gguf"
    assert sh(lab_rack, f"head -c 4 {gguf}") == "GGUF"
    # Serve it with the flags the build record says this llama-server takes.
    sh(
        lab_rack,
        f"systemd-run --unit=llamarack-lab-probe {OPT}/builds/current/bin/llama-server -m {gguf}"
        " --load-mode none --port 18080 --host 127.0.0.1",
    )
    try:
        sh(lab_rack, "for i in $(seq 1 100); do curl -sf localhost:18080/health && exit 0; sleep 0.2; done; exit 1")
        reply = sh(lab_rack, "curl -sf localhost:18080/completion -d '{\"prompt\": \"hello\", \"n_predict\": 16}'")
        assert '"tokens_predicted":16' in reply
        props = sh(lab_rack, "curl -sf localhost:18080/props")
        assert "Q4_K" in props or "q4_k" in props.lower() or "model.gguf" in props
    finally:
        lab_rack.ssh(HOST, "systemctl stop llamarack-lab-probe")


def test_second_run_changes_nothing_and_calls_neither_pip_nor_apt(lab_rack):
    before = host_state(lab_rack)
    requests_before = _index_requests(lab_rack)
    rc, out = deploy(lab_rack)
    assert rc == 0, out[-6000:]
    assert parse_pyinfra_totals(out)["success"] == 0, out[-6000:]
    assert host_state(lab_rack) == before
    assert _index_requests(lab_rack) == requests_before


def test_drifted_pin_is_put_back(lab_rack):
    sh(lab_rack, f"PIP_CONFIG_FILE=/dev/null {OPT}/envs/awq/bin/pip install -q --isolated --no-deps"
                 f" --index-url {_index_url()} 'accelerate==0.34.2' || {OPT}/envs/awq/bin/pip uninstall -y -q accelerate")  # fmt: skip
    rc, out = deploy(lab_rack)
    assert rc == 0, out[-6000:]
    assert sh(lab_rack, f"{OPT}/envs/awq/bin/python -c 'import accelerate; print(accelerate.__version__)'") == "0.33.0"


def _index_url() -> str:
    from llamarack.lab import LAB_GROUP_DATA

    return LAB_GROUP_DATA["python_env_index_url"]


def _index_requests(lab_rack) -> int:
    """Requests the lab's file server answered for the package index so far."""
    log = Path(lab_rack.rack.state_dir) / "services.log"
    return sum(1 for line in log.read_text(errors="replace").splitlines() if "/pypi/" in line)
