"""The production inventory example loads with pyinfra's own CLI and every host's settings validate."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llamarack.errors import SettingsError
from roles.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]


def inventory_data(path: str, **env: str) -> dict:
    """{host: data} as ``pyinfra INVENTORY debug-inventory`` prints it (group_data/all.py
    included), with ``env`` added to the environment."""
    out = subprocess.run([sys.executable, "-m", "pyinfra", path, "debug-inventory"], cwd=ROOT, env=os.environ | env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=True, timeout=120).stdout  # fmt: skip
    blocks = re.findall(r"^\[(\S+)\] *\n--> Groups: [^\n]*\n--> Data:\n(\{.*?\n\})", out, re.M | re.S)
    return {name: json.loads(data) for name, data in blocks}


def test_example_v100_inventory_is_valid_for_every_host():
    hosts = inventory_data("inventory/example_v100.py")
    assert sorted(hosts) == ["gpu01", "gpu02", "gpu03"]
    for name, data in hosts.items():
        assert data["ssh_user"] == "ops" and data["_sudo"] is True
        s = load_settings(name, data)
        assert s.toolchain.cuda_source == "debian" and s.toolchain.cuda_version == "11.8"
        assert s.python_env.torch_version == "2.1.2" and s.python_env.autoawq_version == "0.2.7"
        assert s.model.repo == "Qwen/Qwen2.5-7B-Instruct"
        assert s.model.revision == "a09a35458c702b33eeacc393d103063234e8bc28"
        assert s.server.api_key_file == "secrets/llamarack-api-key"


def test_lab_inventory_is_valid_for_every_host():
    """The lab's inventory, as pyinfra reads it: its plain http sources are allowed by
    llamarack_trusted_network alone (the lab's closed bridge)."""
    hosts = inventory_data("inventory/lab.py")
    assert sorted(hosts) == ["lab-gw", "lab-t4", "lab-v100-32", "lab-v100-a", "lab-v100-b"]
    for name, data in hosts.items():
        s = load_settings(name, data)
        assert s.general.trusted_network and s.model.hf_endpoint.startswith("http://")
        assert s.llamacpp.ccache_dir == "/var/cache/llamarack-ccache" and s.general.root == "/opt/llamarack"
        untrusted = {**data, "llamarack_trusted_network": False}
        with pytest.raises(SettingsError, match="llamacpp_git_url: given 'http://10.77.0.1:8470/llama.cpp.git'; "
                                                "allowed: an https:// URL"):
            load_settings(name, untrusted)


def test_the_lab_inventory_gives_each_host_its_own_ccache_when_asked():
    """LLAMARACK_LAB_CCACHE=own: no ccache shared by the rack (each host's own default), as on a real rack."""
    hosts = inventory_data("inventory/lab.py", LLAMARACK_LAB_CCACHE="own")
    assert sorted(hosts) == ["lab-gw", "lab-t4", "lab-v100-32", "lab-v100-a", "lab-v100-b"]
    assert all(load_settings(name, data).llamacpp.ccache_dir is None for name, data in hosts.items())
