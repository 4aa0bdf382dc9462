"""The llama.cpp build operation and its plan; the simpler operations are JSON fixtures (tests/operations/)."""

import dataclasses
import json

from llamarack import remote
from roles.llamacpp.files.build_seal import BUILD_INPUTS
from roles.llamacpp.plan import build_dir_for, plan_build
from roles.llamacpp.reads import Builds, BuildSeals, LlamacppBuilds, Seals
from roles.llamacpp.operations import build, proof_spec, reprove
from roles.settings import load_settings
from tests.support.ophost import fact_key, run_op

SHA = "dccad28c67854048fcdf644803b3f54e152d99a8"
ROOT = "/opt/llamarack"


def settings(**data):
    return load_settings("gpu01", {"python_env_backend": "venv", **data})


def on_host(builds: Builds = None, seals: Seals = None) -> dict:
    """The facts of ROOT's builds the operations read: its listing, its seals."""
    facts = {fact_key(LlamacppBuilds, root=ROOT): builds} if builds is not None else {}
    return {**facts, fact_key(BuildSeals, root=ROOT): seals} if seals is not None else facts


def test_cpu_build_configures_builds_verifies_then_proves():
    plan = plan_build(settings(llamacpp_backend="cpu"))
    commands, _ = run_op(build, on_host(Builds(None, {})), plan=plan, src="/s", root=ROOT)
    d = f"{ROOT}/builds/{plan.stamp}"
    assert commands[0] == f"rm -rf {d} && mkdir -p {d}"
    assert "cmake -S /s -B build" in commands[1] and "-DGGML_CUDA=OFF" in commands[1]
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in commands[1] and "-DLLAMA_BUILD_UI=OFF" in commands[1]
    assert "--target llama-server llama-quantize llama-bench llama-cli" in commands[2]
    assert "llama-server --version" in commands[4] and "grep -q 0c1e57098" in commands[4]
    assert "server-help.txt" in commands[5]
    assert not any("cuobjdump" in c for c in commands if isinstance(c, str))
    # The smoke run is last, and it is what writes build-info.json; its spec is uploaded
    # through a private directory just before it.
    private = "/tmp/llamarack-upload-RANDOM"
    assert commands[6] == f"umask 077 && mkdir -m 700 {private} && install -m 600 /dev/null {private}/file"
    spec_upload = commands[7]
    assert spec_upload[:2] == ("upload", f"{d}/proof-spec.json")
    assert commands[8] == f"rm -rf {private}"
    assert commands[9] == remote.command("llamacpp_proof", f"{d}/proof-spec.json")
    assert len(commands) == 10 and not any("build-info.json" in c for c in commands[:-1] if isinstance(c, str))
    spec = json.loads(spec_upload[2])
    assert spec["build_dir"] == d and spec["record"]["stamp"] == plan.stamp
    assert spec["serving"] == {"cache_type_k": "q4_0", "cache_type_v": "q4_0", "flash_attn": True,
                               "mmap": False, "repack": True, "gpu_layers": None}
    assert spec["quant"] == "Q4_K_M"


def test_ladder_native_then_no_repack_then_portable_rebuilds():
    plan = plan_build(settings(llamacpp_backend="cpu"))
    rungs = proof_spec(plan, "/b/x", "/s", "env", None, None)["rungs"]
    assert [r["name"] for r in rungs] == ["native", "native, no repack", "x86-64-v3", "x86-64-v2"]
    assert rungs[1]["serving"] == {"repack": False} and "configure" not in rungs[1]
    v3 = rungs[2]
    assert v3["x86_only"] and "-DGGML_NATIVE=OFF" in v3["cmake_args"] and "-DGGML_AVX2=ON" in v3["cmake_args"]
    assert "-DGGML_AVX512=OFF" in v3["cmake_args"] and "-DGGML_AMX_INT8=OFF" in v3["cmake_args"]
    # A rebuild appends to the logs of the build it replaces.
    assert ">> configure.log" in v3["configure"] and "tee -a build.log" in v3["build"]
    assert "'-DGGML_AVX2=OFF'" in rungs[3]["configure"] or "-DGGML_AVX2=OFF" in rungs[3]["configure"]


