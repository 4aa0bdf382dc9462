"""Toolchain role: the gcc guard (one plan for the install and the build), the non-free sources."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.api.exceptions import OperationError
from pyinfra.context import ctx_state
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File

from tests.support.facts import FACTS as facts
from roles.driver.reads import DriverState, Gpu
from roles.toolchain.reads import GccInstall
from llamarack.operations import apt_install_missing
from roles.llamacpp.plan import plan_for_host
from roles.toolchain.plan import BUILD_PACKAGES
from roles.toolchain.operations import toolkit_takes_host_compiler
from roles.toolchain.plan import nonfree_sources, plan_toolchain
from roles.preflight.facts import HostFacts
from roles.settings import load_settings
from tests.roles.stackhost import run_op
from tests.support.ophost import fact_key

FACTS = Path(__file__).resolve().parents[1] / "facts"


def fixture(fact, case):
    return getattr(facts, fact)().process(json.loads((FACTS / f"{fact}/{case}.json").read_text())["output"])


def host_facts(gcc, toolkits=None, installable=(12, 11)):
    """What preflight hands the toolchain role (roles.preflight.facts.HostFacts)."""
    v100 = Gpu(0, "Tesla V100-SXM2-16GB", "GPU-1", 16384, "7.0", "550.127.05")
    toolkits = fixture("CudaToolkits", "debian_11_8_and_cuda13") if toolkits is None else toolkits
    return HostFacts(DriverState("ok", (v100,)), None, tuple(toolkits), gcc, installable)


def settings(**data):
    return load_settings("gpu01", {"python_env_backend": "venv", "toolchain_cuda_home": "/usr", **data})


def test_gcc12_default_plans_gcc11_installed_beside_it():
    plan = plan_toolchain(settings(), host_facts(fixture("GccVersions", "debian12")))
    assert (plan.cuda_home, plan.cuda_version, plan.max_gcc) == ("/usr", "11.8", 11)  # read from host_config.h
    assert (plan.gcc_major, plan.install_gcc, plan.host_compiler) == (11, True, "/usr/bin/g++-11")


def test_installed_gcc11_is_chosen_without_apt():
    plan = plan_toolchain(settings(), host_facts(fixture("GccVersions", "debian12_with_gcc11")))
    assert (plan.host_compiler, plan.install_gcc) == ("/usr/bin/g++-11", False)


def test_default_gcc_is_kept_when_the_toolkit_accepts_it():
    plan = plan_toolchain(settings(), host_facts(GccInstall("11.4.0", {})))
    assert (plan.gcc_major, plan.host_compiler, plan.install_gcc) == (None, None, False)


def test_cpu_build_has_no_toolchain_plan():
    assert plan_toolchain(settings(llamacpp_backend="cpu"), host_facts(GccInstall("12.2.0", {}))) is None


def test_a_toolkit_installed_in_this_run_is_planned_from_its_known_ceiling():
    plan = plan_toolchain(settings(toolchain_cuda_source="debian"), host_facts(fixture("GccVersions", "debian12"), ()))
    assert (plan.toolkit_installed, plan.max_gcc, plan.host_compiler) == (False, 11, "/usr/bin/g++-11")
    conda = plan_toolchain(settings(toolchain_cuda_source="conda", toolchain_cuda_home=None),
                           host_facts(fixture("GccVersions", "debian12"), ()))  # fmt: skip
    assert conda.cuda_home == "/opt/llamarack/envs/cuda-11.8"


def test_the_build_uses_the_toolchain_plan():
    f = host_facts(fixture("GccVersions", "debian12"))
    build = plan_for_host(settings(), f)
    assert build.host_compiler == plan_toolchain(settings(), f).host_compiler == "/usr/bin/g++-11"


def test_installed_toolkit_check_waits_while_planning_and_fails_when_it_is_missing():
    plan = plan_toolchain(settings(toolchain_cuda_source="debian"), host_facts(fixture("GccVersions", "debian12"), ()))
    toolkits = fact_key(facts.CudaToolkits, extra_homes=())  # no conda toolkit: no home beyond the usual
    f = {toolkits: [], facts.GccVersions: fixture("GccVersions", "debian12")}
    commands, _ = run_op(toolkit_takes_host_compiler, f, plan=plan)
    assert commands == ["true 'checked once CUDA' 11.8 'is installed'"]
    with ctx_state.use(SimpleNamespace(is_executing=True)):
        with pytest.raises(OperationError, match="no CUDA 11.8 toolkit in /usr"):
            run_op(toolkit_takes_host_compiler, f, plan=plan)
        f[toolkits] = fixture("CudaToolkits", "debian_11_8_and_cuda13")
        commands, noops = run_op(toolkit_takes_host_compiler, f, plan=plan)
        assert commands == [] and noops == ["CUDA 11.8 in /usr takes /usr/bin/g++-11"]


def test_build_packages_make_no_apt_call_when_installed():
    installed = {p: ["1"] for p in BUILD_PACKAGES}
    commands, noops = run_op(apt_install_missing, {DebPackages: installed}, packages=BUILD_PACKAGES)
    assert commands == [] and noops


def test_a_missing_build_package_refreshes_stale_lists_then_installs_only_it():
    installed = {p: ["1"] for p in BUILD_PACKAGES if p != "ccache"}
    f = {DebPackages: installed, fact_key(File, path="/var/lib/apt/periodic/update-success-stamp"): None}
    commands, _ = run_op(apt_install_missing, f, packages=BUILD_PACKAGES)
    assert commands[0].endswith("apt-get update")
    assert commands[-1].endswith("install --no-install-recommends ccache")


def test_nonfree_sources_copy_the_hosts_archives_and_signed_by():
    text = nonfree_sources(fixture("DebianSources", "debian12"))
    assert "URIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: contrib non-free\n" \
           "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" in text  # fmt: skip
    assert "Suites: bookworm-security" in text


def test_nonfree_sources_keep_the_hosts_architectures():
    stanzas = tuple({**st, "Architectures": "amd64"} for st in fixture("DebianSources", "debian12"))
    text = nonfree_sources(stanzas)
    assert "Components: contrib non-free\nArchitectures: amd64\nSigned-By: " in text
    assert "Architectures" not in nonfree_sources(fixture("DebianSources", "debian12"))


def test_nonfree_sources_not_needed_when_the_host_has_them():
    stanzas = ({"Types": "deb", "URIs": "u", "Suites": "bookworm", "Components": "main contrib non-free"},)
    assert nonfree_sources(stanzas) == ""


def audit_item(s, installed, gcc=None, toolkits=None):
    from llamarack.audit import Seen
    from roles.toolchain.audit import items

    answers = {fact_key(DebPackages): installed}
    seen = Seen("gpu01", s, host_facts(gcc or GccInstall("12.2.0", {}), toolkits), lambda f, **kw: answers[fact_key(f, **kw)])
    return items(seen)["toolchain"]


def test_the_audit_calls_a_missing_build_package_drift_as_the_deploy_installs_it():
    everything = {p: ["1"] for p in BUILD_PACKAGES}
    cpu = settings(llamacpp_backend="cpu")
    assert not audit_item(cpu, everything).drift
    gone = audit_item(cpu, {p: v for p, v in everything.items() if p != "ccache"})
    assert gone.drift and gone.found["missing"] == ["ccache"]
    # a CUDA build's gcc-N for nvcc is one of them too, where the plan installs it
    cuda = settings()
    assert audit_item(cuda, everything).found["missing"] == ["gcc-11", "g++-11"]
    assert not audit_item(cuda, {**everything, "gcc-11": ["11"], "g++-11": ["11"]}).found["missing"]
