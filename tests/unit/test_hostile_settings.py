"""Hostile settings: each is refused before any host is touched, with a message that
names the key, the value and what is allowed; the host-side check of who may write
where root runs refuses a host by name, path, owner and mode."""

import dataclasses
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from pyinfra_cli.util import parse_cli_arg

from llamarack.cli import main
from llamarack.errors import SettingsError
from llamarack.facts.ownership import PathOwners
from roles.preflight.reads import preflight_reads
from roles.preflight.facts import HostFacts
from roles.preflight.rules import evaluate, rule_dirs_private
from roles.driver.reads import DriverState
from roles.settings import all_settings, load_settings, private_dirs
from llamarack.settings import describe_type

VENV = {"python_env_backend": "venv"}
FACTS = Path(__file__).resolve().parents[1] / "facts/PathOwners"

URL = "an http:// or https:// URL of a server"
ASCII_URL = "an http:// or https:// URL of ASCII characters only"
USERINFO = "an http:// or https:// URL with nothing before its host: user@ or user:pass@ there is refused"
GIT = "a git repository URL"
ADDRESS = "an IP address to listen on"
HTTP = "an https:// URL: plain http:// can be read and changed by anyone on the way"
PLAIN_GIT = ("an https:// or ssh:// URL: git:// is as plain as http://, so anyone on the way can hand over other "
             "code, and a short llamacpp_commit prefix pins little against that")
SHARED = "a directory other users cannot write to"
OWN = "a directory llamarack owns alone"


def refusal(data: dict) -> str:
    """The one problem ``data`` is refused with."""
    with pytest.raises(SettingsError) as err:
        load_settings("gpu07", {**VENV, **data})
    assert str(err.value).startswith("bad settings for host gpu07:")
    assert len(err.value.problems) == 1, err.value.problems
    return err.value.problems[0]


