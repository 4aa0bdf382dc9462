"""Build the lab's fake NVIDIA driver with dpkg-deb: per driver version, the package set of
Debian's non-free driver (source nvidia-graphics-drivers, as NVIDIA's repository for Debian
ships 550 too).

Real .debs, so that installing, upgrading and removing the driver on a lab host goes through
dpkg and apt like on a real server: the metapackage ``nvidia-driver`` depends on the others
at exactly its own version (``(= 550.144.03-1)``), the libraries are ``Multi-Arch: same`` and
some have their i386 copy beside them (dpkg keeps both copies at one version, so an upgrade
moves the 32-bit ones too), and ``nvidia-kernel-dkms`` "builds" the module at install as
DKMS does, and can fail as DKMS does (``nvidia-kernel-dkms.postinst``). The fake's own files
live where the real ones do: nvidia-smi in ``nvidia-smi``, the NVML library in
``libnvidia-ml1``, the module loader and its boot unit in ``nvidia-kernel-support``; the
module the boot unit loads is the one the last successful build wrote, so the loaded module
changes only at reboot.
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
from dataclasses import dataclass
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
ARCHITECTURES = ("amd64", "i386")
TRIPLETS = {"amd64": "x86_64-linux-gnu", "i386": "i386-linux-gnu"}
# What a lab host writes to make the module build of that driver version fail (the
# postinst reads it), as a kernel too new for the module's source does on a real host.
DKMS_FAILS = "/etc/llamarack-lab/dkms-build-fails"


@dataclass(frozen=True)
class Package:
    """One binary package of the set, as Debian's packaging has it."""

    name: str
    summary: str
    depends: tuple = ()
    """Packages of the set, each at exactly the same version."""
    multi_arch: str = ""
    i386: bool = False
    """The set has its 32-bit copy too (what a rack with 32-bit CUDA or GL users installs)."""
    section: str = "non-free/libs"
    also_depends: tuple = ()
    """Debian's own packages the fake needs (python3 for its programs)."""


def _lib(name, summary, *depends, i386=False):
    return Package(name, summary, depends, "same", i386)


DRIVER_SET = (
    Package("nvidia-driver", "NVIDIA metapackage",
            ("nvidia-driver-libs", "nvidia-driver-bin", "xserver-xorg-video-nvidia", "nvidia-vdpau-driver",
             "nvidia-alternative", "nvidia-kernel-dkms", "firmware-nvidia-gsp", "nvidia-smi", "libcuda1",
             "libnvidia-cfg1", "nvidia-persistenced"), section="non-free/x11"),  # fmt: skip
    _lib("nvidia-driver-libs", "NVIDIA metapackage (OpenGL/GLX/EGL/GLES libraries)",
         "libgl1-nvidia-glvnd-glx", "nvidia-egl-icd", "nvidia-vulkan-icd"),
    Package("nvidia-driver-bin", "NVIDIA driver support binaries", ("nvidia-alternative",), section="non-free/x11"),
    Package("nvidia-alternative", "allows the selection of NVIDIA as GLX provider", multi_arch="foreign",
            section="non-free/x11"),  # fmt: skip
    Package("nvidia-kernel-dkms", "NVIDIA binary kernel module DKMS source", ("nvidia-kernel-support",),
            section="non-free/kernel"),  # fmt: skip
    Package("nvidia-kernel-support", "NVIDIA binary kernel module support files", ("nvidia-alternative",),
            "foreign", section="non-free/kernel", also_depends=("python3",)),  # fmt: skip
    Package("firmware-nvidia-gsp", "NVIDIA GSP firmware", section="non-free-firmware/kernel"),
    Package("nvidia-smi", "NVIDIA System Management Interface", ("nvidia-alternative", "libnvidia-ml1"),
            section="non-free/utils", also_depends=("python3",)),  # fmt: skip
    Package("nvidia-persistenced", "daemon to maintain persistent software state in the NVIDIA driver",
            ("libnvidia-cfg1",), section="non-free/utils"),  # fmt: skip
    Package("xserver-xorg-video-nvidia", "NVIDIA binary Xorg driver", ("nvidia-alternative", "libnvidia-glcore"),
            section="non-free/x11"),  # fmt: skip
    _lib("nvidia-vdpau-driver", "Video Decode and Presentation API for Unix - NVIDIA driver", "nvidia-alternative"),
    _lib("libcuda1", "NVIDIA CUDA Driver Library", "nvidia-alternative", "libnvidia-ptxjitcompiler1", i386=True),
    _lib("libnvidia-ptxjitcompiler1", "NVIDIA PTX JIT Compiler library", "nvidia-alternative", i386=True),
    _lib("libnvidia-ml1", "NVIDIA Management Library (NVML) runtime library", "nvidia-alternative", i386=True),
    _lib("libnvidia-cfg1", "NVIDIA binary OpenGL/GLX configuration library", "nvidia-alternative"),
    _lib("libnvidia-glcore", "NVIDIA binary OpenGL/GLX core libraries", i386=True),
    _lib("libnvidia-eglcore", "NVIDIA binary EGL core libraries", i386=True),
    _lib("libnvidia-rtcore", "NVIDIA binary Vulkan ray tracing (rtcore) library"),
    _lib("libglx-nvidia0", "NVIDIA binary GLX library", "nvidia-alternative", "libnvidia-glcore", i386=True),
    _lib("libgl1-nvidia-glvnd-glx", "NVIDIA binary OpenGL/GLX library (GLVND variant)", "libglx-nvidia0", i386=True),
    _lib("libegl-nvidia0", "NVIDIA binary EGL library", "nvidia-alternative", "libnvidia-eglcore", i386=True),
    _lib("nvidia-egl-icd", "NVIDIA EGL installable client driver (ICD)", "libegl-nvidia0"),
    _lib("nvidia-vulkan-icd", "NVIDIA Vulkan installable client driver (ICD)", "libglx-nvidia0", "libnvidia-rtcore"),
)


