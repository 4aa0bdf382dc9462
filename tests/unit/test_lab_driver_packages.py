"""The lab's fake NVIDIA driver as the package set of Debian's non-free driver
(lab/llamarack_lab/fake_nvidia/deb.py): real names, the metapackage's exact-version
dependencies, i386 copies of the libraries, the fake's files in the packages where the
real ones live, a flat repository of both architectures, a module build that fails with
DKMS's words, and apt moving every package of it in one upgrade."""

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from roles.driver.reads import NvidiaDriverPackages
from llamarack_lab.fake_nvidia import deb

OLD, NEW = deb.DEFAULT_VERSION, deb.UPGRADE_VERSION
HERE = Path(deb.__file__).parent


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return deb.write_repo(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="module")
def pool(repo):
    return repo / "pool"


def fields(path: Path) -> dict:
    out = subprocess.run(["dpkg-deb", "-f", str(path)], capture_output=True, text=True, check=True).stdout
    return dict(re.findall(r"^(\S+): (.*)$", out, re.M))


def contents(path: Path) -> str:
    return subprocess.run(["dpkg-deb", "-c", str(path)], capture_output=True, text=True, check=True).stdout


def test_the_set_has_the_real_names_and_about_thirty_packages():
    names = [p.name for p in deb.DRIVER_SET]
    assert len(names) == len(set(names)) == 23
    for real in ("nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi", "libnvidia-ml1", "libcuda1",
                 "firmware-nvidia-gsp", "xserver-xorg-video-nvidia", "libgl1-nvidia-glvnd-glx", "nvidia-egl-icd"):
        assert real in names
    assert [f"{p.name}:{a}" for p, a in deb.members()] == deb.package_names()
    assert len(deb.members()) == 31
    assert {p.name for p, a in deb.members() if a == "i386"} == {
        "libcuda1", "libnvidia-ptxjitcompiler1", "libnvidia-ml1", "libnvidia-glcore", "libnvidia-eglcore",
        "libglx-nvidia0", "libgl1-nvidia-glvnd-glx", "libegl-nvidia0"}  # fmt: skip


def test_the_metapackage_pulls_every_package_and_each_i386_copy_resolves_in_the_set():
    by_name = {p.name: p for p in deb.DRIVER_SET}
    reached, todo = set(), ["nvidia-driver"]
    while todo:
        name = todo.pop()
        reached.add(name)
        todo += [d for d in by_name[name].depends if d not in reached]
    assert reached == set(by_name)  # an upgrade of nvidia-driver moves every amd64 package
    for p in deb.DRIVER_SET:
        if p.i386:  # a dependency of an i386 copy: another i386 copy, or a Multi-Arch: foreign package
            assert p.multi_arch == "same"
            assert all(by_name[d].i386 or by_name[d].multi_arch == "foreign" for d in p.depends), p.name


def test_every_package_is_one_the_driver_role_holds():
    """The driver role's fact lists each package of the set, under dpkg's own names for it
    (``libcuda1:amd64``, ``libcuda1:i386``, ``nvidia-driver``): none is left unheld."""
    lines = [f"{p.name}{':' + a if p.multi_arch == 'same' else ''}\t{OLD}-1\thold ok installed"
             for p, a in deb.members()]  # fmt: skip
    assert len(NvidiaDriverPackages().process(lines)) == len(deb.members())


def test_each_deb_has_its_exact_version_dependencies_and_architecture(pool):
    for pkg, arch in deb.members():
        f = fields(pool / deb.deb_name(pkg.name, NEW, arch))
        assert (f["Package"], f["Version"], f["Architecture"]) == (pkg.name, f"{NEW}-1", arch)
        assert f.get("Multi-Arch", "") == pkg.multi_arch
        depends = f.get("Depends", "").split(", ") if pkg.depends or pkg.also_depends else []
        assert depends == [f"{d} (= {NEW}-1)" for d in pkg.depends] + list(pkg.also_depends)