def test_no_fallback_is_one_rung_and_no_repack_is_asked_for():
    plan = plan_build(settings(llamacpp_backend="cpu", llamacpp_cpu_fallback=False,
                               llamacpp_cpu_features=["avx2", "fma", "f16c"], server_repack=False))  # fmt: skip
    spec = proof_spec(plan, "/b/x", "/s", "env", None, None)
    assert [r["name"] for r in spec["rungs"]] == ["x86 avx2,fma,f16c"]
    assert spec["serving"]["repack"] is False
    assert "-DGGML_NATIVE=OFF" in plan.cmake_args and "-DGGML_AVX512=OFF" in plan.cmake_args


def test_cuda_smoke_puts_every_layer_on_the_gpu():
    plan = plan_build(settings(server_gpu_layers=20), archs=("70",), cuda_home="/usr", cuda_version="11.8")
    assert plan.proof["serving"]["gpu_layers"] == 999


def test_cuda_build_refuses_a_binary_without_every_arch():
    plan = plan_build(settings(), archs=("70", "75"), cuda_home="/usr/local/cuda-11.8",
                      cuda_version="11.8", host_compiler="/usr/bin/g++-11")  # fmt: skip
    commands, _ = run_op(build, on_host(Builds(None, {})), plan=plan, src="/s", root=ROOT)
    configure = commands[1]
    assert "-DGGML_CUDA=ON" in configure and "'-DCMAKE_CUDA_ARCHITECTURES=70;75'" in configure
    assert "-DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++-11" in configure
    assert "PATH=/usr/local/cuda-11.8/bin:$PATH" in configure
    assert "-DGGML_CUDA_FA_ALL_QUANTS=ON" not in configure  # q4_0/q4_0 has kernels
    checks = [c for c in commands if "cuobjdump" in c or ".cubin" in c]
    assert "/usr/local/cuda-11.8/bin/cuobjdump --list-elf" in checks[0]
    assert "sm_70\\.cubin" in checks[1] and "sm_75\\.cubin" in checks[2]
    # the smoke run (which writes the record) comes after the arch checks
    assert commands.index(checks[-1]) < len(commands) - 1
    assert commands[-1].startswith("python3 ") and commands[-1].endswith("proof-spec.json")
    spec = json.loads(commands[-3][2])
    assert spec["serving"]["gpu_layers"] == 999


def test_mixed_kv_cache_types_build_all_fa_quants():
    plan = plan_build(settings(server_cache_type_k="q8_0"), archs=("70",), cuda_home="/usr", cuda_version="11.8")
    assert "-DGGML_CUDA_FA_ALL_QUANTS=ON" in plan.cmake_args


def test_auto_kv_builds_as_q4_0_did_and_needs_no_mixed_kernels():
    # auto resolves per model, after the build: both sides pick one same-type pair, and the
    # smoke run proves q4_0/q4_0, so the build (flags, stamp) is the old default's
    toolchain = dict(archs=("70",), cuda_home="/usr", cuda_version="11.8")
    auto = plan_build(settings(), **toolchain)
    old_default = plan_build(settings(server_cache_type_k="q4_0", server_cache_type_v="q4_0"), **toolchain)
    assert auto.stamp == old_default.stamp and "-DGGML_CUDA_FA_ALL_QUANTS=ON" not in auto.cmake_args
    assert auto.proof["serving"]["cache_type_k"] == auto.proof["serving"]["cache_type_v"] == "q4_0"
    # without flash attention an auto V stays f16 in the plan, so in the smoke run too
    no_fa = plan_build(settings(server_flash_attn=False), **toolchain)
    assert (no_fa.proof["serving"]["cache_type_k"], no_fa.proof["serving"]["cache_type_v"]) == ("q4_0", "f16")
    # one side auto beside a fixed one can mix types
    mixed = plan_build(settings(server_cache_type_v="f16"), **toolchain)
    assert "-DGGML_CUDA_FA_ALL_QUANTS=ON" in mixed.cmake_args


