"""Settings that must be refused before any host is touched, and odd ones that must pass.

Each bad value is refused on its own (one problem), in a message that names the
host, the key, the value given and what is allowed.
"""

import pytest

from llamarack.errors import SettingsError
from roles.settings import load_settings

VENV = {"python_env_backend": "venv"}
SHA = "a" * 40

PATH = "an absolute path other than /"
URL = "an http:// or https:// URL of a server"
ADDRESS = "an IP address to listen on"
REPO = "a hub repository id"
REPO_FILE = "a file path inside the repository"
GIT = "a git repository URL"
CHANNEL = "a conda channel name"
ARCH = "a CUDA architecture (50, 52"
LINE = "a single line of text"
REQUIREMENT = "a pip requirement by name and version"

# (key, value, what the message says is allowed)
BAD = [
    # llamarack_root: every host path is built from it, in commands and in the unit
    ("llamarack_root", "/opt/my lr", PATH),
    ("llamarack_root", "/opt/llamarack\n[Service]", LINE),
    ("llamarack_root", "/opt/lr;rm -rf /", PATH),
    ("llamarack_root", "/opt/$(id)", PATH),
    ("llamarack_root", "/opt/`id`", PATH),
    ("llamarack_root", "/opt/../etc", PATH),
    ("llamarack_root", "/opt/lr%h", PATH),
    ("llamarack_root", "/", PATH),
    ("llamarack_root", "/opt/llamarack/", PATH),
    ("llamarack_root", "opt/llamarack", PATH),
    ("llamarack_root", "/opt//lr", PATH),
    ("llamarack_root", "/opt/-rf", PATH),
    ("llamarack_root", "/etc", "a directory llamarack owns alone"),
    ("llamarack_root", "/opt/\u00e9t\u00e9", PATH),
    # the service user
    ("llamarack_service_user", "root", "a user of llama-server's own"),
    ("llamarack_service_user", "nobody", "a user of llama-server's own"),
    ("llamarack_service_user", "Llama Rack", "a system user name"),
    # server_listen
    ("server_listen", "localhost:8080", ADDRESS),
    ("server_listen", "0.0.0.0; id", ADDRESS),
    ("server_listen", "every", ADDRESS),
    ("server_listen", "", ADDRESS),
    ("server_listen", "10.0.0.300", ADDRESS),
    # URLs of servers the hosts download from
    ("python_env_index_url", "https://pypi.org/simple;id", URL),
    ("python_env_index_url", "file:///srv/pypi", URL),
    ("python_env_index_url", "https://pypi.org/simple|sh", URL),
    ("model_hf_endpoint", "https://hf.co/$(id)", URL),
    ("model_hf_endpoint", "hf.co", URL),
    ("model_hf_endpoint", "https://:443/", URL),
    ("model_hf_endpoint", "http://mirror:99999/", URL),
    ("model_hf_endpoint", "https://hf.co/%zz", URL),
    ("model_hf_endpoint", "https://-oProxyCommand=id/", URL),
    ("python_env_conda_installer_url", "https://x.example/`id`.sh", URL),
    ("python_env_conda_installer_url", "file:///tmp/Miniforge3.sh", URL),
    ("python_env_torch_index_url", "http://mirror/ torch", URL),
    ("python_env_torch_index_url", "https://mirror/whl&&id", URL),
    ("python_env_converter_torch_index_url", "ftp://mirror/cpu", URL),
    ("model_url", "file:///etc/shadow", URL),
    ("model_url", "https://x.example/m.gguf'", URL),
    # hub repository, file and patterns
    ("model_repo", "../../etc", REPO),
    ("model_repo", "", REPO),
    ("model_repo", "org/../x", REPO),
    ("model_repo", "org/name/extra", REPO),
    ("model_repo", "-org/x", REPO),
    ("model_file", "../model.gguf", REPO_FILE),
    ("model_file", "/etc/passwd", REPO_FILE),
    ("model_file", "m odel.gguf", REPO_FILE),
    ("model_hf_include", ["../*"], "a shell pattern on the repository's file paths"),
    ("model_hf_include", ["*.json; id"], "a shell pattern on the repository's file paths"),
    # llama.cpp's git URL: never an option or a remote helper
    ("llamacpp_git_url", "--upload-pack=touch /tmp/x", GIT),
    ("llamacpp_git_url", "-u", GIT),
    ("llamacpp_git_url", "ext::sh -c id", GIT),
    ("llamacpp_git_url", "fd::3", GIT),
    ("llamacpp_git_url", "https://github.com/x.git;id", GIT),
    ("llamacpp_git_url", "file:///srv/../etc", GIT),
    ("llamacpp_git_url", "file://host/srv/llama.cpp.git", GIT),
    ("llamacpp_git_url", "relative/llama.cpp", GIT),
    # conda channels
    ("python_env_conda_channels", ["conda-forge;id"], CHANNEL),
    ("python_env_conda_channels", ["$(id)"], CHANNEL),
    ("python_env_conda_channels", ["conda-forge", "-c evil"], CHANNEL),
    ("toolchain_conda_channel", "nvidia label", CHANNEL),
    ("toolchain_conda_channel", "../channel", CHANNEL),
    ("toolchain_conda_channel", "file:///srv/channel", CHANNEL),
    # CUDA architectures
    ("llamacpp_cuda_archs", ["999"], ARCH),
    ("llamacpp_cuda_archs", ["69"], ARCH),
    ("llamacpp_cuda_archs", ["sm_70"], ARCH),
    ("llamacpp_cuda_archs", "70;id", ARCH),
    # other host paths
    ("toolchain_cuda_home", "/usr/local/cuda 11", PATH),
    ("toolchain_cuda_home", "/usr/local/cuda/..", PATH),
    ("llamacpp_ccache_dir", "/var/cache/cc;id", PATH),
    # pip requirements: by name from the index settings, nothing that runs
    ("python_env_numpy_requirement", "numpy @ file:///tmp/numpy.whl", REQUIREMENT),
    ("python_env_autoawq_requirements", ["datasets @ https://x.example/d.whl"], REQUIREMENT),
    ("python_env_converter_overrides", ["torch==2.13.0`id`"], REQUIREMENT),
    # files on the control machine, and text that must be one line
    ("model_hf_token_file", "/home/me/token\n", LINE),
    ("server_api_key_file", "", "a file name on the control machine"),
    ("server_api_key_file", " key", "a file name on the control machine"),
    ("model_quant", "Q4_K_M\n", LINE),
    ("llamacpp_commit", "0c1e570\0", LINE),
    # numbers and lists
    ("server_port", 0, "an integer from 1 to 65535"),
    ("server_gpu_layers", -1, "an integer from 0 to 4096"),
    ("llamacpp_keep_builds", 0, "an integer from 1 to 100"),
    ("server_ctx_size", True, "an integer from 1 to 16777216 or None"),
    ("server_allow_unauthenticated", "yes", "true or false"),
]