# (data, the start of the one problem: key, value and what is allowed)
HOSTILE = [
    # numbers the planner would crash on, from Python and from pyinfra's --data (json: NaN, Infinity)
    ({"server_rope_scaling": "yarn", "server_rope_scale": math.nan}, "server_rope_scale: given nan; allowed: a number from 1 to 128"),
    ({"server_rope_scaling": "yarn", "server_rope_scale": parse_cli_arg("NaN")}, "server_rope_scale: given nan; allowed: a number from 1 to 128"),
    ({"server_rope_scaling": "yarn", "server_rope_scale": math.inf}, "server_rope_scale: given inf; allowed: a number from 1 to 128"),
    ({"server_rope_scaling": "yarn", "server_rope_scale": parse_cli_arg("Infinity")}, "server_rope_scale: given inf; allowed: a number from 1 to 128"),
    ({"server_rope_scaling": "yarn", "server_rope_scale": 1e308}, "server_rope_scale: given 1e+308; allowed: a number from 1 to 128"),
    ({"server_rope_scale": -math.inf}, "server_rope_scale: given -inf; allowed: a number from 1 to 128"),
    # absurd numbers
    ({"llamacpp_build_jobs": 1000000}, "llamacpp_build_jobs: given 1000000; allowed: an integer from 1 to 1024"),
    ({"model_fetch_retries": 10**9}, "model_fetch_retries: given 1000000000; allowed: an integer from 1 to 100"),
    ({"server_ctx_size": 10**30}, f"server_ctx_size: given {10**30}; allowed: an integer from 1 to 16777216"),
    ({"server_parallel": 10**9}, "server_parallel: given 1000000000; allowed: an integer from 1 to 1024"),
    ({"server_health_timeout": 10**20}, f"server_health_timeout: given {10**20}; allowed: an integer from 1 to 86400"),
    ({"server_port": 65536}, "server_port: given 65536; allowed: an integer from 1 to 65535"),
    ({"server_memory_reserve_mib": 2**40}, f"server_memory_reserve_mib: given {2**40}; allowed: an integer from 1 to 262144"),
    ({"server_gpu_layers": 10**7}, "server_gpu_layers: given 10000000; allowed: an integer from 0 to 4096"),
    ({"toolchain_apt_cache_time": 10**12}, f"toolchain_apt_cache_time: given {10**12}; allowed: an integer from 1 to 2678400"),
    ({"server_draft_max": 10**6}, "server_draft_max: given 1000000; allowed: an integer from 1 to 1024"),
    # credentials before the host: the token would go to evil.example
    ({"model_hf_endpoint": "https://huggingface.co@evil.example"}, f"model_hf_endpoint: given 'https://huggingface.co@evil.example'; allowed: {USERINFO}"),
    ({"model_hf_endpoint": "https://user:pass@hub.example"}, f"model_hf_endpoint: given 'https://user:pass@hub.example'; allowed: {USERINFO}"),
    ({"python_env_index_url": "https://user:secret@pypi.example/simple"}, f"python_env_index_url: given 'https://user:secret@pypi.example/simple'; allowed: {USERINFO}"),
    ({"python_env_torch_index_url": "https://tok@download.example/whl"}, "python_env_torch_index_url: given 'https://tok@download.example/whl'; allowed: " + USERINFO),
    ({"python_env_conda_installer_url": "https://u:p@github.com/x.sh"}, f"python_env_conda_installer_url: given 'https://u:p@github.com/x.sh'; allowed: {USERINFO}"),
    ({"python_env_conda_channels": ["https://u:p@conda.example/c"]}, "python_env_conda_channels: given ['https://u:p@conda.example/c']; allowed: " + USERINFO),
    ({"model_url": "https://u:p@files.example/m.gguf"}, f"model_url: given 'https://u:p@files.example/m.gguf'; allowed: {USERINFO}"),
    # a character no request line carries: the host's fetcher would die on it
    ({"model_url": "https://files.example/mod\u00e8le.gguf"}, "model_url: given 'https://files.example/mod\u00e8le.gguf'; allowed: " + ASCII_URL + " ('\u00e8' is not): a path's characters percent-encoded as UTF-8 (%C3%A8), a host name in its xn-- form"),
    ({"model_url": "https://files.example/m.gguf?x=\u200b"}, "model_url: given 'https://files.example/m.gguf?x=\\u200b'; allowed: " + ASCII_URL + " ('\\u200b' is not)"),
    ({"model_hf_endpoint": "https://b\u00fccher.example"}, "model_hf_endpoint: given 'https://b\u00fccher.example'; allowed: " + ASCII_URL),
    ({"python_env_index_url": "https://pypi.example/simple/\u00e9"}, "python_env_index_url: given 'https://pypi.example/simple/\u00e9'; allowed: " + ASCII_URL),
    ({"llamacpp_git_url": "https://user:pass@github.com/ggml-org/llama.cpp.git"}, f"llamacpp_git_url: given 'https://user:pass@github.com/ggml-org/llama.cpp.git'; allowed: {GIT}"),
    ({"llamacpp_git_url": "ssh://git:secret@mirror.example/llama.cpp.git"}, f"llamacpp_git_url: given 'ssh://git:secret@mirror.example/llama.cpp.git'; allowed: {GIT}"),
    # an option where the host belongs (ssh -oProxyCommand=...)
    ({"llamacpp_git_url": "a@-oProxyCommand:x"}, f"llamacpp_git_url: given 'a@-oProxyCommand:x'; allowed: {GIT}"),
    ({"llamacpp_git_url": "ssh://-oProxyCommand/x"}, f"llamacpp_git_url: given 'ssh://-oProxyCommand/x'; allowed: {GIT}"),
    ({"llamacpp_git_url": "ssh://git@-oProxyCommand=x/y"}, f"llamacpp_git_url: given 'ssh://git@-oProxyCommand=x/y'; allowed: {GIT}"),
    ({"llamacpp_git_url": "git://-oProxyCommand/x"}, f"llamacpp_git_url: given 'git://-oProxyCommand/x'; allowed: {GIT}"),
    ({"model_hf_endpoint": "https://a.-b.example/"}, f"model_hf_endpoint: given 'https://a.-b.example/'; allowed: {URL}"),
    ({"model_hf_endpoint": "https://[fe80::1%25eth0]/"}, f"model_hf_endpoint: given 'https://[fe80::1%25eth0]/'; allowed: {URL}"),
    ({"model_hf_endpoint": "https://" + "a" * 2100 + ".example"}, "model_hf_endpoint: given 'https://" + "a" * 191 + "... (2118 characters in all); allowed: an http:// or https:// URL of at most 2048 characters"),
    # plain http where a token, or code run as root, travels
    ({"model_hf_endpoint": "http://hub.example", "model_hf_token_file": "secrets/hub"}, f"model_hf_endpoint: given 'http://hub.example'; allowed: {HTTP}, and the hub token (model_hf_token_file) would travel in clear"),
    ({"model_hf_endpoint": "http://hub.example"}, f"model_hf_endpoint: given 'http://hub.example'; allowed: {HTTP} (llamarack_trusted_network = True"),
    ({"python_env_index_url": "http://pypi.example/simple"}, f"python_env_index_url: given 'http://pypi.example/simple'; allowed: {HTTP}"),
    ({"python_env_converter_torch_index_url": "http://10.0.0.5/whl"}, f"python_env_converter_torch_index_url: given 'http://10.0.0.5/whl'; allowed: {HTTP}"),
    ({"python_env_conda_channels": ["conda-forge", "http://conda.example/c"]}, f"python_env_conda_channels: given 'http://conda.example/c'; allowed: {HTTP}"),
    ({"toolchain_conda_channel": "http://conda.example/nvidia"}, f"toolchain_conda_channel: given 'http://conda.example/nvidia'; allowed: {HTTP}"),
    ({"llamacpp_git_url": "http://git.example/llama.cpp.git"}, f"llamacpp_git_url: given 'http://git.example/llama.cpp.git'; allowed: {HTTP}"),
    ({"model_source": "url", "model_url": "http://files.example/m.gguf", "model_sha256": "a" * 64}, f"model_url: given 'http://files.example/m.gguf'; allowed: {HTTP}"),
    # git:// is as plain as http://: whoever is on the way hands over the code root builds
    ({"llamacpp_git_url": "git://mirror.example/llama.cpp.git"}, f"llamacpp_git_url: given 'git://mirror.example/llama.cpp.git'; allowed: {PLAIN_GIT}"),
    ({"llamacpp_git_url": "git://10.0.0.5:9418/llama.cpp.git"}, f"llamacpp_git_url: given 'git://10.0.0.5:9418/llama.cpp.git'; allowed: {PLAIN_GIT}"),
    # listen addresses: a %scope is no part of an address
    ({"server_listen": "::1%$(id)"}, f"server_listen: given '::1%$(id)'; allowed: {ADDRESS}"),
    ({"server_listen": "fe80::1%eth0"}, f"server_listen: given 'fe80::1%eth0'; allowed: {ADDRESS}"),
    ({"server_listen": "-oProxyCommand"}, f"server_listen: given '-oProxyCommand'; allowed: {ADDRESS}"),
    # lengths
    ({"llamarack_root": "/" + "a" * 100_000}, "llamarack_root: given '/" + "a" * 198 + "... (100003 characters in all); allowed: a text of at most 4096 characters (given 100001)"),
    ({"llamarack_root": "/opt/" + "a" * 300}, "llamarack_root: given '/opt/" + "a" * 194 + "... (307 characters in all); allowed: an absolute path of at most 1024 characters, each name at most 255"),
    ({"llamarack_root": "/opt" + "/abc" * 300}, "llamarack_root: given '/opt" + ("/abc" * 300)[:195] + "... (1206 characters in all); allowed: an absolute path of at most 1024 characters"),
    ({"model_hf_token_file": "t" * 5000}, "model_hf_token_file: given '" + "t" * 199 + "... (5002 characters in all); allowed: a text of at most 4096 characters"),
    ({"model_hf_include": ["*.json"] * 300}, f"model_hf_include: given {repr(['*.json'] * 300)[:200]}... (3000 characters in all); allowed: a list of at most 256 items (given 300)"),
    # the system's own directories
    ({"llamarack_root": "/etc/cron.d"}, f"llamarack_root: given '/etc/cron.d'; allowed: {OWN}, e.g. /opt/llamarack (not /etc/cron.d: the system runs or reads what is under /etc)"),
    ({"llamarack_root": "/usr/local"}, f"llamarack_root: given '/usr/local'; allowed: {OWN}, e.g. /opt/llamarack (not /usr/local: the system runs or reads what is under /usr)"),
    ({"llamarack_root": "/usr/local/bin/lr"}, f"llamarack_root: given '/usr/local/bin/lr'; allowed: {OWN}"),
    ({"llamarack_root": "/etc"}, f"llamarack_root: given '/etc'; allowed: {OWN}"),
    ({"llamarack_root": "/usr"}, f"llamarack_root: given '/usr'; allowed: {OWN}"),
    ({"llamarack_root": "/bin"}, f"llamarack_root: given '/bin'; allowed: {OWN}"),
    ({"llamarack_root": "/var/spool/cron"}, f"llamarack_root: given '/var/spool/cron'; allowed: {OWN}"),
    ({"llamarack_root": "/lib/systemd/system"}, f"llamarack_root: given '/lib/systemd/system'; allowed: {OWN}"),
    ({"llamarack_root": "/opt"}, f"llamarack_root: given '/opt'; allowed: {OWN}, e.g. /opt/llamarack (not /opt: the system's)"),
    ({"llamarack_root": "/"}, "llamarack_root: given '/'; allowed: an absolute path other than /"),
    # directories other users can write to
    ({"llamarack_root": "/tmp/llamarack"}, f"llamarack_root: given '/tmp/llamarack'; allowed: {SHARED} (/tmp is a directory every user can write to"),
    ({"llamarack_root": "/var/tmp"}, f"llamarack_root: given '/var/tmp'; allowed: {OWN}"),
    ({"llamarack_root": "/var/tmp/lr"}, f"llamarack_root: given '/var/tmp/lr'; allowed: {SHARED} (/var/tmp is a directory every user can write to"),
    ({"llamarack_root": "/dev/shm/lr"}, f"llamarack_root: given '/dev/shm/lr'; allowed: {OWN}"),
    ({"llamarack_root": "/run/lock/lr"}, f"llamarack_root: given '/run/lock/lr'; allowed: {OWN}"),
    ({"llamarack_root": "/home/alice"}, f"llamarack_root: given '/home/alice'; allowed: {SHARED} (/home is users' homes"),
    ({"llamarack_root": "/home/alice/llamarack"}, f"llamarack_root: given '/home/alice/llamarack'; allowed: {SHARED} (/home is users' homes"),
    ({"toolchain_cuda_home": "/tmp/cuda"}, f"toolchain_cuda_home: given '/tmp/cuda'; allowed: {SHARED} (/tmp is"),
    ({"toolchain_cuda_home": "/home/alice/cuda-11.8"}, f"toolchain_cuda_home: given '/home/alice/cuda-11.8'; allowed: {SHARED}"),
    ({"llamacpp_ccache_dir": "/tmp/ccache"}, f"llamacpp_ccache_dir: given '/tmp/ccache'; allowed: {SHARED} (/tmp is"),
    ({"llamacpp_ccache_dir": "/var/tmp/ccache"}, f"llamacpp_ccache_dir: given '/var/tmp/ccache'; allowed: {SHARED}"),
    # a local repository root builds from, where another user can swap its files
    ({"llamacpp_git_url": "/tmp/llama.cpp"}, f"llamacpp_git_url: given '/tmp/llama.cpp'; allowed: {SHARED} (/tmp is a directory every user can write to"),
    ({"llamacpp_git_url": "file:///var/tmp/llama.cpp.git/"}, f"llamacpp_git_url: given 'file:///var/tmp/llama.cpp.git/'; allowed: {SHARED} (/var/tmp is"),
    ({"llamacpp_git_url": "/home/alice/llama.cpp"}, f"llamacpp_git_url: given '/home/alice/llama.cpp'; allowed: {SHARED} (/home is users' homes"),
]  # fmt: skip


