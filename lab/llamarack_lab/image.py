"""The lab's Debian bookworm image: built once with mmdebstrap, kept as a
.tar.zst in the cache dir, keyed by a hash of everything that goes into it.

The image is host-independent (no keys, no hostname, no GPU config): all
per-host things go into each host's overlay upper dir, so one image serves
any rack and any SSH key.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

from . import paths
from .util import LabError, progress, require_tool, run

SUITE = "bookworm"
MIRRORS = [
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
]
# What a small Debian server has and pyinfra's facts rely on.
PACKAGES = [
    "openssh-server", "python3", "systemd", "systemd-sysv", "dbus",
    "iproute2", "sudo", "curl", "ca-certificates", "procps",
    "debian-archive-keyring",
]
# Bump when prepare() changes in a way that changes the image.
PREP_VERSION = "6"
GUEST_FILES = Path(__file__).parent / "guest"
# A non-root SSH user with passwordless sudo, the way most real racks are reached.
DEPLOY_USER, DEPLOY_UID = "deploy", 1500
EXTRA_CA_DIR = Path("/usr/local/share/ca-certificates")
# Units a lab host must not run: consoles it has none of, and timers that
# would change host state behind a test's back (unattended apt runs).
MASKED_UNITS = [
    "getty@.service", "console-getty.service", "serial-getty@.service",
    "apt-daily.timer", "apt-daily-upgrade.timer", "apt-daily.service",
    "apt-daily-upgrade.service",
]


def _extra_ca_certs() -> list[Path]:
    if not EXTRA_CA_DIR.is_dir():
        return []
    return sorted(p for p in EXTRA_CA_DIR.rglob("*.crt") if p.is_file())


def image_key() -> str:
    """Hash of the inputs: rebuild only when one of them changes."""
    h = hashlib.sha256()
    h.update(f"{SUITE}\n{PREP_VERSION}\n".encode())
    h.update("\n".join(MIRRORS + sorted(PACKAGES)).encode())
    for f in sorted(GUEST_FILES.iterdir()):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    for c in _extra_ca_certs():
        h.update(c.name.encode() + b"\0" + c.read_bytes())
    return h.hexdigest()[:16]


def image_path() -> Path:
    return paths.cache_dir() / f"{SUITE}-{image_key()}.tar.zst"


def prepare(root: Path) -> None:
    """Turn a fresh mmdebstrap tree into a lab image (host-independent)."""
    (root / "etc/machine-id").write_text("")
    for p in (root / "var/lib/apt/lists").glob("*"):
        if p.is_file():
            p.unlink()
    for p in (root / "var/cache/apt").glob("*.bin"):
        p.unlink()
    for p in (root / "etc/ssh").glob("ssh_host_*"):
        p.unlink()
    shutil.copy(GUEST_FILES / "sshd-llamarack-lab.conf",
                root / "etc/ssh/sshd_config.d/llamarack-lab.conf")
    # deb822 sources like a real bookworm host
    (root / "etc/apt/sources.list").unlink(missing_ok=True)
    shutil.copy(GUEST_FILES / "debian.sources",
                root / "etc/apt/sources.list.d/debian.sources")
    sysd = root / "etc/systemd/system"
    for unit in MASKED_UNITS:
        link = sysd / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    shutil.copy(GUEST_FILES / "lxcfs-uptime.service", sysd / "lxcfs-uptime.service")
    wants = sysd / "sysinit.target.wants"
    wants.mkdir(exist_ok=True)
    (wants / "lxcfs-uptime.service").symlink_to("/etc/systemd/system/lxcfs-uptime.service")
    (root / "var/lib/lxcfs").mkdir(parents=True, exist_ok=True)
    (root / "etc/llamarack-lab").mkdir(exist_ok=True)
    (root / "etc/hostname").unlink(missing_ok=True)
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    run(["chroot", str(root), "useradd", "--uid", str(DEPLOY_UID), "--user-group", "--create-home",
         "--shell", "/bin/bash", DEPLOY_USER])  # fmt: skip
    # i386 beside amd64, as on a rack with 32-bit users of the driver's libraries: the fake
    # driver's set has i386 copies of them. Only the lab's driver repository serves i386
    # (debian.sources says amd64): the lab does not depend on Debian's i386 indexes, which a
    # mirror in the middle of a sync can serve torn (apt update then fails every deploy).
    run(["chroot", str(root), "dpkg", "--add-architecture", "i386"])
    sudoers = root / f"etc/sudoers.d/llamarack-lab-{DEPLOY_USER}"
    sudoers.write_text(f"{DEPLOY_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n")
    sudoers.chmod(0o440)
    # The machine's extra CAs (e.g. an egress proxy's): HTTPS to PyPI from a
    # host fails without them.
    certs = _extra_ca_certs()
    if certs:
        dest = root / "usr/local/share/ca-certificates"
        dest.mkdir(parents=True, exist_ok=True)
        for c in certs:
            shutil.copy(c, dest / c.name)
        run(["chroot", str(root), "update-ca-certificates"])


def build(work_dir: Path) -> Path:
    """Build the image under work_dir (a tmpfs) and store it in the cache."""
    require_tool("mmdebstrap")
    require_tool("zstd")
    out = image_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    root = work_dir / "image.build"
    if root.exists():
        shutil.rmtree(root)
    t0 = time.monotonic()
    progress(f"building image {out.name} with mmdebstrap (about a minute)...")
    run(["mmdebstrap", "--variant=minbase", "--mode=root", "--quiet",
         "--dpkgopt=force-unsafe-io",
         "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
         "--include=" + ",".join(PACKAGES),
         SUITE, str(root), *MIRRORS])
    progress(f"bootstrap done in {time.monotonic() - t0:.0f} s; preparing image")
    prepare(root)
    tmp = out.with_suffix(".part")
    run(["tar", "-C", str(root), "--numeric-owner", "--xattrs", "--zstd",
         "-cf", str(tmp), "."])
    os.replace(tmp, out)
    progress(f"image stored: {out} ({out.stat().st_size // 2**20} MiB, "
             f"{time.monotonic() - t0:.0f} s)")
    return root


def ensure_unpacked(work_dir: Path) -> Path:
    """Return an unpacked image dir under work_dir (the overlay lower dir),
    building the cached tarball first if the inputs changed."""
    dest = work_dir / "image"
    stamp = work_dir / "image.key"  # outside the guest's view of /
    key = image_key()
    if stamp.is_file() and stamp.read_text() == key:
        return dest
    if dest.exists():
        raise LabError(f"{dest} holds another image; run 'lab down' first")
    tarball = image_path()
    if not tarball.is_file():
        built = build(work_dir)
        os.rename(built, dest)
    else:
        dest.mkdir()
        run(["tar", "-C", str(dest), "--numeric-owner", "--xattrs", "--zstd",
             "-xf", str(tarball)])
    stamp.write_text(key)
    return dest
