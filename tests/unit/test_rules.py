"""One test per row of the rule table: a passing case and a failing one."""

import pytest

import json
import re
from dataclasses import replace
from pathlib import Path

from roles.toolchain.reads import CudaToolkit, GccInstall
from roles.driver.reads import DebPackage
from roles.driver.reads import DriverState, Gpu, KernelModule, NvidiaSmi
from roles.driver.reads import NvidiaDriverPackages
from roles.preflight.rules import RULES, evaluate
from roles.preflight.facts import HostFacts
from roles.toolchain.rules import choose_host_compiler
from roles.driver.rules import driver_floor, driver_warnings, missing_gpus, missing_gpus_warning, package_driver_version
from roles.driver.rules import fallen_gpus_warning
from roles.settings import load_settings

V100 = Gpu(0, "Tesla V100-SXM2-16GB", "GPU-1", 16384, "7.0", "550.127.05")
T4 = Gpu(1, "Tesla T4", "GPU-2", 15360, "7.5", "550.127.05")
CUDA118 = CudaToolkit("/usr/local/cuda-11.8", "/usr/local/cuda-11.8/bin/nvcc", "11.8", "11.8.89", 11)
CUDA130 = CudaToolkit("/usr/local/cuda-13.0", "/usr/local/cuda-13.0/bin/nvcc", "13.0", "13.0.88", 15)
GCC11 = GccInstall("11.4.0", {11: "11.4.0"})
GCC12 = GccInstall("12.2.0", {12: "12.2.0"})


def settings(**data):
    data.setdefault("python_env_backend", "venv")
    return load_settings("gpu01", data)


def host(gpus=(V100,), driver="550.127.05", toolkits=(CUDA118,), gcc=GCC11, **kw):
    gpus = tuple(g.__class__(**{**g.__dict__, "driver_version": driver}) for g in gpus)
    return HostFacts(
        driver=kw.pop("state", DriverState("ok", gpus)),
        module=kw.pop("module", KernelModule(driver, False)),
        toolkits=toolkits,
        gcc=gcc,
        **kw,
    )


def rules_failed(s, facts):
    return [f.rule for f in evaluate(s, facts)]


def test_reference_v100_host_passes_every_rule():
    assert evaluate(settings(), host()) == []


def test_every_rule_is_in_the_table_once():
    assert len(set(RULES)) == len(RULES) == 16


# driver-installed / module / mismatch


def test_missing_driver_fails_cuda_build_but_not_cpu_build():
    facts = host(state=DriverState("missing"), module=None)
    failure = evaluate(settings(), facts)[0]
    assert failure.rule == "driver-installed"
    assert "no nvidia-smi" in failure.found and "520.61.05" in failure.needed
    assert rules_failed(settings(llamacpp_backend="cpu"), facts) == []


def test_module_not_loaded_fails_with_the_cure():
    failure = evaluate(settings(), host(state=DriverState("no_module", message="..."), module=None))[0]
    assert failure.rule == "driver-module-loaded"
    assert "dkms" in failure.fix


def test_mismatch_means_reboot_unless_llamarack_may_reboot():
    facts = host(state=DriverState("mismatch", library_version="550.144"))
    failure = evaluate(settings(), facts)[0]
    assert failure.rule == "driver-reboot-needed"
    assert "550.144" in failure.found and "550.127.05" in failure.found
    assert "reboot" in failure.fix
    assert rules_failed(settings(driver_reboot_on_mismatch=True), facts) == []


def test_other_nvidia_smi_errors_fail_with_its_words():
    failure = evaluate(settings(), host(state=DriverState("error", message="Unknown Error")))[0]
    assert failure.rule == "driver-answers" and "Unknown Error" in failure.found


# driver-floor


@pytest.mark.parametrize(
    "cuda, floor", [("11.8", "520.61.05"), ("12.4", "525.60.13"), ("13.0", "580.65.06")]
)
def test_driver_floor_follows_the_toolkit(cuda, floor):
    assert driver_floor(settings(toolchain_cuda_version=cuda)) == floor


def test_driver_floor_setting_can_raise_it_but_not_lower_it():
    assert driver_floor(settings(driver_min_version="535.0")) == "535.0"
    assert driver_floor(settings(driver_min_version="450.0")) == "520.61.05"
    assert driver_floor(settings(driver_min_version="450.0", llamacpp_backend="cpu")) == "450.0"


def test_old_driver_fails_the_floor():
    failure = evaluate(settings(), host(driver="470.182.03"))[0]
    assert failure.rule == "driver-floor"
    assert failure.found == "driver 470.182.03"
    assert "520.61.05" in failure.needed


# driver-ceiling


def test_driver_past_580_refused_on_volta():
    failure = evaluate(settings(), host(driver="590.44.01"))[0]
    assert failure.rule == "driver-ceiling"
    assert "590.44.01" in failure.found and "Tesla V100" in failure.found
    assert "580" in failure.needed