@pytest.mark.parametrize("data, expected", HOSTILE, ids=[repr(d)[:80] for d, _ in HOSTILE])
def test_hostile_setting_is_refused_before_any_host_is_touched(data, expected):
    assert refusal(data).startswith(expected)


def test_the_shared_dir_refusal_says_why_and_what_to_do():
    message = refusal({"llamarack_root": "/tmp/llamarack"})
    assert "a local user could put files there" in message and "e.g. under /opt or /srv" in message
    assert "llamarack_allow_shared_dirs = True only on a throwaway test host" in message


@pytest.mark.parametrize("info", [i for i in all_settings() if i.between], ids=lambda i: i.key)
def test_every_number_has_a_range_and_just_past_it_is_refused(info):
    low, high = info.between
    integer = describe_type(info).startswith("an integer")
    past = high + 1 if integer else high * 2
    problem = refusal({info.key: past})
    assert problem.startswith(f"{info.key}: given {past!r}; allowed: {'an integer' if integer else 'a number'} from ")
    room = {"server_draft_max": high} if info.key == "server_draft_min" else {}  # at most server_draft_max
    if info.key == "model_quality_max_kld":  # a bound on what is measured
        room = {"model_quality": True}
    assert load_settings("gpu07", {**VENV, **room, info.key: high}) and load_settings("gpu07", {**VENV, **room, info.key: low})


