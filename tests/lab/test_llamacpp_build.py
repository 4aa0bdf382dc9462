"""The llama.cpp role on a lab host, through the real deploy.py over SSH.

A real CPU build from the lab's pinned git mirror, proven by a smoke run
before it is switched in; a second run builds nothing and leaves the host
as it was; a build that cannot compute is refused with current and the
served unit untouched, and with fallback on, a rebuild for fewer extensions
takes the place of a first rung that fails (built for AVX-512: on a CPU
without it, SIGILL; on one with it, a lab commit that aborts when compiled
for AVX-512, so the test runs on every CPU); a new
commit builds a new directory and switches to it, keeping the previous one;
a commit that fails to build leaves the serving build current. Tests run in
order and share the host.
"""

import json

import pytest

from roles.llamacpp.reads import parse_server_help
from llamarack_lab import faults, mirror, services
from llamarack_lab.pytest_plugin import parse_pyinfra_totals
from tests.lab import deploying

pytestmark = pytest.mark.lab

HOST = "lab-v100-a"
BUILDS = "/opt/llamarack/builds"


def deploy(lab_rack, *data: str):
    return deploying.deploy(lab_rack, HOST, *data)


def sh(lab_rack, command: str) -> str:
    return deploying.sh(lab_rack, HOST, command)


def snapshot(lab_rack) -> str:
    """Everything llamarack owns on the host: paths, sizes, mtimes, link targets."""
    return sh(lab_rack, "find /opt/llamarack -printf '%p %s %T@ %l\\n' | sort")


SEEN = {}  # what earlier tests of this module saw


def current(lab_rack) -> str:
    return sh(lab_rack, f"readlink {BUILDS}/current")


@pytest.fixture(scope="module")
def lab_mirror():
    return services.prepare()


def test_first_deploy_builds_verifies_and_switches(lab_rack):
    rc, out = deploy(lab_rack)
    assert rc == 0, out[-4000:]
    stamp = SEEN["pinned"] = current(lab_rack)
    SEEN["pinned_record"] = sh(lab_rack, f"stat -c %Y {BUILDS}/{stamp}/build-info.json")
    assert sh(lab_rack, f"cat {BUILDS}/{stamp}/build-info.json").count(mirror.LAB_COMMIT) == 1
    version = sh(lab_rack, f"{BUILDS}/current/bin/llama-server --version 2>&1")
    assert mirror.LAB_COMMIT[:9] in version
    assert sh(lab_rack, "git -C /opt/llamarack/src/llama.cpp rev-parse HEAD") == mirror.LAB_COMMIT


def test_second_deploy_changes_nothing_on_the_host(lab_rack):
    before = snapshot(lab_rack)
    rc, out = deploy(lab_rack)
    assert rc == 0, out[-4000:]
    totals = parse_pyinfra_totals(out)
    assert totals["success"] == 0 and totals["error"] == 0, out[-4000:]
    assert "cmake" not in out
    assert snapshot(lab_rack) == before


UNIT = "/etc/systemd/system/llamarack-server.service"


def record(lab_rack, stamp: str = "current") -> dict:
    return json.loads(sh(lab_rack, f"cat {BUILDS}/{stamp}/build-info.json"))


def served(lab_rack) -> tuple:
    """What serves now: the unit's bytes, the service's PID, the unit's ExecStart."""
    return (sh(lab_rack, f"sha256sum {UNIT}"),
            sh(lab_rack, "systemctl show -p MainPID --value llamarack-server.service"),
            sh(lab_rack, f"grep ^ExecStart= {UNIT}"))  # fmt: skip


def test_the_build_computed_before_it_was_switched_in(lab_rack):
    proof = record(lab_rack)["proof"]
    assert proof["variant"] == "native" or proof["attempts"][0]["ok"] is False, proof
    assert proof["attempts"][-1] == {"variant": proof["variant"], "ok": True}
    assert proof["tokens"] == 8 and proof["tokens_per_second"] > 0 and proof["prompt_tokens_per_second"] > 0
    assert proof["model"]["quant"] == "Q4_K_M" and proof["devices"] == ["none but the CPU"]
    # The smoke run used the runtime flags the unit serves with (and the unit carries
    # any flag the smoke run needed to compute). The KV type is "auto" (the planner picks
    # it per model): the proof computed with q4_0, the least common of its choices, and
    # the unit's type is one of them, the same for K and V.
    exec_start = served(lab_rack)[2]
    assert "--cache-type-k q4_0 --cache-type-v q4_0" in " ".join(proof["flags"])
    assert any(f"--cache-type-k {t} --cache-type-v {t}" in exec_start for t in ("f16", "q8_0", "q4_0")), exec_start
    for flag in ("--flash-attn on", "--load-mode none", *proof["runtime_args"]):
        assert flag in " ".join(proof["flags"]) and flag in exec_start, (flag, exec_start)
    # A batch as large as llama-bench's, and llama-bench itself as the bench runs it (the lab
    # builds no llama-perplexity: model_quality is off).
    assert proof["batch"] == 512 and proof["tools"] == ["llama-bench"], proof
    assert sh(lab_rack, f"ls {BUILDS}/current/smoke/").split() == [
        "bench.log", "quantize.log", *[f"server-{i + 1}.log" for i in range(len(proof["attempts"]))],
        "smoke-Q4_K_M.gguf", "smoke-f16.gguf"]


