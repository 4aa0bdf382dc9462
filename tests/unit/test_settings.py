"""Settings: defaults reproduce the reference recipe; bad data is refused with a clear message."""

from pathlib import Path

import pytest
from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import _get_group_data

from llamarack.errors import SettingsError
from roles.settings import Settings, all_settings, load_settings
from llamarack.ssh import PARAMIKO_CONNECT_KWARGS
from llamarack.settings_docs import group_data_file, markdown_table

ROOT = Path(__file__).resolve().parents[2]
VENV = {"python_env_backend": "venv"}


def test_defaults_are_the_reference_recipe():
    s = load_settings("gpu01", {"python_env_conda_installer_sha256": "a" * 64})
    assert s.driver.min_version == "520.61.05"
    assert s.toolchain.cuda_version == "11.8"
    assert s.python_env.backend == "conda" and s.python_env.python_version == "3.10"
    assert (s.python_env.torch_version, s.python_env.transformers_version) == ("2.1.2", "4.44.2")
    assert (s.python_env.accelerate_version, s.python_env.autoawq_version) == ("0.33.0", "0.2.7")
    assert s.python_env.torch_index_url.endswith("/cu118")
    assert s.llamacpp.backend == "cuda" and s.llamacpp.cuda_archs is None
    assert s.model.quant == "Q4_K_M"
    # the planner picks the KV types and the layers on the card (roles/server/planner.py)
    assert (s.server.cache_type_k, s.server.cache_type_v) == ("auto", "auto")
    assert s.server.flash_attn and not s.server.mmap and s.server.gpu_layers is None
    assert (s.server.min_ctx_size, s.server.rope_scaling, s.server.rope_scale) == (4096, "none", 1.0)


def test_every_outside_source_is_a_setting():
    keys = {info.key for info in all_settings()}
    for key in (
        "python_env_conda_installer_url",
        "python_env_conda_installer_sha256",
        "python_env_conda_channels",
        "python_env_index_url",
        "python_env_torch_index_url",
        "llamacpp_git_url",
        "model_hf_endpoint",
    ):
        assert key in keys


def test_settings_are_frozen():
    s = load_settings("gpu01", VENV)
    with pytest.raises(Exception):
        s.server.port = 1


def test_values_are_typed_and_lists_become_tuples():
    s = load_settings("gpu01", {**VENV, "llamacpp_cuda_archs": ["70", "75"], "server_ctx_size": 8192})
    assert s.llamacpp.cuda_archs == ("70", "75")
    assert s.server.ctx_size == 8192


def test_foreign_keys_are_left_to_pyinfra_and_the_user():
    s = load_settings("gpu01", {**VENV, "ssh_hostname": "10.0.0.1", "my_rack_label": "b3", "_sudo": True})
    assert s == load_settings("gpu01", VENV)  # loaded, every setting as without the foreign keys
    assert s.general.root == "/opt/llamarack" and s.python_env.backend == "venv"


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"llamacpp_comit": "abc1234"}, "unknown setting 'llamacpp_comit'; did you mean 'llamacpp_commit'?"),
        ({"server_port": "8080"}, "server_port: given '8080'; allowed: an integer"),
        ({"toolchain_cuda_version": 13.0}, """given 13.0; allowed: a string; quote it: toolchain_cuda_version = '13.0' in Python, --data 'toolchain_cuda_version="13.0"'"""),
        ({"server_port": 70000}, "server_port: given 70000; allowed: an integer from 1 to 65535"),
        ({"server_ctx_size": 0}, "server_ctx_size: given 0; allowed: an integer from 1 to 16777216"),
        ({"server_ctx_size": True}, "server_ctx_size: given True; allowed: an integer from 1 to 16777216 or None"),
        ({"server_flash_attn": "yes"}, "server_flash_attn: given 'yes'; allowed: true or false"),
        ({"model_quant": "Q4_K_X"}, "model_quant: given 'Q4_K_X'; allowed: one of 'Q4_0'"),
        ({"server_cache_type_k": "q3"}, "server_cache_type_k: given 'q3'; allowed: one of 'auto', 'f32'"),
        ({"server_gpu_layers": -1}, "server_gpu_layers: given -1; allowed: an integer from 0 to 4096"),
        ({"server_rope_scale": 0.5}, "server_rope_scale: given 0.5; allowed: a number from 1 to 128"),
        ({"server_rope_scale": "2"}, "server_rope_scale: given '2'; allowed: a number from 1 to 128"),
        ({"server_rope_scaling": "ntk"}, "server_rope_scaling: given 'ntk'; allowed: one of 'none', 'yarn'"),
        ({"driver_min_version": "latest"}, "driver_min_version: given 'latest'; allowed: a dotted numeric"),
        ({"python_env_torch_version": "2.1.x"}, "python_env_torch_version: given '2.1.x'; allowed: a PEP 440"),
        ({"python_env_numpy_requirement": "numpy<<2"}, "allowed: a pip requirement"),
        ({"llamacpp_commit": "master"}, "llamacpp_commit: given 'master'; allowed: a commit sha"),
        ({"llamacpp_cuda_archs": ["sm_70"]}, "allowed: a CUDA architecture (50, 52"),
        ({"llamacpp_backend": "rocm"}, "llamacpp_backend: given 'rocm'; allowed: one of 'cuda', 'cpu'"),
        ({"llamarack_root": "opt/llamarack"}, "llamarack_root: given 'opt/llamarack'; allowed: an absolute path other than /"),
        ({"model_hf_endpoint": "hf.co"}, "allowed: an http:// or https:// URL of a server"),
        ({"python_env_backend": "conda"}, "python_env_conda_installer_sha256: given None"),
        ({"server_cache_type_v": "q8_0", "server_flash_attn": False}, "a quantized V cache needs flash attention"),
        ({"model_repo": "org/model"}, "model_revision: given None; allowed: a commit sha of org/model"),
    ],
)
def test_bad_data_names_host_key_value_and_what_is_allowed(data, expected):
    with pytest.raises(SettingsError) as err:
        load_settings("gpu07", {**VENV, **data})
    text = str(err.value)
    assert text.startswith("bad settings for host gpu07:")
    assert expected in text