def test_build_is_a_noop_when_verified():
    plan = plan_build(settings(llamacpp_backend="cpu"))
    commands, noops = run_op(build, on_host(Builds(None, {plan.stamp: 1}), Seals({plan.stamp: []})),
                             plan=plan, src="/s", root=ROOT)  # fmt: skip
    assert commands == [] and "exists and was verified" in noops[0]


def test_a_verified_build_whose_files_differ_from_its_seal_is_not_taken_for_built():
    plan = plan_build(settings(llamacpp_backend="cpu"))
    tampered = Seals({plan.stamp: ["build/bin/llama-quantize: size 14328 (sealed: 2514432)"]})
    commands, _ = run_op(build, on_host(Builds(None, {plan.stamp: 1}), tampered),
                         plan=plan, src="/s", root=ROOT)  # fmt: skip
    assert_built_anew(commands, plan)


def assert_built_anew(commands, plan) -> None:
    """What is in the build's directory is removed, then the build made as on a host without it."""
    d = f"/opt/llamarack/builds/{plan.stamp}"
    assert commands[0] == f"rm -rf {d} && mkdir -p {d}"
    assert commands == run_op(build, on_host(Builds(None, {})), plan=plan, src="/s", root=ROOT)[0]


def test_a_proven_build_is_sealed_once():
    from llamarack import remote
    from roles.llamacpp.operations import seal_build

    commands, _ = run_op(seal_build, on_host(seals=Seals({}, ("3f1c0a9e52d7b6e4",))), root=ROOT, stamp="3f1c0a9e52d7b6e4")
    assert [str(c) for c in commands] == [remote.command("build_seal", "seal", f"{ROOT}/builds/3f1c0a9e52d7b6e4")]
    commands, noops = run_op(seal_build, on_host(seals=Seals({"3f1c0a9e52d7b6e4": []})), root=ROOT,
                             stamp="3f1c0a9e52d7b6e4")  # fmt: skip
    assert commands == [] and noops == ["llama.cpp build 3f1c0a9e52d7b6e4 is sealed"]


def test_failed_partial_build_is_built_again():
    plan = plan_build(settings(llamacpp_backend="cpu"))
    commands, _ = run_op(build, on_host(Builds(None, {}, (plan.stamp,))), plan=plan, src="/s", root=ROOT)
    assert_built_anew(commands, plan)


def test_stamp_follows_every_build_input_but_not_the_driver_nor_the_proof():
    cuda = dict(archs=("70",), cuda_home="/usr", cuda_version="11.8")
    base = plan_build(settings(), **cuda)
    assert plan_build(settings(), **cuda) == base
    for other in (
        plan_build(settings(llamacpp_commit="a" * 40), **cuda),
        plan_build(settings(), archs=("75",), cuda_home="/usr", cuda_version="11.8"),
        plan_build(settings(), archs=("70",), cuda_home="/usr/local/cuda-12.4", cuda_version="12.4"),
        plan_build(settings(), **cuda, host_compiler="/usr/bin/g++-11"),
        plan_build(settings(server_cache_type_v="q8_0"), **cuda),  # mixed K/V: -DGGML_CUDA_FA_ALL_QUANTS
        plan_build(settings(llamacpp_backend="cpu")),
        plan_build(settings(llamacpp_cpu_features=["avx2"]), **cuda),
    ):
        assert other.stamp != base.stamp
    # How the build is proven has its own id: a new proof re-proves the build, it builds nothing.
    for proven_otherwise in (
        plan_build(settings(server_flash_attn=False, server_cache_type_v="f16", server_cache_type_k="f16"), **cuda),
        plan_build(settings(model_quant="Q8_0"), **cuda),
        plan_build(settings(server_repack=False), **cuda),
        plan_build(settings(llamacpp_cpu_fallback=False), **cuda),
    ):
        assert (proven_otherwise.stamp, proven_otherwise.cmake_args) == (base.stamp, base.cmake_args)
        assert proven_otherwise.proof_id != base.proof_id