def test_driver_past_580_fine_on_turing():
    cuda124 = CudaToolkit("/usr/local/cuda-12.4", "/usr/local/cuda-12.4/bin/nvcc", "12.4", "12.4.131", 13)
    facts = host(gpus=(T4,), driver="590.44.01", toolkits=(cuda124,))
    assert rules_failed(settings(toolchain_cuda_version="12.4"), facts) == []


def test_pending_upgrade_past_580_is_refused_before_the_reboot():
    facts = host(
        state=DriverState("mismatch", library_version="590.44"),
        recorded_gpus=(V100,),
    )
    failed = rules_failed(settings(driver_reboot_on_mismatch=True), facts)
    assert failed == ["driver-ceiling"]


def test_driver_that_dropped_the_card_is_caught_from_the_record():
    facts = host(
        state=DriverState("no_devices", message="No devices were found"),
        module=KernelModule("590.44.01", True),
        recorded_gpus=(V100,),
    )
    assert rules_failed(settings(), facts) == ["driver-ceiling", "gpus-present"]


# gpus-present / build-covers-gpus


def test_cuda_build_needs_a_gpu():
    assert rules_failed(settings(), host(gpus=())) == ["gpus-present"]


def test_explicit_archs_must_cover_every_gpu():
    facts = host(gpus=(V100, T4), toolkits=(CUDA118,))
    failure = evaluate(settings(llamacpp_cuda_archs=["75"]), facts)[0]
    assert failure.rule == "build-covers-gpus" and "'70'" in failure.needed
    assert rules_failed(settings(llamacpp_cuda_archs=["70", "75"]), facts) == []
    assert rules_failed(settings(), facts) == []  # unset: build for all of them


# cpu-has-features: a build of llamacpp_cpu_features runs only on a CPU with each of them


def cpu_flags(fixture: str) -> str:
    """The CpuFlags fact from its real-output fixture (tests/facts/CpuFlags/)."""
    from roles.llamacpp.reads import CpuFlags

    data = json.loads((Path(__file__).parents[1] / "facts/CpuFlags" / f"{fixture}.json").read_text())
    assert CpuFlags().process(data["output"]) == data["fact"]
    return data["fact"]


BASELINE = ["sse42", "avx", "avx2", "bmi2", "fma", "f16c"]


def test_a_cpu_without_the_baseline_refuses_the_portable_build():
    facts = host(cpu_flags=cpu_flags("xeon_x5650_westmere"))
    failure = evaluate(settings(llamacpp_cpu_features=BASELINE), facts)[0]
    assert failure.rule == "cpu-has-features"
    assert failure.found == "a CPU without avx, avx2, bmi2, fma, f16c (its /proc/cpuinfo flags lack avx, avx2, bmi2, f16c, fma)"
    assert "['sse42', 'avx', 'avx2', 'bmi2', 'fma', 'f16c']" in failure.needed and "['sse42']" in failure.fix
    assert rules_failed(settings(llamacpp_cpu_features=["sse42"]), facts) == []
    assert rules_failed(settings(), facts) == []  # unset: built on the host for its own CPU


def test_avx512_needs_all_five_of_ggmls_flags():
    features = BASELINE + ["avx512", "avx512_vnni"]
    for fixture in ("x86_kvm_guest", "amd_epyc_kvm_guest"):  # Xeon with AMX; EPYC with AVX-512
        assert rules_failed(settings(llamacpp_cpu_features=features), host(cpu_flags=cpu_flags(fixture))) == []
    no_vl = " ".join(f for f in cpu_flags("x86_kvm_guest").split() if f != "avx512vl")
    failure = evaluate(settings(llamacpp_cpu_features=features), host(cpu_flags=no_vl))[0]
    assert failure.found == "a CPU without avx512 (its /proc/cpuinfo flags lack avx512vl)"
    amx = evaluate(settings(llamacpp_cpu_features=features + ["amx_int8"]), host(cpu_flags=cpu_flags("amd_epyc_kvm_guest")))
    assert [f.rule for f in amx] == ["cpu-has-features"] and "lack amx_int8" in amx[0].found


def test_no_flags_line_is_not_a_failure():
    assert rules_failed(settings(llamacpp_cpu_features=BASELINE), host(cpu_flags=None)) == []


# toolkit-arch


def test_cuda_13_cannot_build_for_volta():
    failure = evaluate(settings(toolchain_cuda_version="13.0"), host(driver="580.159.04", toolkits=(CUDA130,)))[0]
    assert failure.rule == "toolkit-arch"
    assert failure.found == "CUDA 13.0 for sm_70"
    assert "11.8" in failure.fix


def test_cuda_13_builds_for_turing():
    facts = host(gpus=(T4,), driver="580.159.04", toolkits=(CUDA130,), gcc=GCC12)
    assert rules_failed(settings(toolchain_cuda_version="13.0"), facts) == []