def test_the_fakes_files_are_in_the_packages_where_the_real_ones_live(pool):
    smi = contents(pool / deb.deb_name("nvidia-smi", NEW))
    assert "-rwxr-xr-x root/root" in next(line for line in smi.splitlines() if line.endswith("./usr/bin/nvidia-smi"))
    assert "./usr/lib/llamarack-lab/nvidia_smi.py" in smi
    assert f"./usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{NEW}" in contents(pool / deb.deb_name("libnvidia-ml1", NEW))
    assert f"./usr/lib/i386-linux-gnu/libnvidia-ml.so.{NEW}" in contents(pool / deb.deb_name("libnvidia-ml1", NEW, "i386"))
    support = contents(pool / deb.deb_name("nvidia-kernel-support", NEW))
    assert "./lib/systemd/system/nvidia-module.service" in support and "./usr/lib/llamarack-lab/nvidia-module" in support
    assert "nvidia-module-version" not in support + smi  # what boots is what the module build wrote
    dkms = pool / deb.deb_name("nvidia-kernel-dkms", NEW)
    assert f"./usr/src/nvidia-current-{NEW}/dkms.conf" in contents(dkms)
    scripts = subprocess.run(["dpkg-deb", "--ctrl-tarfile", str(dkms)], capture_output=True, check=True).stdout
    assert b"./postinst" in scripts and b"./prerm" in scripts


def test_the_repository_lists_both_architectures_of_both_versions(repo):
    packages = (repo / "Packages").read_text()
    stanzas = [dict(re.findall(r"^(\S+): (.*)$", s, re.M)) for s in packages.strip().split("\n\n")]
    assert len(stanzas) == 2 * len(deb.members())
    assert {(s["Architecture"], s["Version"]) for s in stanzas} == {
        (a, f"{v}-1") for a in ("amd64", "i386") for v in (OLD, NEW)}  # fmt: skip
    for s in stanzas:
        assert s["SHA256"] == hashlib.sha256((repo / s["Filename"]).read_bytes()).hexdigest()
    release = (repo / "Release").read_text()
    assert "Architectures: amd64 i386\n" in release
    assert hashlib.sha256(packages.encode()).hexdigest() in release


def test_a_set_is_built_again_only_when_its_inputs_change(tmp_path):
    older = tmp_path / deb.deb_name("nvidia-driver", OLD)
    older.write_bytes(b"an older lab's one package")  # which that lab would reuse as its own
    debs = deb.build_set(OLD, tmp_path)
    assert older.read_bytes() == b"an older lab's one package" and {d.parent for d in debs} == {tmp_path / "pool"}
    meta = debs[0]
    meta.write_bytes(b"changed")
    assert deb.build_set(OLD, tmp_path) == debs and meta.read_bytes() == b"changed"  # the same inputs: reused
    (tmp_path / f"pool/.nvidia-driver_{OLD}.key").write_text("other inputs")
    deb.build_set(OLD, tmp_path)
    assert fields(meta)["Package"] == "nvidia-driver"


def maintainer_script(tmp_path, script, *args, fails=None):
    """Run nvidia-kernel-dkms's ``script`` of NEW against the root ``tmp_path``."""
    (tmp_path / "etc/llamarack-lab").mkdir(parents=True, exist_ok=True)
    if fails:
        (tmp_path / deb.DKMS_FAILS.lstrip("/")).write_text(fails + "\n")
    text = (HERE / f"nvidia-kernel-dkms.{script}").read_text().replace("@VERSION@", NEW)
    env = {"LLAMARACK_FAKE_NVIDIA_ROOT": str(tmp_path), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["sh", "-c", text, script, *args], env=env, capture_output=True, text=True)


def test_the_module_build_writes_what_boots_next(tmp_path):
    r = maintainer_script(tmp_path, "postinst", "configure", fails=OLD)  # another version's fault
    assert r.returncode == 0, r.stderr
    kernel = os.uname().release
    assert r.stdout.startswith(f"Loading new nvidia-current-{NEW} DKMS files...\nBuilding for {kernel}\n"
                               f"Building initial module for {kernel}\nDone.\n")  # fmt: skip
    assert (tmp_path / "usr/lib/llamarack-lab/nvidia-module-version").read_text() == f"{NEW}\n"