def test_a_new_proof_script_changes_the_proof_id_only(monkeypatch):
    from roles.llamacpp import plan as build_plan

    cuda = dict(archs=("70",), cuda_home="/usr", cuda_version="11.8")
    base = plan_build(settings(), **cuda)
    monkeypatch.setattr(build_plan, "PROOF_SCRIPT_SHA256", "0" * 64)
    again = plan_build(settings(), **cuda)
    assert again.stamp == base.stamp and again.proof_id != base.proof_id


def test_a_build_stamped_when_stamps_covered_its_proof_is_found_by_its_inputs():
    """The stamp of a build's inputs is computed from its record, so a build made under the
    old scheme (its directory named by a stamp that hashed the proof too) is the build."""
    plan = plan_build(settings(llamacpp_backend="cpu"))
    record = json.loads(plan.record())
    seals = BuildSeals().process([json.dumps({"builds": {"0123456789abcdef": {
        "sealed": True, "changed": [], "inputs": {k: record[k] for k in BUILD_INPUTS},
        "proof_id": None, "proof_failed": None}}})])
    builds = Builds("0123456789abcdef", {"0123456789abcdef": 1764441600})
    assert seals.stamps == {"0123456789abcdef": plan.stamp}
    assert build_dir_for(plan.stamp, builds, seals, proof_id=plan.proof_id) == "0123456789abcdef"
    # a build that failed this proof when re-proved is built again beside it
    failed = dataclasses.replace(seals, failed={"0123456789abcdef": plan.proof_id})
    assert build_dir_for(plan.stamp, builds, failed, proof_id=plan.proof_id) == plan.stamp


def test_a_new_proof_reproves_the_build_in_place():
    plan = plan_build(settings(llamacpp_backend="cpu"))
    stale = Seals({plan.stamp: []}, proofs={plan.stamp: "0" * 16})
    commands, noops = run_op(reprove, on_host(seals=stale), plan=plan, src="/s", root=ROOT)
    assert commands[1][:2] == ("upload", f"{ROOT}/builds/{plan.stamp}/proof-spec.json")
    spec = json.loads(commands[1][2])
    assert spec["reprove"] is True and spec["record"]["proof_id"] == plan.proof_id
    assert not any(rung.get("configure") for rung in spec["rungs"]), "a build in service is never rebuilt in place"
    assert "llamacpp_proof" in str(commands[3]) and "build_seal" in str(commands[3]) and len(commands) == 4
    current = Seals({plan.stamp: []}, proofs={plan.stamp: plan.proof_id})
    commands, noops = run_op(reprove, on_host(seals=current), plan=plan, src="/s", root=ROOT)
    assert commands == [] and noops == [f"llama.cpp build {plan.stamp} is proven by proof {plan.proof_id}"]


def test_hosts_sharing_a_ccache_compile_one_at_a_time():
    plan = plan_build(settings(llamacpp_backend="cpu"))
    commands, _ = run_op(build, on_host(Builds(None, {})), plan=plan, src="/s", root=ROOT,
                         ccache_dir="/nfs/ccache")  # fmt: skip
    assert "{ flock /nfs/ccache/llamarack-build.lock env CCACHE_BASEDIR=" in commands[2]
    assert "CCACHE_DIR=/nfs/ccache" in commands[1]