def test_hopper_needs_cuda_11_8():
    h200 = Gpu(0, "NVIDIA H200", "GPU-3", 143771, "9.0", "550.127.05")
    failure = evaluate(settings(toolchain_cuda_version="11.7"), host(gpus=(h200,), toolkits=()))[0]
    assert failure.rule == "toolkit-arch" and "11.8" in failure.needed


# toolkit-present


def test_system_toolkit_must_be_there():
    failure = evaluate(settings(), host(toolkits=(CUDA130,)))[0]
    assert failure.rule == "toolkit-present"
    assert failure.found == "13.0 in /usr/local/cuda-13.0"
    assert rules_failed(settings(toolchain_cuda_source="debian"), host(toolkits=())) == []


# gcc-for-toolkit


def test_gcc_too_new_with_nothing_installable_fails():
    failure = evaluate(settings(), host(gcc=GCC12, gcc_installable=(12,)))[0]
    assert failure.rule == "gcc-for-toolkit"
    assert failure.found == "gcc 12.2.0 and gcc-12"
    assert "gcc 11 or older" in failure.needed and "gcc-11" in failure.fix


def test_gcc_unknown_before_apt_has_lists_is_left_to_the_toolchain_role():
    assert rules_failed(settings(), host(gcc=GCC12, gcc_installable=())) == []
    assert rules_failed(settings(toolchain_install_gcc=False), host(gcc=GCC12)) == ["gcc-for-toolkit"]


def test_gcc_too_new_but_gcc_11_installable_passes():
    assert rules_failed(settings(), host(gcc=GCC12, gcc_installable=(12, 11))) == []
    assert rules_failed(settings(toolchain_install_gcc=False), host(gcc=GCC12, gcc_installable=(12, 11))) == [
        "gcc-for-toolkit"
    ]


@pytest.mark.parametrize(
    "max_gcc, gcc, installable, choice",
    [
        (11, GccInstall("11.4.0", {11: "11.4.0"}), (), (None, False)),
        (11, GccInstall("12.2.0", {11: "11.3.0", 12: "12.2.0"}), (), (11, False)),
        (11, GccInstall("12.2.0", {12: "12.2.0"}), (12, 11, 10), (11, True)),
        (15, GccInstall("12.2.0", {12: "12.2.0"}), (), (None, False)),
        (None, GccInstall("14.1.0", {}), (), (None, False)),
    ],
)
def test_choose_host_compiler(max_gcc, gcc, installable, choice):
    assert choose_host_compiler(max_gcc, gcc, installable) == choice


def test_message_names_host_value_need_and_fix():
    failure = evaluate(settings(), host(driver="590.44.01"))[0]
    text = failure.message("gpu01")
    assert text.startswith("gpu01: driver-ceiling: found driver 590.44.01")
    assert "needed a driver of the 580 branch" in text and "Fix: install a 580.xx driver" in text


# the facts real hosts print: fixtures from tests/facts

FACTS = Path(__file__).parents[1] / "facts"
NO_MODULE = DriverState("no_module", message="NVIDIA-SMI has failed because it couldn't communicate with the "
                        "NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.")
DRIVER_590 = tuple(NvidiaDriverPackages().process(
    json.loads((FACTS / "NvidiaDriverPackages/driver_590_cuda_repo.json").read_text())["output"]))


def smi_fixture(case):
    return NvidiaSmi().process(json.loads((FACTS / f"NvidiaSmi/{case}.json").read_text())["output"])


def test_package_version_is_the_upstream_driver():
    assert package_driver_version(DRIVER_590) == "590.44.01"
    assert package_driver_version((DebPackage("nvidia-driver-580", "580.95.05-0ubuntu1", True),)) == "580.95.05"
    assert package_driver_version(()) is None


def test_590_package_on_volta_is_the_ceiling_not_a_dkms_problem():
    facts = HostFacts(driver=NO_MODULE, module=None, toolkits=(CUDA118,), gcc=GCC11,
                      recorded_gpus=(V100,), driver_packages=DRIVER_590)
    failures = evaluate(settings(), facts)
    assert [f.rule for f in failures] == ["driver-ceiling"]
    assert "590.44.01" in failures[0].found and "Tesla V100" in failures[0].found
    assert "580" in failures[0].needed and "apt-mark hold" in failures[0].fix
    assert "dkms" not in failures[0].message("gpu01")


def test_no_module_without_a_legacy_card_is_still_the_dkms_cure():
    facts = HostFacts(driver=NO_MODULE, module=None, toolkits=(CUDA118,), gcc=GCC11,
                      recorded_gpus=(T4,), driver_packages=DRIVER_590)
    failure = evaluate(settings(), facts)[0]
    assert failure.rule == "driver-module-loaded" and "dkms" in failure.fix