def test_all_problems_of_a_host_are_reported_together():
    with pytest.raises(SettingsError) as err:
        load_settings("gpu07", {**VENV, "server_port": 0, "llamacpp_keep_builds": -1})
    assert len(err.value.problems) == 2


def test_every_setting_has_a_one_line_doc():
    for info in all_settings():
        assert info.doc and "\n" not in info.doc, info.key


def test_group_data_all_is_generated_from_the_settings():
    path = ROOT / "inventory/group_data/all.py"
    assert path.read_text() == group_data_file(Settings), "run: llamarack settings --group-data > " + str(path)
    # read as pyinfra reads it (imported names are not data)
    with ctx_state.use(State()):
        values = _get_group_data(str(path))["all"]
    # besides the settings, only pyinfra's own connect kwargs (tests/unit/test_ssh.py)
    assert values.pop("ssh_paramiko_connect_kwargs") is PARAMIKO_CONNECT_KWARGS
    assert values == {k: list(v) if isinstance(v, tuple) else v for k, v in ((i.key, i.default) for i in all_settings())}


def test_settings_reference_matches_the_settings():
    page = (ROOT / "docs/settings.md").read_text()
    assert page == markdown_table(Settings), "run: llamarack settings --markdown > docs/settings.md"


def test_roles_subset_from_the_command_line():
    s = load_settings("h", {"python_env_backend": "venv", "llamarack_roles": "server, model"})
    assert s.general.roles == ("server", "model")
    assert s.general.runs("server") and s.general.runs("model") and not s.general.runs("llamacpp")
    assert load_settings("h", {"python_env_backend": "venv"}).general.runs("driver")
    with pytest.raises(SettingsError, match="llamarack_roles: given 'server,modle'; allowed: role names"):
        load_settings("h", {"python_env_backend": "venv", "llamarack_roles": "server,modle"})


def test_a_key_that_looks_like_a_setting_but_is_none_is_warned_about(caplog):
    from llamarack.settings import unknown_keys

    known = {info.key for info in all_settings()}
    assert unknown_keys(["server-port", "llama_root", "ssh_user", "ssh_port", "_sudo", "my_own_thing"], known) == [
        ("server-port", "server_port"), ("llama_root", "llamarack_root")]  # fmt: skip
    with caplog.at_level("WARNING", logger="pyinfra"):
        s = load_settings("gpu07", {"server-port": 9000, "ssh_user": "root", "python_env_backend": "venv"})
        load_settings("gpu07", {"server-port": 9000, "python_env_backend": "venv"})  # once per host and key
    assert s.server.port == 8080  # ignored, as the warning says
    warned = [r.getMessage() for r in caplog.records]
    assert warned == ["gpu07: 'server-port' is no llamarack setting and is ignored; did you mean 'server_port'?"]
