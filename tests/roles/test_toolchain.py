"""Toolchain role: the gcc guard, the record, the non-free sources (facts in, commands out)."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.api.exceptions import OperationError
from pyinfra.context import ctx_state
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import Directory, File, Sha1File

import llamarack.facts as facts
from llamarack.facts import GccInstall, ToolchainChoice, toolchain_record
from llamarack.hoststack import apt_install_missing, toolchain_choice
from roles.toolchain import BUILD_PACKAGES, nonfree_sources
from tests.roles.stackhost import run_op

FACTS = Path(__file__).resolve().parents[1] / "facts"
RECORD = "/opt/llamarack/state/toolchain.json"


def fixture(fact, case):
    return getattr(facts, fact)().process(json.loads((FACTS / f"{fact}/{case}.json").read_text())["output"])


GCC11 = ToolchainChoice(
    backend="cuda", cuda_source="debian", cuda_home="/usr", nvcc="/usr/bin/nvcc", cuda_version="11.8",
    cuda_full_version="11.8.89", max_gcc=11, host_compiler="/usr/bin/g++-11", host_c_compiler="/usr/bin/gcc-11",
)  # fmt: skip


def host_facts(gcc, record=None, packages=None):
    return {
        facts.CudaToolkits: fixture("CudaToolkits", "debian_11_8_and_cuda13"),
        facts.GccVersions: gcc,
        facts.InstallableGccMajors: (12, 11),
        facts.ToolchainRecord: record,
        DebPackages: packages or {},
        File: None,
        Sha1File: None,
        Directory: None,
        (Directory, frozenset({("path", "/opt/llamarack/state")})): {"mode": 755},
    }


def cuda(**kw):
    return dict(record_path=RECORD, backend="cuda", cuda_version="11.8", cuda_source="debian", **kw)


def test_gcc12_default_gets_gcc11_installed_beside_it_and_recorded():
    commands, _ = run_op(toolchain_choice, host_facts(fixture("GccVersions", "debian12")), **cuda())
    assert commands[0].endswith("install --no-install-recommends gcc-11 g++-11")
    assert commands[1:] == [f"FileUploadCommand(<StringIO>, {RECORD})", f"chmod 644 {RECORD}"]


def test_installed_gcc11_is_chosen_without_apt_and_a_matching_record_is_a_no_op():
    gcc = fixture("GccVersions", "debian12_with_gcc11")
    commands, noops = run_op(toolchain_choice, host_facts(gcc, record=GCC11), **cuda())
    assert commands == [] and noops == ["toolchain already recorded: /usr/bin/g++-11"]


def test_record_is_the_json_the_fact_reads_back():
    assert facts.ToolchainRecord().process(toolchain_record(GCC11).splitlines()) == GCC11


def test_a_changed_choice_rewrites_the_record():
    gcc = fixture("GccVersions", "debian12_with_gcc11")
    stale = ToolchainChoice(backend="cpu")
    commands, _ = run_op(toolchain_choice, host_facts(gcc, record=stale), **cuda())
    assert commands == [f"FileUploadCommand(<StringIO>, {RECORD})", f"chmod 644 {RECORD}"]


def test_default_gcc_is_kept_when_the_toolkit_accepts_it():
    gcc = GccInstall("11.4.0", {})
    commands, _ = run_op(toolchain_choice, host_facts(gcc), **cuda())
    assert commands == [f"FileUploadCommand(<StringIO>, {RECORD})", f"chmod 644 {RECORD}"]  # nothing installed


def test_cpu_host_records_the_backend_only():
    commands, noops = run_op(toolchain_choice, host_facts(GccInstall("12.2.0", {}),
                                                          record=ToolchainChoice(backend="cpu")),
                             record_path=RECORD, backend="cpu")  # fmt: skip
    assert commands == [] and noops == ["toolchain already recorded: cpu"]


def test_toolkit_missing_waits_while_planning_and_fails_when_running():
    f = host_facts(fixture("GccVersions", "debian12"))
    f[facts.CudaToolkits] = []
    commands, _ = run_op(toolchain_choice, f, **cuda())
    assert len(commands) == 1 and commands[0].startswith("true")
    with ctx_state.use(SimpleNamespace(is_executing=True)):
        with pytest.raises(OperationError, match="no CUDA 11.8 toolkit on the host"):
            run_op(toolchain_choice, f, **cuda())


def test_no_acceptable_gcc_fails_when_running():
    f = host_facts(fixture("GccVersions", "debian12"))
    f[facts.InstallableGccMajors] = (12,)
    with ctx_state.use(SimpleNamespace(is_executing=True)):
        with pytest.raises(OperationError, match="needs gcc 11 or older"):
            run_op(toolchain_choice, f, **cuda())


def test_build_packages_make_no_apt_call_when_installed():
    installed = {p: ["1"] for p in BUILD_PACKAGES}
    commands, noops = run_op(apt_install_missing, {DebPackages: installed}, packages=BUILD_PACKAGES)
    assert commands == [] and noops


def test_a_missing_build_package_refreshes_stale_lists_then_installs_only_it():
    installed = {p: ["1"] for p in BUILD_PACKAGES if p != "ccache"}
    f = {DebPackages: installed, File: None}
    commands, _ = run_op(apt_install_missing, f, packages=BUILD_PACKAGES)
    assert commands[0].endswith("apt-get update")
    assert commands[-1].endswith("install --no-install-recommends ccache")


def test_nonfree_sources_copy_the_hosts_archives_and_signed_by():
    text = nonfree_sources(fixture("DebianSources", "debian12"))
    assert "URIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: contrib non-free\n" \
           "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" in text  # fmt: skip
    assert "Suites: bookworm-security" in text


def test_nonfree_sources_not_needed_when_the_host_has_them():
    stanzas = ({"Types": "deb", "URIs": "u", "Suites": "bookworm", "Components": "main contrib non-free"},)
    assert nonfree_sources(stanzas) == ""