def test_old_mismatch_message_takes_the_library_version_from_the_packages():
    state = smi_fixture("mismatch_old_driver")
    facts = host(state=state, driver_packages=DRIVER_590, recorded_gpus=(T4,))
    failures = evaluate(settings(), facts)
    assert failures[0].rule == "driver-reboot-needed"
    assert "None" not in failures[0].found and "NVML library 590.44.01" in failures[0].found
    # a V100: the reboot would boot 590, which drops it; the ceiling is the one rule, whether
    # llamarack may reboot or not (the audit and the deploy name the same)
    v100 = host(state=state, driver_packages=DRIVER_590, recorded_gpus=(V100,))
    assert rules_failed(settings(), v100) == ["driver-ceiling"]
    assert rules_failed(settings(driver_reboot_on_mismatch=True), v100) == ["driver-ceiling"]


def test_old_mismatch_without_packages_says_so_without_none():
    failure = evaluate(settings(), host(state=smi_fixture("mismatch_old_driver")))[0]
    assert "None" not in failure.found and "another version" in failure.found


def test_unknown_card_is_refused_with_the_setting_to_use():
    state = smi_fixture("unknown_card_driver_470")
    facts = HostFacts(driver=state, module=KernelModule("470.182.03", False), toolkits=(CUDA118,), gcc=GCC11)
    failures = evaluate(settings(driver_min_version="450.0", llamacpp_backend="cuda"), facts)
    known = [f for f in failures if f.rule == "gpu-known"]
    assert known and "Graphics Device (PCI device id 0x2BB110DE)" in known[0].found
    assert "llamacpp_cuda_archs" in known[0].fix
    assert "gpu-known" not in rules_failed(settings(llamacpp_cuda_archs=["86"]), facts)


def test_pg500_216_gets_its_capability_from_the_pci_id():
    state = smi_fixture("pg500_216_driver_470")
    assert state.gpus[0].compute_cap == "7.0"
    facts = HostFacts(driver=state, module=KernelModule("470.182.03", False), toolkits=(CUDA118,), gcc=GCC11)
    assert "gpu-known" not in rules_failed(settings(), facts)


def test_compute_cap_na_does_not_crash_a_rule():
    facts = host(state=smi_fixture("compute_cap_na"), driver="550.127.05")
    assert evaluate(settings(), facts) == []
    broken = Gpu(0, "Tesla V100-PCIE-32GB", "GPU-9", 32768, "[N/A]", "590.44.01")
    facts = host(state=DriverState("ok", (broken,)), driver="590.44.01")
    assert "gpu-known" in rules_failed(settings(), facts)  # no ValueError


def test_unreadable_card_line_is_named():
    state = smi_fixture("memory_na_one_card")
    failure = evaluate(settings(), host(state=state))[0]
    assert failure.rule == "gpus-readable"
    assert "[N/A]" in failure.found and "GPU-5b0d4c1e" in failure.found


def test_infororm_warning_keeps_the_card():
    facts = host(state=smi_fixture("inforom_warning"))
    assert evaluate(settings(), facts) == []
    # and is shown: preflight logs it, the audit's driver item lists it
    assert driver_warnings(facts.driver) == ("WARNING: infoROM is corrupted at gpu 0000:00:1E.0",)
    assert driver_warnings(smi_fixture("h200_ok")) == () and driver_warnings(smi_fixture("error")) == ()


def test_mixed_host_names_the_dropped_v100_and_the_ceiling():
    state = smi_fixture("mixed_v100_t4_driver_595")
    t4 = state.gpus[0]
    v100 = Gpu(0, "Tesla V100-SXM2-16GB", "GPU-v100", 16384, "7.0", "", "0x1DB110DE")
    cuda124 = CudaToolkit("/usr/local/cuda-12.4", "/usr/local/cuda-12.4/bin/nvcc", "12.4", "12.4.131", 13)
    facts = HostFacts(driver=state, module=KernelModule("595.45.04", True), toolkits=(cuda124,), gcc=GCC11,
                      recorded_gpus=(v100, t4))
    failures = evaluate(settings(toolchain_cuda_version="12.4"), facts)
    assert [f.rule for f in failures] == ["driver-ceiling"]
    assert "Tesla V100" in failures[0].found and "595.45.04" in failures[0].found


def test_a_recorded_card_gone_is_named_and_the_host_serves_from_the_cards_left():
    v100b = Gpu(1, "Tesla V100-SXM2-16GB", "GPU-gone", 16384, "7.0", "")
    facts = host(recorded_gpus=(V100, v100b))
    assert evaluate(settings(), facts) == []  # not a refusal: the gone card's unit retires
    assert missing_gpus(facts) == (v100b,)
    warning = missing_gpus_warning(settings(), facts)
    assert warning.startswith("recorded GPU(s) not listed by nvidia-smi now: Tesla V100-SXM2-16GB (GPU-gone)")
    assert "delete /opt/llamarack/state/gpus.json" in warning
    assert missing_gpus_warning(settings(), host(recorded_gpus=())) is None  # the record deleted: the live list stands


