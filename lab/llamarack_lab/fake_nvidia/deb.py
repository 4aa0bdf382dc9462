"""Build the lab's fake `nvidia-driver` package with dpkg-deb.

A real .deb, so that installing, upgrading and removing the driver on a
lab host goes through dpkg like on a real server (version in the package
database, files replaced in place, the loaded module untouched until
reboot).
"""

from __future__ import annotations

import email.utils
import hashlib
import importlib.util
import os
import py_compile
import re
import shutil
import tempfile
from pathlib import Path

from ..util import LabError, run

HERE = Path(__file__).parent
PACKAGE = "nvidia-driver"
DEFAULT_VERSION = "550.127.05"
# A later release of the same branch (a real 550 release): what the lab's apt source offers
# beside DEFAULT_VERSION, for a driver upgrade within the branch through apt.
UPGRADE_VERSION = "550.144.03"
REPO_VERSIONS = (DEFAULT_VERSION, UPGRADE_VERSION)
VERSION_RE = re.compile(r"\d{3}\.\d{2,3}(\.\d{2})?")


# /usr/bin/nvidia-smi: the double's module, imported from its compiled form (the real
# nvidia-smi is a compiled program; compiling 300 lines each call cost the audit 10 ms).
NVIDIA_SMI_LAUNCHER = """#!/usr/bin/python3 -IS
import sys
sys.path.insert(0, "/usr/lib/llamarack-lab")
from nvidia_smi import main
sys.exit(main(sys.argv[1:]))
"""


def _compile(source: Path, installed: Path) -> None:
    """The module's bytecode, in the package beside it, for the guest's python3 when this
    python is the same version (Debian 12's 3.11, as on the lab's machines); another
    version names its cache file differently, and the guest compiles the module itself.
    Checked against the source's hash, not its time: dpkg sets the file times."""
    cached = source.parent / Path(importlib.util.cache_from_source(str(installed))).relative_to(installed.parent)
    py_compile.compile(str(source), cfile=str(cached), dfile=str(installed), doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)  # fmt: skip


def check_version(version: str) -> str:
    if not VERSION_RE.fullmatch(version):
        raise LabError(f"not a driver version: {version!r} (e.g. 550.127.05)")
    return version


def deb_name(version: str) -> str:
    return f"{PACKAGE}_{version}-1_amd64.deb"


def build_deb(version: str, out_dir: Path) -> Path:
    """Build (or reuse) nvidia-driver_<version>-1_amd64.deb in out_dir."""
    check_version(version)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / deb_name(version)
    # the package content depends on the scripts: rebuild if they are newer
    newest = max(p.stat().st_mtime for p in HERE.iterdir() if p.is_file())
    if out.exists() and out.stat().st_mtime >= newest:
        return out
    with tempfile.TemporaryDirectory(prefix="lab-deb-") as tmp:
        root = Path(tmp) / "pkg"
        dirs = {
            "DEBIAN": 0o755, "usr/bin": 0o755, "usr/lib/x86_64-linux-gnu": 0o755,
            "usr/lib/llamarack-lab": 0o755, "lib/systemd/system/multi-user.target.wants": 0o755,
        }
        for d in dirs:
            (root / d).mkdir(parents=True)
        (root / "DEBIAN/control").write_text(
            f"Package: {PACKAGE}\n"
            f"Version: {version}-1\n"
            "Architecture: amd64\n"
            "Maintainer: llamarack lab <lab@llamarack.invalid>\n"
            "Depends: python3\n"
            "Section: non-free/x11\n"
            "Priority: optional\n"
            f"Description: NVIDIA driver {version} (llamarack lab fake)\n"
            " Test double of the NVIDIA driver for llamarack lab hosts: a\n"
            " fake nvidia-smi and a fake kernel module loaded at boot.\n")
        shutil.copy(HERE / "nvidia_smi.py", root / "usr/lib/llamarack-lab/nvidia_smi.py")
        (root / "usr/bin/nvidia-smi").write_text(NVIDIA_SMI_LAUNCHER)
        _compile(root / "usr/lib/llamarack-lab/nvidia_smi.py", Path("/usr/lib/llamarack-lab/nvidia_smi.py"))
        shutil.copy(HERE / "nvidia_module.py", root / "usr/lib/llamarack-lab/nvidia-module")
        for exe in ("usr/bin/nvidia-smi", "usr/lib/llamarack-lab/nvidia-module"):
            os.chmod(root / exe, 0o755)
        (root / "usr/lib/llamarack-lab/nvidia-module-version").write_text(version + "\n")
        lib = root / f"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{version}"
        lib.write_text(f"llamarack lab fake NVML {version}\n")
        (root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").symlink_to(lib.name)
        shutil.copy(HERE / "nvidia-module.service", root / "lib/systemd/system/nvidia-module.service")
        (root / "lib/systemd/system/multi-user.target.wants/nvidia-module.service").symlink_to(
            "../nvidia-module.service")
        for p in root.rglob("*"):
            if not p.is_symlink():
                os.chmod(p, 0o755 if p.is_dir() or os.access(p, os.X_OK) else 0o644)
        tmp_out = out.with_suffix(".part")
        run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(tmp_out)])
        os.replace(tmp_out, out)
    return out


def _packages_stanza(pkg: Path) -> str:
    """The package's control fields and where apt finds it, as dpkg-scanpackages writes them."""
    control = run(["dpkg-deb", "-f", str(pkg)]).stdout.decode().rstrip("\n")
    data = pkg.read_bytes()
    return (f"{control}\nFilename: ./{pkg.name}\nSize: {len(data)}\n"
            f"MD5sum: {hashlib.md5(data).hexdigest()}\nSHA256: {hashlib.sha256(data).hexdigest()}\n")


def write_repo(repo: Path, versions=REPO_VERSIONS) -> Path:
    """A flat apt repository of the fake driver in ``repo`` (``deb [trusted=yes] URL ./``, as a
    site's own NVIDIA mirror would be configured): each version's package, Packages and an
    unsigned Release naming its hash. Returns ``repo``."""
    repo.mkdir(parents=True, exist_ok=True)
    pkgs = [build_deb(v, repo) for v in versions]
    packages = "\n".join(_packages_stanza(p) for p in pkgs)
    (repo / "Packages").write_text(packages)
    data = packages.encode()
    (repo / "Release").write_text(
        "Origin: llamarack lab\nLabel: llamarack lab NVIDIA driver\nSuite: lab\nCodename: lab\n"
        f"Date: {email.utils.formatdate(usegmt=True)}\nArchitectures: amd64\n"
        f"MD5Sum:\n {hashlib.md5(data).hexdigest()} {len(data)} Packages\n"
        f"SHA256:\n {hashlib.sha256(data).hexdigest()} {len(data)} Packages\n")
    return repo
