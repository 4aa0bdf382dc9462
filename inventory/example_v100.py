"""A production rack of V100 16 GB servers: an example to copy and edit.

    pyinfra inventory/example_v100.py deploy.py            # deploy (add --dry to see the plan first)
    pyinfra inventory/example_v100.py deploy.py --diff     # also show how the unit file changes

Written for Debian 12 hosts with the NVIDIA 550 driver already installed
(llamarack holds the driver, it never installs one), reached over SSH as an
operator account with passwordless sudo. The README's "Your real rack in
ten minutes" walks through it. Nothing here is secret: the API key stays in
a file on the control machine (mode 600), read when the run needs it.

Host keys are pinned: pyinfra connects only to a host whose key is in
``known_hosts`` beside this file, which you fill before the first run
(see that file). A host that is not listed, or whose key changed, is
refused; nothing is accepted on first use.
"""

from pathlib import Path

# The hosts: their SSH addresses. Per-host settings go in the dict.
v100_16gb = [
    ("gpu01", {"ssh_hostname": "10.20.0.11"}),
    ("gpu02", {"ssh_hostname": "10.20.0.12"}),
    ("gpu03", {"ssh_hostname": "10.20.0.13"}),
]

rack = (
    v100_16gb,
    {
        # How pyinfra reaches the hosts: a non-root account, root through sudo,
        # and only hosts whose keys known_hosts lists ("yes": never accept a new key).
        "ssh_user": "ops",
        "ssh_key": "~/.ssh/llamarack_ed25519",
        "_sudo": True,
        "ssh_known_hosts_file": str(Path(__file__).resolve().with_name("known_hosts")),
        "ssh_strict_host_key_checking": "yes",
        # CUDA 11.8 (the last toolkit line that builds for Volta's sm_70 with
        # gcc <= 11) from Debian 12's non-free nvidia-cuda-toolkit; llamarack adds
        # the contrib/non-free components and installs g++-11 beside gcc 12.
        # For a conda toolkit instead: "toolchain_cuda_source": "conda" with
        # "python_env_conda_installer_sha256" set.
        "toolchain_cuda_source": "debian",
        "toolchain_cuda_version": "11.8",
        # The AWQ env with the reference pins (torch 2.1.2+cu118, transformers
        # 4.44.2, accelerate 0.33.0, autoawq 0.2.7) in a venv of Debian 12's
        # Python 3.11; the pins are the defaults.
        "python_env_backend": "venv",
        "python_env_python_version": "3.11",
        # The model: a pinned hub revision, converted and quantized on each host.
        # Qwen2.5-7B-Instruct at Q4_K_M is about 4.7 GB: on a 16 GB card that
        # leaves room for its whole trained context (32768) with q8_0 KV.
        "model_repo": "Qwen/Qwen2.5-7B-Instruct",
        "model_revision": "a09a35458c702b33eeacc393d103063234e8bc28",
        "model_quant": "Q4_K_M",
        # Serving: every interface, with a key; the context is planned per card.
        "server_listen": "0.0.0.0",
        "server_port": 8080,
        "server_cache_type_k": "q8_0",
        "server_cache_type_v": "q8_0",
        "server_api_key_file": "secrets/llamarack-api-key",
        # Air-gapped racks point these at their mirrors:
        # "llamacpp_git_url": "https://git.example.org/mirrors/llama.cpp.git",
        # "python_env_index_url": "https://pypi.example.org/simple",
        # "python_env_torch_index_url": "https://pypi.example.org/torch-cu118/simple",
        # "model_hf_endpoint": "https://hf-mirror.example.org",
    },
)
