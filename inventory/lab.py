"""The local lab rack: for the lab only. Never copy this file for a real rack.

`llamarack lab up` boots these four hosts on this machine (real Debian
bookworm with systemd, each with a fake NVIDIA driver reporting the GPU in
its name) and the gateway lab-gw (no GPU: HAProxy in front of the four);
then `pyinfra inventory/lab.py deploy.py` provisions them.

It takes shortcuts that are safe only on the lab's closed bridge on this
machine, and wrong anywhere else: it does not check host keys
(`ssh_strict_host_key_checking = "off"`, `known_hosts` of /dev/null),
logs in as root, fetches llama.cpp, wheels and the model over plain
http, and serves without an API key. For a real rack, start from
`inventory/example_v100.py`: it pins host keys, logs in as an operator
with sudo and uses https sources.
"""

import os

# Two V100 16 GB hosts, one V100 32 GB, one T4: a typical mixed rack.
v100 = [
    ("lab-v100-a", {"ssh_hostname": "10.77.0.11"}),
    ("lab-v100-b", {"ssh_hostname": "10.77.0.12"}),
    ("lab-v100-32", {"ssh_hostname": "10.77.0.13"}),
]
# Reached the way most real racks are: a non-root SSH user with sudo.
t4 = [
    ("lab-t4", {"ssh_hostname": "10.77.0.14", "ssh_user": "deploy", "_sudo": True}),
]
# HAProxy in front of the four (group `gateways`: preflight's read and the gateway role only).
gateways = [
    ("lab-gw", {"ssh_hostname": "10.77.0.15"}),
]

# The lab's hosts have no real GPU and no conda channel in reach: build
# llama.cpp for the CPU and use a venv (bookworm's Python is 3.11). They
# reach nothing outside but apt: `llamarack lab up` serves, from this
# machine at 10.77.0.1, llama.cpp (a git mirror), every wheel the python
# envs install (a PyPI simple index; torch is this machine's 2.13.0 CPU
# wheel) and a hub with a tiny real Llama model, pinned to its content
# hash. The rest are the defaults of group_data/all.py. The rack shares one
# ccache, so a build compiles once; with LLAMARACK_LAB_CCACHE=own in the
# environment each host has only its own (ccache's default directory, empty
# at `lab up`), as on a real rack.
_ccache = None if os.environ.get("LLAMARACK_LAB_CCACHE") == "own" else "/var/cache/llamarack-ccache"
lab = (
    v100 + t4 + gateways,
    {
        # Lab only: the hosts get new keys at each `lab up`, on a bridge nothing else reaches.
        "ssh_user": "root",
        "ssh_key": "/run/llamarack-lab/id_ed25519",
        "ssh_known_hosts_file": "/dev/null",
        "ssh_strict_host_key_checking": "off",
        "llamacpp_backend": "cpu",
        "python_env_backend": "venv",
        "llamacpp_ccache_dir": _ccache,
        # The sources are plain http on the lab's closed bridge; a real rack uses https.
        "llamarack_trusted_network": True,
        "llamacpp_git_url": "http://10.77.0.1:8470/llama.cpp.git",
        "llamacpp_commit": "dccad28c67854048fcdf644803b3f54e152d99a8",
        "python_env_python_version": "3.11",
        "python_env_torch_version": "2.13.0",
        "python_env_converter_overrides": ["torch==2.13.0"],
        "python_env_index_url": "http://10.77.0.1:8470/pypi/simple",
        "python_env_torch_index_url": "http://10.77.0.1:8470/pypi/simple",
        "python_env_converter_torch_index_url": "http://10.77.0.1:8470/pypi/simple",
        "model_hf_endpoint": "http://10.77.0.1:8471",
        "model_repo": "lab/tiny-llama",
        "model_revision": "024052eec5467f84406c4ab1607cdf939e5bb195",
        "model_quant": "Q4_K_M",
        # Served to this machine over the lab's closed bridge, without an API key:
        # said explicitly, as any inventory must that serves beyond loopback unkeyed.
        "server_listen": "0.0.0.0",
        "server_allow_unauthenticated": True,
    },
)