# Where ggml's CPU code computes its first kernel (ggml-cpu.c), in the pinned llama.cpp:
# the change goes between these two.
BEFORE_KERNEL, KERNEL = "    GGML_ASSERT(params);\n\n", "    if (tensor->op == GGML_OP_NONE"


def dies_at_first_kernel(says: str, only_if: str = "") -> dict:
    """A commit's change: ggml's CPU code aborts at the first kernel it runs, printing ``says``;
    with ``only_if``, only in a build where that preprocessor condition holds."""
    # abort() itself, not GGML_ABORT: that one forks to print a backtrace, and two
    # worker threads doing so at once can hang instead of dying.
    body = ("    if (tensor->op != GGML_OP_NONE && !ggml_is_empty(tensor)) {\n"
            f"        fputs(\"llamarack lab test: {says}\\n\", stderr);\n"
            "        abort();\n    }\n")  # fmt: skip
    if only_if:
        body = f"#if {only_if}\n{body}#endif\n"
    return {"ggml/src/ggml-cpu/ggml-cpu.c": (BEFORE_KERNEL + KERNEL, BEFORE_KERNEL + body + "\n" + KERNEL)}


# A commit that builds, names itself and answers --help, then dies at the first
# kernel it runs (as a build without code for the card, or AMX on a virtual CPU
# that faults): on any CPU, only a computation can tell it from a good build.
DIES_AT_FIRST_KERNEL = dies_at_first_kernel("this build dies at its first kernel")

# The same, only in a build compiled for AVX-512 (gcc defines __AVX512F__ under ggml's
# -mavx512f): the build as asked dies, the ladder's x86-64-v3 rebuild computes.
DIES_IF_BUILT_FOR_AVX512 = dies_at_first_kernel("built for AVX-512, this build dies at its first kernel",
                                                only_if="defined(__AVX512F__)")

# x86-64-v3 (ggml's x86 levels build on each other) and AVX-512: the ladder's first rung.
V3_AND_AVX512 = ["sse42", "avx", "avx2", "bmi2", "fma", "f16c", "avx512"]


def failing_first_rung(lab_rack, lab_mirror) -> tuple:
    """The deploy's data whose first rung cannot compute on this machine's CPU, and the words
    its failure must show: (data, words in its ``why``, words in its output tail or None).

    A build for AVX-512 on a CPU without it dies by itself (SIGILL at the first AVX-512
    instruction). A CPU with AVX-512 runs that build: there the lab injects the fault, a
    commit of its mirror whose CPU code aborts when it was compiled for AVX-512, so the
    build as asked dies and the rebuilds without AVX-512 do not. Nothing in the product
    knows of it: the ladder climbs as it would on a CPU that lacks the extension."""
    data = [f"llamacpp_cpu_features={json.dumps(V3_AND_AVX512)}"]
    if "avx512f" not in sh(lab_rack, "grep -m1 '^flags' /proc/cpuinfo").split():
        return data, "died with SIG", None
    dies = mirror.add_named_commit(lab_mirror, "lab-test-dies-avx512", "lab test: dies when built for AVX-512",
                                   DIES_IF_BUILT_FOR_AVX512)  # fmt: skip
    return data + [f"llamacpp_commit={dies}"], "died with SIGABRT", "built for AVX-512, this build dies"


def test_a_build_that_cannot_compute_is_refused_and_nothing_changes(lab_rack, lab_mirror):
    serving, before = current(lab_rack), served(lab_rack)
    # The branch is named by its change: a mirror kept in the cache never serves an older one.
    dies = mirror.add_named_commit(lab_mirror, "lab-test-dies", "lab test: dies at its first kernel", DIES_AT_FIRST_KERNEL)
    rc, out = deploy(lab_rack, f"llamacpp_commit={dies}", "llamacpp_cpu_fallback=False")
    assert rc != 0
    assert "cannot compute, refusing it" in out, out[-4000:]
    assert "died with SIGABRT" in out and "dies at its first kernel" in out, out[-4000:]  # llama.cpp's own words
    assert current(lab_rack) == serving and served(lab_rack) == before
    # The refused build compiled and answered --version, but never counts.
    refused = sh(lab_rack, f"grep -l {dies[:9]} {BUILDS}/*/version.txt").split()
    assert refused and all(sh(lab_rack, f"ls {p.rsplit('/', 1)[0]}").count("build-info.json") == 0 for p in refused)
    rc, out = deploy(lab_rack)  # back to the pinned commit: no build, the refused one is pruned
    assert rc == 0, out[-4000:]
    assert current(lab_rack) == serving and "cmake" not in out


