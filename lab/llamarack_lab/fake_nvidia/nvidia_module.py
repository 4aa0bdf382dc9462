#!/usr/bin/python3
"""Fake NVIDIA "kernel module" loader for llamarack lab hosts.

`load`: what modprobe nvidia does at boot: the module that the last
successful build of nvidia-kernel-dkms installed (its postinst writes
its version, its prerm removes it, as DKMS does) becomes the loaded one,
visible in /proc/driver/nvidia/version (a tmpfs this script mounts over
the guest's /proc/driver, private to the guest). Refuses when the lab marked the
module as unloadable (/etc/llamarack-lab/nvidia-no-module), like a kernel
upgrade without a DKMS build, and when the module's branch drives none of
the host's cards (a 590 module on a V100 alone: the real probe logs "The
... driver will ignore this GPU", then "No NVIDIA GPU found", and modprobe
fails). `unload`: rmmod. Run by nvidia-module.service at boot and by
`llamarack lab driver`.
"""

import os
import subprocess
import sys

from nvidia_smi import load_gpus, supported  # beside this file, here and on the guest

ROOT = os.environ.get("LLAMARACK_FAKE_NVIDIA_ROOT", "")
PROC_DRIVER = ROOT + "/proc/driver"
INSTALLED = ROOT + "/usr/lib/llamarack-lab/nvidia-module-version"
NO_MODULE = ROOT + "/etc/llamarack-lab/nvidia-no-module"

# Build stamps of the real proprietary modules where known.
BUILD_DATES = {"550.127.05": "Tue Oct  8 03:22:07 UTC 2024"}
DEFAULT_BUILD_DATE = "Thu Jan  9 12:00:00 UTC 2025"


def proc_version_text(version):
    """Byte for byte the format of the real proprietary module."""
    return ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  %s\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n"
            % (version, BUILD_DATES.get(version, DEFAULT_BUILD_DATE)))


def ensure_proc_driver():
    if not ROOT and not os.path.ismount(PROC_DRIVER):
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0555,size=64k",
                        "nvidia-proc", PROC_DRIVER], check=True)


def load():
    if os.path.exists(NO_MODULE):
        sys.stderr.write("modprobe: FATAL: Module nvidia not found in directory "
                         "/lib/modules/%s\n" % os.uname().release)
        return 1
    try:
        version = open(INSTALLED).read().strip()
    except OSError:
        sys.stderr.write("modprobe: FATAL: Module nvidia not found\n")
        return 1
    gpus = load_gpus()
    if gpus and not any(supported(g, version) for g in gpus):
        sys.stderr.write("modprobe: ERROR: could not insert 'nvidia': No such device\n")
        return 1
    ensure_proc_driver()
    os.makedirs(PROC_DRIVER + "/nvidia", exist_ok=True)
    with open(PROC_DRIVER + "/nvidia/version", "w") as f:
        f.write(proc_version_text(version))
    return 0


def unload():
    try:
        os.unlink(PROC_DRIVER + "/nvidia/version")
        os.rmdir(PROC_DRIVER + "/nvidia")
    except FileNotFoundError:
        pass
    return 0


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else "load"
    sys.exit({"load": load, "unload": unload}[cmd]())