def test_plan_for_a_cuda_host_uses_the_toolkits_gcc_ceiling():
    from roles.toolchain.reads import CudaToolkit, GccInstall
    from roles.driver.reads import DriverState, Gpu
    from roles.preflight.facts import HostFacts
    from roles.llamacpp.plan import plan_for_host

    v100 = Gpu(0, "Tesla V100-SXM2-16GB", "GPU-1", 16384, "7.0", "550.127.05")
    cuda118 = CudaToolkit("/usr", "/usr/bin/nvcc", "11.8", "11.8.89", 11)
    facts = HostFacts(DriverState("ok", (v100,)), None, (cuda118,), GccInstall("12.2.0", {12: "12.2.0"}), (12, 11))
    plan = plan_for_host(settings(), facts)
    assert (plan.cuda_archs, plan.cuda_home, plan.host_compiler) == (("70",), "/usr", "/usr/bin/g++-11")
    # No apt lists yet (nothing known installable): the toolchain role installs gcc-11 first.
    unknown = HostFacts(DriverState("ok", (v100,)), None, (cuda118,), GccInstall("12.2.0", {12: "12.2.0"}), ())
    assert plan_for_host(settings(), unknown).host_compiler == "/usr/bin/g++-11"
    # Toolkit not installed yet (Debian's, installed later in the run): its known ceiling.
    fresh = HostFacts(DriverState("ok", (v100,)), None, (), GccInstall("12.2.0", {12: "12.2.0"}), ())
    fresh_plan = plan_for_host(settings(toolchain_cuda_source="debian"), fresh)
    assert (fresh_plan.cuda_home, fresh_plan.host_compiler) == ("/usr", "/usr/bin/g++-11")
    assert fresh_plan.stamp == plan.stamp


def test_a_shared_build_is_one_step_that_compiles_or_receives_when_the_run_reaches_it():
    """With a key (ship.build_key) the build is one FunctionCommand: ship.obtain decides at run
    time whether this host compiles (the same commands as a build of its own) or receives."""
    from pyinfra.api import FunctionCommand
    from pyinfra.context import ctx_host

    from roles.llamacpp import ship
    from roles.llamacpp.operations import build_commands
    from tests.support.ophost import FakeHost, FakeState

    plan = plan_build(settings(llamacpp_backend="cpu"))
    fake = FakeHost(on_host(Builds(None, {})), state=FakeState(True, False))
    with ctx_host.use(fake):
        (step,) = list(build._inner(plan=plan, src="/s", root=ROOT, key="k1"))
        own = build_commands(plan, "/s", ROOT)
    assert isinstance(step, FunctionCommand) and step.function is ship.obtain
    key, root, name, commands, spec = step.args
    assert (key, root, name) == ("k1", ROOT, plan.stamp)
    assert [str(c) for c in commands][:6] == [str(c) for c in own][:6]  # the uploads' private names differ
    # a received build is re-proven here: no rebuild rung (its source is not on this host)
    assert spec["reprove"] and not any("configure" in r for r in spec["rungs"])


def test_a_host_holding_the_sealed_build_is_a_source_for_the_run():
    from pyinfra.context import ctx_host

    from llamarack import ship
    from tests.support.ophost import FakeHost, FakeState

    plan = plan_build(settings(llamacpp_backend="cpu"))
    fake = FakeHost(on_host(Builds(plan.stamp, {plan.stamp: 1}), Seals({plan.stamp: []})), state=FakeState(True, False))
    with ctx_host.use(fake):
        assert list(build._inner(plan=plan, src="/s", root=ROOT, key="k2")) == []
    assert fake.noops == [f"llama.cpp build {plan.stamp} exists and was verified"]
    (holder,) = ship.for_state(fake.state).holders["k2"]
    assert holder.host is fake and holder.path == f"{ROOT}/builds/{plan.stamp}"
    # an unsealed build (proven before seals) cannot be checked on arrival: no source
    other = FakeHost(on_host(Builds(plan.stamp, {plan.stamp: 1}), Seals({}, (plan.stamp,))), state=FakeState(True, False))
    with ctx_host.use(other):
        list(build._inner(plan=plan, src="/s", root=ROOT, key="k3"))
    assert not ship.for_state(other.state).holders["k3"]