def test_a_driver_that_hides_every_card_plans_from_the_cards_listed_last_not_the_gone_ones():
    """A card gone (kept in the record as missing), then a driver upgrade waiting for its
    reboot hides the list: the run plans for the card the driver listed last, alone."""
    from dataclasses import replace

    gone = replace(Gpu(1, "Tesla V100-SXM2-16GB", "GPU-gone", 16384, "7.0", ""), missing=True)
    facts = replace(host(recorded_gpus=(V100, gone)), driver=smi_fixture("mismatch"))
    assert facts.driver.gpus == () and facts.gpus == (V100,)
    assert missing_gpus(host(recorded_gpus=(V100, gone))) == (gone,)  # still named while the driver answers


def test_mig_a100_passes():
    state = smi_fixture("a100_mig_enabled")
    facts = HostFacts(driver=state, module=KernelModule("535.129.03", False), toolkits=(CUDA118,), gcc=GCC11)
    assert evaluate(settings(), facts) == []


def test_kepler_cards_are_refused_as_unsupported_with_no_driver_fix():
    state = smi_fixture("k80_driver_470")
    failures = evaluate(settings(), host(state=state, module=KernelModule("470.256.02", False)))
    # one failure: not driver-floor's "upgrade the driver", which no Kepler card can take
    assert [f.rule for f in failures] == ["gpu-supported"]
    assert "Tesla K80 (compute capability 3.7)" in failures[0].found
    assert "llamacpp_backend = 'cpu'" in failures[0].fix and "upgrade" not in failures[0].fix
    # a CPU build does not use the card
    assert "gpu-supported" not in {f.rule for f in evaluate(settings(llamacpp_backend="cpu"), host(state=state))}


# Cards nvidia-smi cannot name: the PCI bus and the kernel's log name the cause.

def fixture(fact, case):
    from roles.driver.reads import NvidiaKernelLog, NvidiaPciCards

    cls = {"NvidiaPciCards": NvidiaPciCards, "NvidiaKernelLog": NvidiaKernelLog}[fact]
    return cls().process(json.loads((FACTS / f"{fact}/{case}.json").read_text())["output"])


def no_module(pci="h200", log="no_driver", **kw):
    return HostFacts(driver=NO_MODULE, module=None, toolkits=(CUDA118,), gcc=GCC11,
                     pci_cards=fixture("NvidiaPciCards", pci), kernel_log=fixture("NvidiaKernelLog", log), **kw)


def test_no_gpu_on_the_bus_is_named_not_a_dkms_cure():
    (failure,) = evaluate(settings(), no_module(pci="no_gpu"))
    assert failure.rule == "gpu-on-bus" and failure.found.startswith("no NVIDIA GPU on the PCI bus")
    assert "dkms" not in failure.fix
    (gone,) = evaluate(settings(), no_module(pci="no_gpu", recorded_gpus=(V100,)))
    assert "Tesla V100-SXM2-16GB (recorded at the last good run) not on the PCI bus" in gone.found


def test_nouveau_holding_the_cards_is_named_with_the_blacklist():
    (failure,) = evaluate(settings(), no_module(pci="v100_nouveau"))
    assert failure.rule == "driver-nouveau" and "nouveau holds Tesla V100 PCIe 16GB (0000:3b:00.0)" in failure.found
    assert "blacklist nouveau" in failure.fix and "update-initramfs" in failure.fix


def test_a_card_off_the_bus_is_hardware():
    (failure,) = evaluate(settings(), no_module(log="fell_off_bus"))
    assert failure.rule == "gpu-on-bus" and "fallen off the bus" in failure.found
    assert failure.fix.startswith("hardware")


def test_a_590_driver_on_a_first_run_v100_is_the_ceiling():
    # no record, a .run driver (no packages): the PCI bus names the card, the kernel the branch
    failures = evaluate(settings(), no_module(pci="v100_nouveau", log="legacy_590"))
    assert [f.rule for f in failures] == ["driver-nouveau"]  # nouveau first: the nvidia module never bound
    from roles.driver.reads import PciCard

    v100 = PciCard("0000:3b:00.0", "0x1DB410DE", None, "Tesla V100 PCIe 16GB", "7.0")  # unbound
    facts = HostFacts(driver=NO_MODULE, module=None, toolkits=(CUDA118,), gcc=GCC11, pci_cards=(v100,),
                      kernel_log=fixture("NvidiaKernelLog", "legacy_590"))
    (failure,) = evaluate(settings(), facts)
    assert failure.rule == "driver-ceiling" and "580.xx Legacy drivers" in failure.found
    assert "580.xx driver" in failure.fix and "dkms" not in failure.fix
    # with the packages' version the ceiling rule itself sees the PCI card
    facts = HostFacts(driver=NO_MODULE, module=None, toolkits=(CUDA118,), gcc=GCC11, pci_cards=(v100,),
                      driver_packages=DRIVER_590)
    assert [f.rule for f in evaluate(settings(), facts)] == ["driver-ceiling"]