def test_with_fallback_a_rebuild_for_fewer_extensions_takes_its_place(lab_rack, lab_mirror):
    data, why, tail = failing_first_rung(lab_rack, lab_mirror)
    serving = current(lab_rack)
    rc, out = deploy(lab_rack, *data)
    assert rc == 0, out[-4000:]
    new = current(lab_rack)
    assert new != serving
    proof = record(lab_rack, new)["proof"]
    first = proof["attempts"][0]
    assert first["ok"] is False and why in first["why"], proof
    assert tail is None or tail in "\n".join(first["tail"]), proof
    # The ladder moved on: every rung before the last failed, and the last, a rebuild for
    # fewer extensions (no AVX-512), computed.
    assert [a["ok"] for a in proof["attempts"]] == [False] * (len(proof["attempts"]) - 1) + [True], proof
    assert proof["variant"] in ("x86-64-v3", "x86-64-v2") and proof["variant"] != first["variant"], proof
    assert proof["why"].startswith("the rungs before failed") and "-DGGML_AVX512=OFF" in proof["cmake_args"], proof
    # The server now runs the rebuilt binary, with what the proof needed, and answers.
    exec_start = served(lab_rack)[2]
    assert f"{BUILDS}/{new}/bin/llama-server" in exec_start
    assert all(a in exec_start for a in proof["runtime_args"])
    assert faults.completion(lab_rack.rack.host(HOST)["ip"])
    rc, out = deploy(lab_rack)  # back to the native build for the tests that follow
    assert rc == 0, out[-4000:]
    assert current(lab_rack) == serving


def test_flags_record_is_right_for_the_pinned_version(lab_rack):
    flags = parse_server_help(sh(lab_rack, f"cat {BUILDS}/current/server-help.txt"))
    # The pinned llama.cpp dropped --no-mmap for --load-mode, and --flash-attn takes a value.
    assert flags.mmap_off == ("--load-mode", "none")
    assert flags.flash_attn_takes_value
    assert flags.flash_attn(True) == ("--flash-attn", "on")
    assert flags.has_api_key_file and flags.has_metrics


def test_new_commit_rebuilds_switches_and_keeps_the_previous_build(lab_rack, lab_mirror):
    old = current(lab_rack)
    commit = mirror.add_commit(lab_mirror, "lab-test-change", "lab test: a new commit",
                               {"README.md": "\nA change from the llamarack lab tests.\n"})  # fmt: skip
    rc, out = deploy(lab_rack, f"llamacpp_commit={commit}")
    assert rc == 0, out[-4000:]
    new = current(lab_rack)
    assert new != old
    assert commit[:9] in sh(lab_rack, f"{BUILDS}/current/bin/llama-server --version 2>&1")
    assert sh(lab_rack, f"test -f {BUILDS}/{old}/build-info.json && echo kept") == "kept"


def test_commit_that_fails_to_build_leaves_the_current_build(lab_rack, lab_mirror):
    serving = current(lab_rack)
    broken = mirror.add_commit(lab_mirror, "lab-test-broken", "lab test: does not compile",
                               {"tools/server/server.cpp": "\n#error broken on purpose by the lab tests\n"})  # fmt: skip
    rc, out = deploy(lab_rack, f"llamacpp_commit={broken}")
    assert rc != 0
    assert "broken on purpose" in out
    assert current(lab_rack) == serving
    assert sh(lab_rack, f"{BUILDS}/current/bin/llama-server --version > /dev/null 2>&1 && echo runs") == "runs"


def test_back_to_the_pinned_commit_switches_without_building(lab_rack):
    rc, out = deploy(lab_rack)
    assert rc == 0, out[-4000:]
    assert current(lab_rack) == SEEN["pinned"]
    # Not rebuilt: the record of the verified build is the one written by the first deploy.
    assert sh(lab_rack, f"stat -c %Y {BUILDS}/{SEEN['pinned']}/build-info.json") == SEEN["pinned_record"]
    # The build in service and the one before it remain; the failed build directory is gone.
    assert sh(lab_rack, f"cd {BUILDS} && ls -d */ | grep -vc current") == "2"