def test_every_number_declares_its_range():
    numbers = [i for i in all_settings() if describe_type(i).startswith(("an integer", "a number"))]
    assert numbers and all(i.between for i in numbers), [i.key for i in numbers if not i.between]


# Accepted on purpose: what a rack (or a closed lab, a test host) needs.
TRUSTED = {"llamarack_trusted_network": True}
SHARED_OK = {"llamarack_allow_shared_dirs": True}
ACCEPTED = [
    {"model_hf_endpoint": "http://127.0.0.1:8471", "model_hf_token_file": "secrets/hub"},  # loopback
    {"model_hf_endpoint": "http://localhost:8471"},
    {"python_env_index_url": "http://[::1]:8470/simple"},
    {**TRUSTED, "model_hf_endpoint": "http://10.77.0.1:8471", "model_hf_token_file": "secrets/hub"},
    {**TRUSTED, "llamacpp_git_url": "http://10.77.0.1:8470/llama.cpp.git",
     "python_env_index_url": "http://10.77.0.1:8470/pypi/simple", "python_env_conda_channels": ["http://10.77.0.1/c"]},
    {"llamacpp_git_url": "git@github.com:ggml-org/llama.cpp.git"},  # an ssh login name is no secret
    {"llamacpp_git_url": "ssh://git@mirror.example:2222/ggml/llama.cpp.git"},
    {**TRUSTED, "llamacpp_git_url": "git://mirror.example/llama.cpp.git"},
    {"llamacpp_git_url": "git://127.0.0.1:9418/llama.cpp.git"},  # loopback
    {"llamacpp_git_url": "/srv/mirror/llama.cpp.git"},  # a local mirror; preflight checks who may write to it
    {"llamacpp_git_url": "file:///srv/mirror/llama.cpp.git"},
    {**SHARED_OK, "llamacpp_git_url": "/tmp/llama.cpp"},
    {"server_listen": "fd00::5", "server_allow_unauthenticated": True},
    {"server_rope_scaling": "yarn", "server_rope_scale": 4},
    {"llamarack_root": "/var/lib/llamarack", "llamacpp_ccache_dir": "/var/cache/llamarack-ccache",
     "toolchain_cuda_home": "/usr/local/cuda-11.8"},
    {"llamarack_root": "/usr-data/llamarack"},  # only /usr itself and under it are the system's
    {**SHARED_OK, "llamarack_root": "/tmp/pytest-of-root/pytest-7/test_x0/root", "llamacpp_ccache_dir": "/tmp/cc"},
    {**SHARED_OK, "toolchain_cuda_home": "/home/ops/cuda-11.8"},
]