def members() -> list[tuple[Package, str]]:
    """(package, architecture) of every .deb of a version: the amd64 set, then the i386 copies."""
    return [(p, "amd64") for p in DRIVER_SET] + [(p, "i386") for p in DRIVER_SET if p.i386]


def package_names() -> list[str]:
    """Every package of the set as dpkg names it unambiguously (``libcuda1:i386``)."""
    return [f"{p.name}:{arch}" for p, arch in members()]


def check_version(version: str) -> str:
    if not VERSION_RE.fullmatch(version):
        raise LabError(f"not a driver version: {version!r} (e.g. 550.127.05)")
    return version


def deb_name(name: str, version: str, arch: str = "amd64") -> str:
    return f"{name}_{version}-1_{arch}.deb"


def control(pkg: Package, arch: str, version: str) -> str:
    """The package's DEBIAN/control."""
    depends = [f"{d} (= {version}-1)" for d in pkg.depends] + list(pkg.also_depends)
    return (f"Package: {pkg.name}\nSource: nvidia-graphics-drivers\nVersion: {version}-1\nArchitecture: {arch}\n"
            + (f"Multi-Arch: {pkg.multi_arch}\n" if pkg.multi_arch else "")
            + "Maintainer: llamarack lab <lab@llamarack.invalid>\n"
            + (f"Depends: {', '.join(depends)}\n" if depends else "")
            + f"Section: {pkg.section}\nPriority: optional\n"
            f"Description: {pkg.summary} (llamarack lab fake)\n"
            f" Part of the llamarack lab's fake NVIDIA driver {version}, a test double\n"
            " for lab hosts, shaped like Debian's package of the same name.\n")  # fmt: skip


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


def _smi_files(root: Path, arch: str, version: str) -> None:
    lib = root / "usr/lib/llamarack-lab"
    lib.mkdir(parents=True)
    shutil.copy(HERE / "nvidia_smi.py", lib / "nvidia_smi.py")
    _compile(lib / "nvidia_smi.py", Path("/usr/lib/llamarack-lab/nvidia_smi.py"))
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-smi").write_text(NVIDIA_SMI_LAUNCHER)
    os.chmod(root / "usr/bin/nvidia-smi", 0o755)


def _nvml_files(root: Path, arch: str, version: str) -> None:
    """The NVML library marker, whose suffix the fake nvidia-smi reads as the library's version."""
    libdir = root / "usr/lib" / TRIPLETS[arch]
    libdir.mkdir(parents=True)
    (libdir / f"libnvidia-ml.so.{version}").write_text(f"llamarack lab fake NVML {version}\n")
    (libdir / "libnvidia-ml.so.1").symlink_to(f"libnvidia-ml.so.{version}")


def _loader_files(root: Path, arch: str, version: str) -> None:
    """The module loader and the unit that runs it at boot."""
    (root / "usr/lib/llamarack-lab").mkdir(parents=True)
    shutil.copy(HERE / "nvidia_module.py", root / "usr/lib/llamarack-lab/nvidia-module")
    os.chmod(root / "usr/lib/llamarack-lab/nvidia-module", 0o755)
    units = root / "lib/systemd/system"
    (units / "multi-user.target.wants").mkdir(parents=True)
    shutil.copy(HERE / "nvidia-module.service", units / "nvidia-module.service")
    (units / "multi-user.target.wants/nvidia-module.service").symlink_to("../nvidia-module.service")