def test_a_failing_module_build_fails_with_dkms_words_and_status(tmp_path):
    (tmp_path / "usr/lib/llamarack-lab").mkdir(parents=True)
    (tmp_path / "usr/lib/llamarack-lab/nvidia-module-version").write_text(f"{OLD}\n")
    r = maintainer_script(tmp_path, "postinst", "configure", fails=NEW)
    kernel, machine = os.uname().release, os.uname().machine
    assert r.returncode == 10  # dpkg: "post-installation script subprocess returned error exit status 10"
    assert r.stderr == (f"Error! Bad return status for module build on kernel: {kernel} ({machine})\n"
                        f"Consult /var/lib/dkms/nvidia-current/{NEW}/build/make.log for more information.\n")
    assert NEW in (tmp_path / f"var/lib/dkms/nvidia-current/{NEW}/build/make.log").read_text()
    assert (tmp_path / "usr/lib/llamarack-lab/nvidia-module-version").read_text() == f"{OLD}\n"


def test_the_prerm_takes_its_own_module_off_the_next_boot(tmp_path):
    assert maintainer_script(tmp_path, "postinst", "configure").returncode == 0
    r = maintainer_script(tmp_path, "prerm", "upgrade", f"{OLD}-1")
    assert r.returncode == 0 and r.stdout == f"Deleting module nvidia-current-{NEW} completely from the DKMS tree.\n"
    assert not (tmp_path / "usr/lib/llamarack-lab/nvidia-module-version").exists()
    assert not (tmp_path / f"var/lib/dkms/nvidia-current/{NEW}").exists()


def apt(tmp_path, repo, *args, held=()):
    """``apt-get`` on a private state: the OLD set installed (``held``: those on hold), the
    repository as its one source, amd64 and i386."""
    status = "".join(fields_text(repo / "pool" / deb.deb_name(p.name, OLD, a), "hold" if p.name in held else "install")
                     for p, a in deb.members()) + "Package: python3\nStatus: install ok installed\n" \
        "Architecture: amd64\nVersion: 3.11.2-1+b1\n\n"  # fmt: skip
    for d in ("lists/partial", "cache/archives/partial", "etc/preferences.d", "etc/apt.conf.d"):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
    (tmp_path / "status").write_text(status)
    (tmp_path / "sources.list").write_text(f"deb [trusted=yes] file:{repo} ./\n")
    opts = [("Dir::State::status", tmp_path / "status"), ("Dir::State::lists", tmp_path / "lists"),
            ("Dir::Cache", tmp_path / "cache"), ("Dir::Etc::sourcelist", tmp_path / "sources.list"),
            ("Dir::Etc::sourceparts", "-"), ("Dir::Etc::preferencesparts", tmp_path / "etc/preferences.d"),
            ("Dir::Etc::parts", tmp_path / "etc/apt.conf.d"), ("APT::Architecture", "amd64"),
            ("APT::Architectures::", "amd64"), ("APT::Architectures::", "i386"), ("APT::Sandbox::User", "root"),
            ("Debug::NoLocking", "1")]  # fmt: skip
    words = [w for k, v in opts for w in ("-o", f"{k}={v}")]
    env = dict(os.environ, APT_CONFIG="/dev/null")
    subprocess.run(["apt-get", *words, "update"], capture_output=True, env=env, check=True)
    return subprocess.run(["apt-get", *words, *args], capture_output=True, text=True, env=env)


def fields_text(path: Path, want: str) -> str:
    control = subprocess.run(["dpkg-deb", "-f", str(path)], capture_output=True, text=True, check=True).stdout
    return control.replace("\nVersion:", f"\nStatus: {want} ok installed\nVersion:", 1) + "\n"


@pytest.mark.skipif(not shutil.which("apt-get"), reason="no apt-get here")
def test_apt_moves_every_package_with_the_metapackage(tmp_path, repo):
    r = apt(tmp_path, repo, "-s", "install", f"nvidia-driver={NEW}-1")
    assert r.returncode == 0, r.stdout + r.stderr
    moved = re.findall(rf"^Inst (\S+) \[{re.escape(OLD)}-1\] \({re.escape(NEW)}-1 ", r.stdout, re.M)
    assert sorted(moved) == sorted(n.removesuffix(":amd64") for n in deb.package_names())


@pytest.mark.skipif(not shutil.which("apt-get"), reason="no apt-get here")
def test_a_package_left_on_hold_stops_the_upgrade(tmp_path, repo):
    r = apt(tmp_path, repo, "-s", "install", f"nvidia-driver={NEW}-1", held=("firmware-nvidia-gsp",))
    assert r.returncode == 100
    assert f"Depends: firmware-nvidia-gsp (= {NEW}-1) but {OLD}-1 is to be installed" in r.stdout