@pytest.mark.parametrize("data", ACCEPTED, ids=lambda d: repr(d)[:80])
def test_what_a_rack_needs_is_accepted(data):
    s = load_settings("gpu07", {**VENV, **data})
    sections = {type(getattr(s, f.name)): getattr(s, f.name) for f in dataclasses.fields(s) if f.name != "host"}
    held = {i.key: getattr(sections[i.role], i.name) for i in all_settings() if i.key in data}
    assert held == {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}  # each as given


# --- misspelled keys: warned about, with the setting they look like --------------


@pytest.mark.parametrize("key, like", [("server-port", "server_port"), ("SERVER_PORT", "server_port"),
                                       ("serverport", "server_port"), ("llama_root", "llamarack_root"),
                                       ("Llamarack-Trusted-Network", "llamarack_trusted_network")])  # fmt: skip
def test_a_misspelled_key_is_warned_about_with_a_did_you_mean(key, like, caplog):
    with caplog.at_level("WARNING", logger="pyinfra"):
        load_settings(f"gpu-{key}", {**VENV, key: 9000})
    assert [r.getMessage() for r in caplog.records] == [
        f"gpu-{key}: {key!r} is no llamarack setting and is ignored; did you mean {like!r}?"]


def test_a_misspelled_key_with_a_role_prefix_is_refused():
    assert refusal({"server_prot": 9000}) == "unknown setting 'server_prot'; did you mean 'server_port'?"


