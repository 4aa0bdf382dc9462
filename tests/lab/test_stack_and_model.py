"""The whole deploy.py on one lab host: Python envs, llama.cpp, the model.

The lab serves the outside sources (PyPI index of real wheels, a hub with a
tiny real Llama made locally, the llama.cpp mirror) from the machine; the
host reaches nothing else but apt. Tests run in order and share the host.
"""

from pathlib import Path

import pytest

from llamarack.lab.pytest_plugin import parse_pyinfra_totals
from tests.lab import deploying

pytestmark = pytest.mark.lab

HOST = "lab-v100-b"
OPT = "/opt/llamarack"


def deploy(lab_rack, *data: str):
    return deploying.deploy(lab_rack, HOST, *data)


def sh(lab_rack, command: str, timeout: float = 300) -> str:
    return deploying.sh(lab_rack, HOST, command, timeout=timeout)


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
    # Read back with the gguf package of the converter env: really quantized to Q4_K_M.
    kinds = sh(
        lab_rack,
        f"{OPT}/envs/convert/bin/python -c \"from gguf import GGUFReader, LlamaFileType;"
        f" r = GGUFReader('{gguf}'); ft = int(r.fields['general.file_type'].parts[-1][0]);"
        " print(LlamaFileType(ft).name, *sorted({t.tensor_type.name for t in r.tensors}))\"",
    )
    assert kinds == "MOSTLY_Q4_K_M F32 Q4_K Q6_K"
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


@pytest.fixture
def faulty_hub(tmp_path):
    """A second hub on the lab bridge serving the same tiny model, with faults on demand
    and a token required (it must reach the host in a file, never on a command line)."""
    from llamarack.lab import services
    from llamarack.lab.hub_server import HubServer

    hub = HubServer({services.HUB_REPO: services.prepare_hub()}, token="hf_lab_secret_7f3a", host="10.77.0.1")
    token_file = tmp_path / "token"
    token_file.write_text("hf_lab_secret_7f3a\n")
    token_file.chmod(0o600)
    with hub:
        yield hub, token_file


def _models(lab_rack) -> str:
    return sh(lab_rack, f"readlink {OPT}/models/current; ls {OPT}/models")


def test_interrupted_download_resumes_with_range(lab_rack, faulty_hub):
    hub, token_file = faulty_hub
    sh(lab_rack, f"rm -rf {OPT}/models")  # start the model part afresh: the download must happen
    hub.drop_after("model.safetensors", 1_000_000)
    rc, out = deploy(lab_rack, f"model_hf_endpoint={hub.url}", f"model_hf_token_file={token_file}",
                     "model_quant=Q5_K_M")  # fmt: skip
    assert rc == 0, out[-6000:]
    gets = hub.downloads("model.safetensors")
    assert gets[0].sent == 1_000_000 and gets[-1].range == "bytes=1000000-", gets
    assert all(r.auth == "ok" for r in hub.requests)
    assert "hf_lab_secret_7f3a" not in out
    # Nothing on the host keeps it: the token file went away with the fetch.
    assert sh(lab_rack, f"grep -rl hf_lab_secret_7f3a {OPT} /tmp /root /var/log || true") == ""


def test_wrong_sha256_is_refused_and_nothing_is_switched(lab_rack, faulty_hub):
    hub, token_file = faulty_hub
    before = _models(lab_rack)
    hub.corrupt("model.safetensors")
    rc, out = deploy(lab_rack, f"model_hf_endpoint={hub.url}", f"model_hf_token_file={token_file}",
                     "model_quant=Q8_0")  # fmt: skip
    assert rc != 0
    assert "sha256" in out
    assert _models(lab_rack) == before