# A card off the bus beside cards that still answer: the kernel's log names it whatever nvidia-smi says.
V100S = tuple(Gpu(i, "Tesla V100-SXM2-16GB", f"GPU-v100-{i}", 16384, "7.0", "550.127.05", "0x1DB110DE")
              for i in range(3))  # fmt: skip
ON_BUS_FIX = "hardware: reseat or power-cycle the card, check its power and cooling, then reboot"


def answering(gpus=V100S, log="fell_off_bus_at_probe", pci="v100_four_one_off_the_bus", **kw):
    return HostFacts(driver=DriverState("ok", gpus), module=KernelModule("550.127.05", False), toolkits=(CUDA118,),
                     gcc=GCC11, pci_cards=fixture("NvidiaPciCards", pci), kernel_log=fixture("NvidiaKernelLog", log),
                     **kw)  # fmt: skip


def test_a_card_off_the_bus_beside_cards_that_answer_is_named_by_its_slot():
    facts = answering()  # a first run: no record; the bus has four cards, the driver lists three
    assert evaluate(settings(), facts) == []  # the others serve, as for any card gone
    assert missing_gpus_warning(settings(), facts) is None
    assert fallen_gpus_warning(settings(), facts) == (
        "the GPU at PCI 0000:b3:00.0 (Tesla V100 SXM2 16GB) fell off the bus (the kernel: NVRM: The NVIDIA GPU "
        "0000:b3:00.0 ... NVRM: fallen off the bus and is not responding to commands.); listed: "
        "Tesla V100-SXM2-16GB, Tesla V100-SXM2-16GB, Tesla V100-SXM2-16GB. Serving from the cards listed (a gone "
        f"card's unit retires until it is back). Fix: {ON_BUS_FIX}")
    # every card listed: a kernel line of an earlier fall names nothing gone
    assert fallen_gpus_warning(settings(), answering(gpus=V100S + (replace(V100S[0], index=3, uuid="GPU-4"),))) is None
    assert fallen_gpus_warning(settings(), answering(log="no_driver")) is None  # gone, but not off the bus


def test_a_recorded_card_off_the_bus_is_named_once_as_fallen_with_its_uuid():
    gone = Gpu(3, "Tesla V100-SXM2-16GB", "GPU-3c1f0a2e-7f61-2f1b-8a5d-1d2c3b4a5e6f", 16384, "7.0", "")
    other = Gpu(4, "Tesla V100-SXM2-16GB", "GPU-removed", 16384, "7.0", "")
    facts = answering(log="fell_off_bus", recorded_gpus=V100S + (gone, other))
    warning = fallen_gpus_warning(settings(), facts)
    assert warning.startswith("the GPU at PCI 0000:3b:00.0 (Tesla V100-SXM2-16GB, GPU-3c1f0a2e-7f61-2f1b-8a5d-"
                              "1d2c3b4a5e6f) fell off the bus (the kernel: NVRM: Xid (PCI:0000:3b:00): 79")
    # the card the kernel names is the fall's; the other gone card keeps the plain warning
    assert missing_gpus_warning(settings(), facts).startswith(
        "recorded GPU(s) not listed by nvidia-smi now: Tesla V100-SXM2-16GB (GPU-removed); listed: ")
    assert missing_gpus(facts) == (gone, other)  # both stay recorded until they are back


def test_nvidia_smi_failing_on_a_card_off_the_bus_names_the_card_not_the_driver():
    from roles.driver.reads import PciCard

    state = smi_fixture("error")  # "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error"
    v100 = PciCard("0000:3b:00.0", "0x1DB410DE", "nvidia", "Tesla V100 PCIe 16GB", "7.0")
    facts = HostFacts(driver=state, module=KernelModule("550.127.05", False), toolkits=(CUDA118,), gcc=GCC11,
                      pci_cards=(v100,), kernel_log=fixture("NvidiaKernelLog", "fell_off_bus"))
    (failure,) = evaluate(settings(), facts)
    assert failure.rule == "gpu-on-bus" and failure.fix == ON_BUS_FIX
    assert failure.found == (
        "the GPU at PCI 0000:3b:00.0 (Tesla V100 PCIe 16GB, GPU-3c1f0a2e-7f61-2f1b-8a5d-1d2c3b4a5e6f) fell off the "
        "bus (the kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the "
        "bus.); nvidia-smi failed: Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error")
    # a card the bus does not list is named by the kernel's address, with the record's name by its UUID
    h100 = Gpu(5, "NVIDIA H100 80GB HBM3", "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b", 81559, "9.0", "")
    (failure,) = evaluate(settings(), replace(facts, pci_cards=(), recorded_gpus=(h100,),
                                              kernel_log=fixture("NvidiaKernelLog", "xid79_under_load")))
    assert failure.found.startswith("the GPU at PCI 0000:91:00 (NVIDIA H100 80GB HBM3, GPU-b6c3b2be-c55b-d076-"
                                    "fa0e-d464e4c7e08b) fell off the bus (the kernel: NVRM: Xid (PCI:0000:91:00): 79")
    # without a kernel line of it, nvidia-smi's failure is the driver's, as before
    (failure,) = evaluate(settings(), replace(facts, kernel_log=fixture("NvidiaKernelLog", "no_driver")))
    assert failure.rule == "driver-answers" and failure.found.startswith("nvidia-smi failed: Unable to determine")


