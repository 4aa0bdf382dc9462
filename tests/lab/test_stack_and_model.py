"""The whole deploy.py on one lab host: Python envs, llama.cpp, the model.

The lab serves the outside sources (PyPI index of real wheels, a hub with a
tiny real Llama made locally, the llama.cpp mirror) from the machine; the
host reaches nothing else but apt. Tests run in order and share the host.
"""

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from llamarack import remote
from roles.model.reads import GgufShape, shape_record_name
from llamarack_lab.pytest_plugin import parse_pyinfra_totals
from tests.lab import deploying

pytestmark = pytest.mark.lab

HOST = "lab-v100-b"
OPT = "/opt/llamarack"
URL = "http://10.77.0.12:8080"  # inventory/lab.py's address of HOST
UNIT = "llamarack-server.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"


def http_get(url: str, headers: dict | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def http_post(url: str, body: dict) -> tuple[int, str]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return r.status, r.read().decode()


def server_cmdline(lab_rack) -> list[str]:
    pid = sh(lab_rack, f"systemctl show -p MainPID --value {UNIT}")
    return sh(lab_rack, f"tr '\\0' '\\n' < /proc/{pid}/cmdline").splitlines()


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
    assert parse_pyinfra_totals(out)["error"] == 0, out[-6000:]
    # every role reached its end: a proven build and a sealed model current, the unit active
    # and answering, the deploy recorded; the next run changing nothing is the test below
    ends = (f"test -s {OPT}/builds/current/build-info.json", f"test -s {OPT}/builds/current/manifest.json",
            f"test -s {OPT}/models/current/stamp.json", f"test -s {OPT}/models/current/model.gguf",
            f"test -s {OPT}/state/deployed-by.json", f"systemctl is-active -q {UNIT}")  # fmt: skip
    assert sh(lab_rack, " && ".join(ends) + " && echo ends") == "ends"
    deploying.completes(lab_rack, HOST)


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


def test_model_is_a_q4_k_m_gguf(lab_rack):
    gguf = f"{OPT}/models/current/model.gguf"
    # Read back with the gguf package of the converter env: really quantized to Q4_K_M.
    kinds = sh(
        lab_rack,
        f"{OPT}/envs/convert/bin/python -c \"from gguf import GGUFReader, LlamaFileType;"
        f" r = GGUFReader('{gguf}'); ft = int(r.fields['general.file_type'].parts[-1][0]);"
        " print(LlamaFileType(ft).name, *sorted({t.tensor_type.name for t in r.tensors}))\"",
    )
    assert kinds == "MOSTLY_Q4_K_M F32 Q4_K Q6_K"


def test_the_service_serves_the_model_over_the_network(lab_rack):
    # from this machine, as a client of the rack would
    assert http_get(f"{URL}/health") == (200, '{"status":"ok"}')
    status, reply = http_post(f"{URL}/completion", {"prompt": "hello", "n_predict": 16})
    assert status == 200 and json.loads(reply)["tokens_predicted"] == 16
    # the unit pins the build and model that the current links name, with the flags
    # that build's --help takes; it runs as the service user
    build, model = sh(lab_rack, f"readlink {OPT}/builds/current; readlink {OPT}/models/current").split()
    cmdline = server_cmdline(lab_rack)
    assert cmdline[0] == f"{OPT}/builds/{build}/bin/llama-server"
    assert cmdline[cmdline.index("--model") + 1] == f"{OPT}/models/{model}/model.gguf"
    assert "--load-mode none" in " ".join(cmdline) and "--n-gpu-layers" not in cmdline  # CPU build
    # the tiny model's trained context (2048) is the bound: its KV fits the fake V100 easily
    assert cmdline[cmdline.index("--ctx-size") + 1] == "2048"
    assert sh(lab_rack, f"ps -o user= -p $(systemctl show -p MainPID --value {UNIT})") == "llamarack"
    assert sh(lab_rack, f"systemctl is-enabled {UNIT}") == "enabled"


def test_second_run_changes_nothing_and_calls_neither_pip_nor_apt(lab_rack):
    before = host_state(lab_rack)
    requests_before = _index_requests(lab_rack)
    rc, out = deploy(lab_rack)
    assert rc == 0, out[-6000:]
    assert parse_pyinfra_totals(out)["success"] == 0, out[-6000:]
    assert host_state(lab_rack) == before
    assert _index_requests(lab_rack) == requests_before


def test_the_served_shape_is_answered_from_its_record_and_a_record_missing_is_made_once(lab_rack):
    gguf = f"{OPT}/models/current/model.gguf"
    record = f"{OPT}/models/current/{shape_record_name()}"
    from_header = sh(lab_rack, remote.command(*GgufShape().host_run(gguf, recorded=False)))
    assert sh(lab_rack, GgufShape().command(path=gguf)) == from_header
    recorded = json.loads(sh(lab_rack, remote.argv("cat", record)))
    assert recorded["shape"] == {k: v for k, v in json.loads(from_header).items() if k != "path"}
    # an artifact sealed before shapes were recorded: the next deploy records it, and only that
    # all else as it was: only the record and its directory's mtime change
    artifact_dir = f"{OPT}/models/" + sh(lab_rack, remote.argv("readlink", f"{OPT}/models/current"))
    changing = (f"{artifact_dir}/{shape_record_name()} ", f"{artifact_dir} ")
    others = lambda state: [line for line in state.splitlines() if not line.startswith(changing)]  # noqa: E731
    main_pid = remote.argv("systemctl", "show", "-p", "MainPID", "--value", UNIT)
    before, pid = host_state(lab_rack), sh(lab_rack, main_pid)
    sh(lab_rack, remote.argv("rm", record))
    rc, out = deploy(lab_rack)
    assert rc == 0, out[-6000:]
    assert parse_pyinfra_totals(out)["success"] == 1, out[-6000:]
    assert json.loads(sh(lab_rack, remote.argv("cat", record))) == recorded
    assert others(host_state(lab_rack)) == others(before) and sh(lab_rack, main_pid) == pid  # not restarted
    rc, out = deploy(lab_rack)
    assert rc == 0 and parse_pyinfra_totals(out)["success"] == 0, out[-6000:]


# Nothing listens there: every outside source a deploy may use, out of reach.
UNREACHABLE = "http://127.0.0.1:9"


def test_a_converged_run_contacts_nothing_outside(lab_rack):
    before = host_state(lab_rack)
    rc, out = deploy(lab_rack, f"model_hf_endpoint={UNREACHABLE}", f"llamacpp_git_url={UNREACHABLE}/llama.cpp.git",
                     f"python_env_index_url={UNREACHABLE}/simple", f"python_env_torch_index_url={UNREACHABLE}/simple",
                     f"python_env_converter_torch_index_url={UNREACHABLE}/simple")  # fmt: skip
    assert rc == 0, out[-6000:]
    assert parse_pyinfra_totals(out)["success"] == 0, out[-6000:]
    assert "cannot reach the hub" not in out
    assert host_state(lab_rack) == before


def test_a_new_model_setting_with_the_hub_down_says_so_before_any_change(lab_rack):
    before = host_state(lab_rack)
    rc, out = deploy(lab_rack, f"model_hf_endpoint={UNREACHABLE}", "model_quant=Q8_0")
    assert rc != 0
    assert f"cannot reach the hub at {UNREACHABLE}" in out
    assert host_state(lab_rack) == before


def test_drifted_pin_is_put_back(lab_rack):
    sh(lab_rack, f"PIP_CONFIG_FILE=/dev/null {OPT}/envs/awq/bin/pip install -q --isolated --no-deps"
                 f" --index-url {_index_url()} 'accelerate==0.34.2' || {OPT}/envs/awq/bin/pip uninstall -y -q accelerate")  # fmt: skip
    rc, out = deploy(lab_rack)
    assert rc == 0, out[-6000:]
    assert sh(lab_rack, f"{OPT}/envs/awq/bin/python -c 'import accelerate; print(accelerate.__version__)'") == "0.33.0"


def test_api_key_goes_to_a_file_and_nowhere_else(lab_rack, tmp_path):
    key = "sk-lab-4e1d9c0b7a"
    key_file = tmp_path / "api-key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    rc, out = deploy(lab_rack, f"server_api_key_file={key_file}")
    assert rc == 0, out[-6000:]
    assert http_get(f"{URL}/v1/models")[0] == 401
    assert http_get(f"{URL}/v1/models", {"Authorization": f"Bearer {key}"})[0] == 200
    assert key not in out
    cmdline = server_cmdline(lab_rack)
    assert key not in " ".join(cmdline) and "--api-key-file" in cmdline
    assert sh(lab_rack, "stat -c '%a %U:%G' /etc/llamarack/server-api-key") == "640 root:llamarack"
    leaks = sh(lab_rack, f"grep -rl sk-lab-4e1d /etc/systemd /var/log {OPT} /tmp /root 2>/dev/null || true")
    assert leaks == ""
    # the same key again: nothing to do; no key: the file goes and the API is open again
    rc, out = deploy(lab_rack, f"server_api_key_file={key_file}")
    assert rc == 0 and parse_pyinfra_totals(out)["success"] == 0, out[-6000:]
    rc, out = deploy(lab_rack)
    assert rc == 0, out[-6000:]
    assert http_get(f"{URL}/v1/models")[0] == 200
    assert sh(lab_rack, "ls /etc/llamarack") == ""


def test_a_unit_that_fails_is_rolled_back_and_the_previous_one_serves(lab_rack):
    unit_before = sh(lab_rack, f"sha1sum {UNIT_PATH}")
    rc, out = deploy(lab_rack, "server_listen=10.99.99.99")  # no such address on the host
    assert rc != 0
    assert "couldn't bind HTTP server socket" in out  # the new unit's journal is shown
    assert "rolled back: the previous unit is serving again" in out
    assert sh(lab_rack, f"sha1sum {UNIT_PATH}") == unit_before
    assert http_get(f"{URL}/health")[0] == 200


def test_memory_guard_refuses_before_the_unit_is_touched(lab_rack):
    pid = sh(lab_rack, f"systemctl show -p MainPID --value {UNIT}")
    unit_before = sh(lab_rack, f"sha1sum {UNIT_PATH}")
    rc, out = deploy(lab_rack, "server_memory_reserve_mib=16384")
    assert rc != 0
    # planned at the V100 16 GB's smallest known report, not the 16384 its driver says
    assert f"{HOST}: memory: found 16130 MiB on the card" in out and "Fix: " in out
    assert sh(lab_rack, f"sha1sum {UNIT_PATH}") == unit_before
    assert sh(lab_rack, f"systemctl show -p MainPID --value {UNIT}") == pid  # not restarted


def test_a_new_context_restarts_the_service_with_it(lab_rack):
    # The operator who only changes the context runs only the server role (preflight always runs).
    rc, out = deploy(lab_rack, "server_ctx_size=1024", "llamarack_roles=server")
    assert rc == 0, out[-6000:]
    started = {line.split("|")[0].split(":", 1)[1].strip() for line in out.splitlines()
               if line.startswith("--> Starting operation:")}  # fmt: skip
    # (and the version record, which every run ends with: a no-op once recorded)
    assert started == {"llamarack preflight", "llama-server", "llamarack deployed"}, started
    cmdline = server_cmdline(lab_rack)
    assert cmdline[cmdline.index("--ctx-size") + 1] == "1024"
    assert http_get(f"{URL}/health")[0] == 200
    rc, out = deploy(lab_rack)  # back to the default for the tests that follow
    assert rc == 0, out[-6000:]


def _index_url() -> str:
    from llamarack_lab import LAB_GROUP_DATA

    return LAB_GROUP_DATA["python_env_index_url"]


def _index_requests(lab_rack) -> int:
    """Requests the lab's file server answered for the package index so far."""
    log = Path(lab_rack.rack.state_dir) / "services.log"
    return sum(1 for line in log.read_text(errors="replace").splitlines() if "/pypi/" in line)


@pytest.fixture
def faulty_hub(tmp_path):
    """A second hub on the lab bridge serving the same tiny model, with faults on demand
    and a token required (it must reach the host in a file, never on a command line)."""
    from llamarack_lab import services
    from llamarack_lab.hub_server import HubServer

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
    # Start the model part afresh, the blob cache too: the download must happen.
    sh(lab_rack, f"rm -rf {OPT}/models {OPT}/cache")
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
    sh(lab_rack, f"rm -rf {OPT}/cache")  # else the checkpoint comes from the host's cache, not the hub
    hub.corrupt("model.safetensors")
    rc, out = deploy(lab_rack, f"model_hf_endpoint={hub.url}", f"model_hf_token_file={token_file}",
                     "model_quant=Q8_0")  # fmt: skip
    assert rc != 0
    assert "sha256" in out
    assert _models(lab_rack) == before