@pytest.mark.parametrize("key, value, allowed", BAD, ids=[f"{k}={v!r}" for k, v, _ in BAD])
def test_bad_value_is_refused_naming_host_key_value_and_what_is_allowed(key, value, allowed):
    with pytest.raises(SettingsError) as err:
        load_settings("gpu07", {**VENV, key: value})
    assert err.value.host == "gpu07" and len(err.value.problems) == 1, err.value.problems
    assert str(err.value).startswith("bad settings for host gpu07:")
    assert err.value.problems[0].startswith(f"{key}: given {value!r}; allowed: {allowed}"), err.value.problems


# Refusals that involve the data's shape or more than one setting.
BAD_TOGETHER = [
    ({5: "x"}, "key 5: a host data key is a string"),
    ({("server", "port"): 1}, "key ('server', 'port'): a host data key is a string"),
    ({"llamarack_roles": []}, "llamarack_roles: given []; allowed: at least one role name"),
    ({"server_listen": "0.0.0.0"}, "server_listen: given '0.0.0.0' with no server_api_key_file; allowed: a loopback"),
    ({"server_listen": "::"}, "server_listen: given '::' with no server_api_key_file"),
    ({"server_listen": "10.77.0.11"}, "server_listen: given '10.77.0.11' with no server_api_key_file"),
]