# --- on the host: who may write where root runs and builds -----------------------


def owners(case: str, deployer=None):
    fact = PathOwners().process(json.loads((FACTS / f"{case}.json").read_text())["output"])
    return fact if deployer is None else dataclasses.replace(fact, deployer_uid=deployer)


def host_facts(path_owners) -> HostFacts:
    return HostFacts(driver=DriverState("ok"), module=None, path_owners=path_owners)


def with_paths(**general):
    """Settings whose paths only the host can judge (the loader refuses them unless shared dirs are
    allowed; the rule is what a host that passes the loader meets)."""
    s = load_settings("gpu07", {**VENV, "llamacpp_backend": "cpu"})
    return dataclasses.replace(s, general=dataclasses.replace(s.general, **general))


def test_a_fresh_host_with_root_owned_parents_passes():
    s = load_settings("gpu07", {**VENV, "llamacpp_backend": "cpu", "llamacpp_ccache_dir": "/var/cache/llamarack/ccache"})
    assert rule_dirs_private(s, host_facts(owners("fresh-host"))) is None


def test_a_root_made_first_by_another_user_under_tmp_refuses_the_host():
    failure = rule_dirs_private(with_paths(root="/tmp/llamarack"), host_facts(owners("tmp-made-by-another-user")))
    message = failure.message("gpu07")
    assert message.startswith(
        "gpu07: dirs-private: found llamarack_root /tmp/llamarack: /tmp/llamarack owned by cloudsdk (uid 1000), "
        "mode 755, /tmp owned by root (uid 0), mode 1777; needed each of them and every directory above it owned "
        "by root and writable by no group or other user (a sticky /tmp counts")
    assert message.endswith("Fix: set llamarack_root to a directory only root can write to (under /opt or /srv)")


def test_a_link_is_judged_where_it_leads():
    failure = rule_dirs_private(with_paths(root="/opt/lr-link"), host_facts(owners("link-into-var-tmp")))
    assert failure.found == ("llamarack_root /opt/lr-link (a link to /var/tmp/lr-target): "
                             "/var/tmp owned by root (uid 0), mode 1777")


def test_the_deploying_users_own_directory_passes_another_users_does_not():
    s = with_paths(root="/home/cloudsdk/llamarack")
    assert rule_dirs_private(s, host_facts(owners("home-through-sudo"))) is None  # sudo from cloudsdk
    failure = rule_dirs_private(s, host_facts(owners("home-through-sudo", deployer=0)))
    assert failure.found == ("llamarack_root /home/cloudsdk/llamarack: /home/cloudsdk/llamarack owned by cloudsdk "
                             "(uid 1000), mode 755, /home/cloudsdk owned by cloudsdk (uid 1000), mode 755")
    # the home above is its user's: moving the root is the fix, not a chown of the home
    assert failure.fix == "set llamarack_root to a directory only root can write to (under /opt or /srv)"


def test_a_group_writable_directory_is_refused_and_the_fix_names_it():
    fact = owners("fresh-host")
    chain = fact.paths[1]
    loose = dataclasses.replace(chain, dirs=(dataclasses.replace(chain.dirs[0], mode="2775"),) + chain.dirs[1:])
    s = load_settings("gpu07", {**VENV, "llamacpp_backend": "cpu", "llamacpp_ccache_dir": "/var/cache/llamarack/ccache"})
    failure = evaluate(s, host_facts(dataclasses.replace(fact, paths=(fact.paths[0], loose))))[0]
    assert failure.rule == "dirs-private"
    assert failure.found == "llamacpp_ccache_dir /var/cache/llamarack/ccache: /var/cache/llamarack/ccache owned by root (uid 0), mode 2775"
    assert failure.fix.endswith("or chown root:root /var/cache/llamarack/ccache and chmod go-w /var/cache/llamarack/ccache")