def _dkms_files(root: Path, arch: str, version: str) -> None:
    """The module's "source" and the maintainer scripts that build and remove it."""
    src = root / f"usr/src/nvidia-current-{version}"
    src.mkdir(parents=True)
    (src / "dkms.conf").write_text(f'PACKAGE_NAME="nvidia-current"\nPACKAGE_VERSION="{version}"\n'
                                   'BUILT_MODULE_NAME[0]="nvidia-current"\nAUTOINSTALL=yes\n')  # fmt: skip
    for script in ("postinst", "prerm"):
        text = (HERE / f"nvidia-kernel-dkms.{script}").read_text().replace("@VERSION@", version)
        (root / "DEBIAN" / script).write_text(text)
        os.chmod(root / "DEBIAN" / script, 0o755)


FILES = {"nvidia-smi": _smi_files, "libnvidia-ml1": _nvml_files, "nvidia-kernel-support": _loader_files,
         "nvidia-kernel-dkms": _dkms_files}  # fmt: skip


def _build(pkg: Package, arch: str, version: str, work: Path, out: Path) -> None:
    root = work / f"{pkg.name}_{arch}"
    for d in ("DEBIAN", f"usr/share/doc/{pkg.name}"):
        (root / d).mkdir(parents=True)
    (root / "DEBIAN/control").write_text(control(pkg, arch, version))
    # the same bytes in either architecture's copy (dpkg shares a Multi-Arch: same file)
    (root / f"usr/share/doc/{pkg.name}/README.lab").write_text(
        f"{pkg.name} {version}-1: part of the llamarack lab's fake NVIDIA driver\n")
    if pkg.name in FILES:
        FILES[pkg.name](root, arch, version)
    for p in root.rglob("*"):
        if not p.is_symlink():
            os.chmod(p, 0o755 if p.is_dir() or os.access(p, os.X_OK) else 0o644)
    tmp_out = out.with_suffix(".part")
    run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(tmp_out)])
    os.replace(tmp_out, out)


def inputs_key(version: str) -> str:
    """A hash of what the set of ``version`` is made of: this module and the fake's files."""
    h = hashlib.sha256(version.encode())
    for f in sorted(p for p in HERE.iterdir() if p.is_file()):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def build_set(version: str, out_dir: Path) -> list[Path]:
    """Build (or reuse) the .debs of driver ``version`` in out_dir/pool, in ``members()``'
    order. (pool/: the one .deb of an older lab's fake, which it would take for its own,
    stays where it was.)"""
    check_version(version)
    pool = out_dir / "pool"
    pool.mkdir(parents=True, exist_ok=True)
    debs = [pool / deb_name(p.name, version, arch) for p, arch in members()]
    stamp, key = pool / f".{PACKAGE}_{version}.key", inputs_key(version)
    if stamp.is_file() and stamp.read_text() == key and all(d.is_file() for d in debs):
        return debs
    with tempfile.TemporaryDirectory(prefix="lab-deb-") as tmp:
        for (pkg, arch), out in zip(members(), debs):
            _build(pkg, arch, version, Path(tmp), out)
    stamp.write_text(key)
    return debs


def _packages_stanza(pkg: Path, repo: Path) -> str:
    """The package's control fields and where apt finds it, as dpkg-scanpackages writes them."""
    control = run(["dpkg-deb", "-f", str(pkg)]).stdout.decode().rstrip("\n")
    data = pkg.read_bytes()
    return (f"{control}\nFilename: ./{pkg.relative_to(repo)}\nSize: {len(data)}\n"
            f"MD5sum: {hashlib.md5(data).hexdigest()}\nSHA256: {hashlib.sha256(data).hexdigest()}\n")


def write_repo(repo: Path, versions=REPO_VERSIONS) -> Path:
    """A flat apt repository of the fake driver in ``repo`` (``deb [trusted=yes] URL ./``, as a
    site's own NVIDIA mirror would be configured): each version's package set (both
    architectures), Packages and an unsigned Release naming its hash. Returns ``repo``."""
    repo.mkdir(parents=True, exist_ok=True)
    pkgs = [deb for v in versions for deb in build_set(v, repo)]
    packages = "\n".join(_packages_stanza(p, repo) for p in pkgs)
    (repo / "Packages").write_text(packages)
    data = packages.encode()
    (repo / "Release").write_text(
        "Origin: llamarack lab\nLabel: llamarack lab NVIDIA driver\nSuite: lab\nCodename: lab\n"
        f"Date: {email.utils.formatdate(usegmt=True)}\nArchitectures: {' '.join(ARCHITECTURES)}\n"
        f"MD5Sum:\n {hashlib.md5(data).hexdigest()} {len(data)} Packages\n"
        f"SHA256:\n {hashlib.sha256(data).hexdigest()} {len(data)} Packages\n")
    return repo