@pytest.mark.parametrize("data, expected", BAD_TOGETHER, ids=[repr(d) for d, _ in BAD_TOGETHER])
def test_bad_data_is_refused_with_one_clear_problem(data, expected):
    with pytest.raises(SettingsError) as err:
        load_settings("gpu07", {**VENV, **data})
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith(expected), err.value.problems


def test_at_least_fifty_kinds_of_bad_input_are_refused():
    assert len(BAD) + len(BAD_TOGETHER) >= 50


GOOD = [
    ("llamarack_root", "/srv/llama.rack-2+x"),
    ("llamarack_root", "/opt/lr"),
    ("llamarack_root", "/var/lib/llamarack"),
    ("llamarack_service_user", "llama_srv-2"),
    ("server_listen", "127.0.0.2"),
    ("server_listen", "::1"),
    ("server_gpu_layers", 0),
    ("python_env_index_url", "https://10.77.0.1:8470/pypi/simple"),
    ("python_env_index_url", "https://mirror.example:8443/pypi/simple/"),
    ("python_env_index_url", "https://[fd00::1]:8470/pypi/simple"),
    ("python_env_index_url", "http://127.0.0.1:8470/pypi/simple"),
    ("model_hf_endpoint", "https://hub.example/path%20with%20escapes?rev=main"),
    ("llamacpp_git_url", "https://10.77.0.1:8470/llama.cpp.git"),
    ("llamacpp_git_url", "git@github.com:ggml-org/llama.cpp.git"),
    ("llamacpp_git_url", "ssh://git@mirror.example:2222/ggml/llama.cpp.git"),
    ("llamacpp_git_url", "/srv/mirrors/llama.cpp.git"),
    ("llamacpp_git_url", "file:///work/wt-x/.carry/llama.cpp.git"),
    ("python_env_conda_channels", ["conda-forge", "nvidia/label/cuda-11.8.0"]),
    ("python_env_conda_channels", ["https://conda.example/channels/nvidia"]),
    ("model_repo", "gpt2"),
    ("model_repo", "Qwen/Qwen2.5-7B-Instruct"),
    ("model_hf_include", ["*.json", "tokenizer/*.model", "model-0000[1-4]-of-00004.safetensors"]),
    ("llamacpp_cuda_archs", ["70-real", "90a", "61"]),
    ("python_env_numpy_requirement", 'numpy<2; python_version < "3.12"'),
    ("model_hf_token_file", "/home/me/my secrets/hub token"),
    ("server_api_key_file", "secrets/llamarack-api-key"),
]


@pytest.mark.parametrize("key, value", GOOD, ids=[f"{k}={v!r}" for k, v in GOOD])
def test_odd_but_valid_value_is_accepted(key, value):
    s = load_settings("gpu07", {**VENV, "model_revision": SHA, key: value})
    role, name = next((r, key[len(r.prefix) + 1:]) for r in (
        s.general, s.driver, s.toolchain, s.python_env, s.llamacpp, s.model, s.server)
        if key.startswith(r.prefix + "_") and hasattr(r, key[len(r.prefix) + 1:]))  # fmt: skip
    assert getattr(role, name) == (tuple(value) if isinstance(value, list) else value)


def test_open_listen_with_a_key_or_an_explicit_opt_in_is_accepted():
    open_with_key = load_settings("gpu07", {**VENV, "server_listen": "0.0.0.0", "server_api_key_file": "k"})
    opted_in = load_settings("gpu07", {**VENV, "server_listen": "10.77.0.11", "server_allow_unauthenticated": True})
    assert (open_with_key.server.listen, opted_in.server.allow_unauthenticated) == ("0.0.0.0", True)


def test_defaults_serve_on_loopback_only():
    assert load_settings("gpu07", VENV).server.listen == "127.0.0.1"


def test_lab_settings_stay_accepted():
    from llamarack_lab import LAB_GROUP_DATA

    s = load_settings("lab-v100-a", LAB_GROUP_DATA)
    assert s.server.listen == "0.0.0.0" and s.server.allow_unauthenticated