def test_a_local_git_mirror_another_user_owns_refuses_the_host():
    s = load_settings("gpu07", {**VENV, "llamacpp_backend": "cpu", "llamacpp_git_url": "/srv/mirror/llama.cpp.git"})
    assert ("llamacpp_git_url", "/srv/mirror/llama.cpp.git") in private_dirs(s)
    read = [r for r in preflight_reads(s) if r.fact is PathOwners]
    assert [dict(r.kwargs) for r in read] == [{"paths": ("/opt/llamarack", "/srv/mirror/llama.cpp.git")}]
    message = rule_dirs_private(s, host_facts(owners("git-mirror-of-another-user"))).message("gpu07")
    assert message.startswith(
        "gpu07: dirs-private: found llamacpp_git_url /srv/mirror/llama.cpp.git: /srv/mirror/llama.cpp.git owned "
        "by cloudsdk (uid 1000), mode 755; needed each of them and every directory above it owned by root")
    assert message.endswith("Fix: set llamacpp_git_url to a directory only root can write to (under /opt or /srv), "
                            "or chown root:root /srv/mirror/llama.cpp.git and chmod go-w /srv/mirror/llama.cpp.git")
    # a file:// URL names the same directory; a remote URL names none
    url = load_settings("gpu07", {**VENV, "llamacpp_git_url": "file:///srv/mirror/llama.cpp.git/"})
    assert ("llamacpp_git_url", "/srv/mirror/llama.cpp.git") in private_dirs(url)
    assert "llamacpp_git_url" not in dict(private_dirs(load_settings("gpu07", VENV)))


def test_preflight_reads_every_private_dir_and_none_when_shared_dirs_are_allowed():
    s = load_settings("gpu07", {**VENV, "llamacpp_ccache_dir": "/srv/ccache", "toolchain_cuda_home": "/usr/local/cuda-11.8"})
    read = [r for r in preflight_reads(s) if r.fact is PathOwners]
    assert [dict(r.kwargs) for r in read] == [{"paths": ("/opt/llamarack", "/usr/local/cuda-11.8", "/srv/ccache")}]
    shared = load_settings("gpu07", {**VENV, **SHARED_OK, "llamarack_root": "/tmp/lr"})
    assert not [r for r in preflight_reads(shared) if r.fact is PathOwners]
    assert rule_dirs_private(shared, host_facts(owners("tmp-made-by-another-user"))) is None


# --- llamarack plan: where the hub token goes ---------------------------------------


def test_plan_names_the_host_the_hub_token_goes_to(tmp_path):
    from tests.support.hub_server import HubServer

    tiny = Path(__file__).resolve().parents[1] / "fixtures/gguf/tiny-llama-Q4_K_M.head.gguf"
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "m.gguf").write_bytes(tiny.read_bytes())
    token = tmp_path / "token"
    token.write_text("hf_secret\n")
    token.chmod(0o600)
    with HubServer({"org/tiny": repo}, token="hf_secret") as hub:
        args = ["plan", "--hub-repo", "org/tiny", "--revision", hub.repo("org/tiny").sha, "--file", "m.gguf",
                "--hub-endpoint", hub.url, "--hub-token-file", str(token), "--gpu", "T4"]  # fmt: skip
        text = CliRunner().invoke(main, args)
        as_json = CliRunner().invoke(main, args + ["--json"])
    server = hub.url.split("://", 1)[1]
    assert text.exit_code == 0, text.output
    assert text.output.startswith(f"hub:   the token of {token} was sent to {server} only\n")
    assert json.loads(as_json.output)["hub_token_sent_to"] == server
    assert "hf_secret" not in text.output + as_json.output


@pytest.mark.parametrize("endpoint, expected", [
    ("https://huggingface.co@evil.example", USERINFO),
    ("http://hub.example", "the token would travel in clear"),
])  # fmt: skip
def test_plan_refuses_an_endpoint_the_token_should_not_go_to(endpoint, expected, tmp_path):
    token = tmp_path / "token"
    token.write_text("hf_secret\n")
    token.chmod(0o600)
    result = CliRunner().invoke(main, ["plan", "--hub-repo", "org/x", "--revision", "a" * 40, "--file", "m.gguf",
                                       "--hub-endpoint", endpoint, "--hub-token-file", str(token), "--gpu", "T4"])  # fmt: skip
    assert result.exit_code == 2 and expected in result.output, result.output
