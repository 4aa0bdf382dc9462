"""One test per row of the rule table: a passing case and a failing one."""

import pytest

from llamarack.facts import CudaToolkit, DriverState, GccInstall, Gpu, KernelModule
from llamarack.rules import RULES, HostFacts, choose_host_compiler, driver_floor, evaluate
from llamarack.settings import load_settings

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
    assert len(set(RULES)) == len(RULES) == 8


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