def test_no_module_file_for_the_running_kernel_is_the_dkms_cure():
    (failure,) = evaluate(settings(), no_module(pci="h200", log="no_driver"))
    assert failure.rule == "driver-module-loaded" and "no nvidia module built for the running kernel" in failure.found
    assert "dkms autoinstall" in failure.fix


def test_a_kepler_card_on_the_bus_is_refused_on_a_first_run():
    from roles.driver.reads import PciCard

    k80 = PciCard("0000:04:00.0", "0x102D10DE", None, "Tesla K80", "3.7")
    failures = evaluate(settings(), HostFacts(driver=NO_MODULE, module=None, toolkits=(CUDA118,), gcc=GCC11,
                                              pci_cards=(k80,)))  # fmt: skip
    assert [f.rule for f in failures] == ["gpu-supported"]


def test_a_card_in_mig_mode_is_refused_with_what_cuda_sees():
    from roles.driver.reads import MigStates

    def mig(case):
        return MigStates().process(json.loads((FACTS / f"MigStates/{case}.json").read_text())["output"])

    a100 = smi_fixture("a100_mig_enabled")
    (two,) = evaluate(settings(), host(state=a100, mig=mig("a100_two_instances")))
    assert two.rule == "gpus-whole" and "CUDA sees 2 instance(s): 3g.20gb, 3g.20gb" in two.found
    assert "NVIDIA A100-SXM4-40GB (GPU 0) in MIG mode" in two.found and "-mig 0" in two.fix
    (none,) = evaluate(settings(), host(state=a100, mig=mig("a100_no_instances")))
    assert "no MIG instance made: CUDA sees no device" in none.found
    assert evaluate(settings(), host(mig=mig("t4_no_mig"))) == []
    assert evaluate(settings(), host(mig=mig("h200_disabled"))) == []
    assert evaluate(settings(llamacpp_backend="cpu"), host(state=a100, mig=mig("a100_two_instances"))) == []


# awq-card-memory

SHA = "a" * 40
P4 = Gpu(2, "Tesla P4", "GPU-3", 7680, "6.1", "550.127.05")
# GGUF shapes (GgufShape's keys) of Llama-3-70B and Llama-3-8B
SHAPE_70B = {"n_embd": 8192, "n_ff": 28672, "n_head": 64, "n_head_kv": 8, "head_dim_k": 128, "n_vocab": 128256,
             "n_layer": 80, "n_ctx_train": 8192}  # fmt: skip
SHAPE_8B = {**SHAPE_70B, "n_embd": 4096, "n_ff": 14336, "n_head": 32, "n_layer": 32}


def awq_settings(**data):
    return settings(**{"model_route": "awq", "model_repo": "org/llama", "model_revision": SHA, **data})


def served(made_from):
    """The served artifact, as its record says the settings ``made_from`` made it."""
    from roles.model.plan import asked_inputs
    from roles.model.reads import ArtifactState

    m = made_from.model
    record = {"stamp": "5" * 64, "source": "hf", "files": {}, "repo": m.repo, "revision": m.revision,
              "asked": dict(asked_inputs(made_from)), "gguf": {"size": 9}}  # fmt: skip
    return ArtifactState(record["stamp"], 9, 9, record)


def awq_host(shape, gpus=(V100, P4), made_from=None):
    """A host serving the route gguf artifact of the same checkpoint, about to take route awq."""
    return host(gpus=gpus, served_model=served(made_from or settings(model_repo="org/llama", model_revision=SHA)),
                served_shape=shape)  # fmt: skip


def test_awq_calibration_the_smallest_card_cannot_hold_is_refused_with_the_figures():
    (failure,) = evaluate(awq_settings(), awq_host(SHAPE_70B))
    assert failure.rule == "awq-card-memory"
    assert failure.message("gpu01").startswith(
        "gpu01: awq-card-memory: found Tesla P4 (GPU 2, the host's smallest card) of 7.50 GiB; needed 13.31 GiB "
        "to calibrate one decoder layer (1.59 GiB of fp16 weights, activations of at most 3689 calibration "
        "tokens, the scale search's copies of the layer, embedding, 1 GiB loss chunk)")
    assert failure.fix == "a bigger card, a shorter model_awq_calibration_file, or model_route='gguf'"


def test_awq_calibration_a_card_holds_passes():
    assert evaluate(awq_settings(), awq_host(SHAPE_8B)) == []  # 4.81 GiB on 7.50
    assert evaluate(awq_settings(), awq_host(SHAPE_70B, gpus=(V100,))) == []  # 13.31 GiB on 16


def test_awq_calibration_on_the_cpu_is_not_refused_by_memory():
    s = awq_settings(llamacpp_backend="cpu")
    assert evaluate(s, awq_host(SHAPE_70B, made_from=settings(model_repo="org/llama", model_revision=SHA,
                                                                 llamacpp_backend="cpu"))) == []  # fmt: skip


def test_route_gguf_is_not_checked_for_calibration():
    assert evaluate(settings(model_repo="org/llama", model_revision=SHA), awq_host(SHAPE_70B)) == []


def test_awq_calibration_is_checked_only_when_it_will_run_and_the_shape_is_known():
    # the served artifact is the one route awq asks for: nothing is calibrated
    assert evaluate(awq_settings(), awq_host(SHAPE_70B, made_from=awq_settings())) == []
    # another checkpoint, with no counts from the hub (the audit; a hub that could not say): the AWQ step checks it
    assert evaluate(awq_settings(model_repo="org/other"), awq_host(SHAPE_70B)) == []
    assert evaluate(awq_settings(), host(gpus=(P4,))) == []  # nothing served
    # the model role does not run: nothing is calibrated
    assert evaluate(awq_settings(llamarack_roles="driver"), awq_host(SHAPE_70B)) == []


def test_awq_calibration_is_counted_from_the_text_with_no_tokenizer(tmp_path):
    from roles.model.files.awq_apply import tokens_at_most

    text = tmp_path / "calibration.txt"
    text.write_text("A short text.\n\nAnd another paragraph, é.\n")
    assert tokens_at_most(text.read_text()) == (13 + 3) + (26 + 3)
    assert tokens_at_most("word " * 200_000) == 128 * 512  # AutoAWQ's most
    small = awq_settings(model_awq_calibration_file=str(text))
    assert evaluate(small, awq_host(SHAPE_70B, made_from=settings(model_repo="org/llama", model_revision=SHA)))[0] \
        .needed.startswith("12.53 GiB")  # fmt: skip


def test_preflight_reads_the_served_artifact_only_for_awq_calibration_on_the_cards():
    from roles.model.reads import GgufShape, ModelArtifact
    from roles.preflight.reads import gather, preflight_reads

    state = served(settings(model_repo="org/llama", model_revision=SHA))

    def read(fact, **kwargs):
        return {NvidiaSmi: DriverState("ok", (P4,)), ModelArtifact: state, GgufShape: SHAPE_70B}.get(fact,
                                                                                                    fact().default())

    awq, cpu = awq_settings(), awq_settings(llamacpp_backend="cpu")
    assert {ModelArtifact, GgufShape} <= {r.fact for r in preflight_reads(awq)}
    assert GgufShape not in {r.fact for r in preflight_reads(cpu)}
    facts = gather(awq, read=read)
    assert (facts.served_model, facts.served_shape) == (state, SHAPE_70B)
    assert "awq-card-memory" in [f.rule for f in evaluate(awq, facts)]
    assert gather(cpu, read=read).served_model is None


def _codes(function) -> list:
    """The rule names a rule can return, in source order: the first argument of each
    ``Failure(...)`` in its body and in the functions of its module it calls."""
    import ast
    import inspect
    import sys

    module = sys.modules[function.__module__]
    tree = {n.name: n for n in ast.parse(inspect.getsource(module)).body if isinstance(n, ast.FunctionDef)}

    def found(name: str, seen: tuple) -> list:
        calls = sorted((n for n in ast.walk(tree[name]) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)),
                       key=lambda n: (n.lineno, n.col_offset))  # fmt: skip
        out = []
        for call in calls:
            if call.func.id == "Failure" and isinstance(call.args[0], ast.Constant):
                out.append(call.args[0].value)
            elif call.func.id in tree and call.func.id not in seen:
                out += found(call.func.id, seen + (call.func.id,))
        return out

    return list(dict.fromkeys(found(function.__name__, (function.__name__,))))


def test_the_docs_list_every_rule_in_the_order_they_run():
    """docs/deploy.md's table of rules is the code's: every name a rule returns is in it, it
    names no other, and its rows follow ``RULES`` (each role's rules, as preflight runs them)."""
    docs = (Path(__file__).resolve().parents[2] / "docs/deploy.md").read_text()
    table = docs.split("## The rules, in the order they run", 1)[1].split("\n\n", 2)[1]
    rows = [re.findall(r"`([a-z0-9-]+)`", line.split(" | ")[0]) for line in table.splitlines()[2:]]
    rows = [r for r in rows if "context-trained" not in r]  # the server role's, once the model is known
    codes = [_codes(rule) for rule in RULES]
    assert {c for r in rows for c in r} == {c for cs in codes for c in cs}
    firsts = [cs[0] for cs in codes]
    assert [r[0] for r in rows if r[0] in firsts] == firsts
