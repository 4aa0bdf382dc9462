"""bench/cpu_profiles.py's ground: QEMU's user mode stands for an older CPU (its cpuid
reports the model's extensions, and an instruction of one it lacks dies of SIGILL), and the
cpu-has-features rule, asked with what the probe reports there, refuses a shipped build
where it would die. The builds themselves run in the benchmark (bench/results/cpu-profiles.json)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import cpu_profiles  # noqa: E402  (bench/)

pytestmark = pytest.mark.skipif(not (shutil.which("qemu-x86_64") and shutil.which("gcc")),
                                reason="needs qemu-user and gcc (CI installs qemu-user)")  # fmt: skip

AVX2_ADD = r"""
#include <immintrin.h>
#include <stdio.h>
int main(int argc, char **argv) {
    __m256i a = _mm256_set1_epi32(argc), b = _mm256_set1_epi32(41);
    int out[8];
    _mm256_storeu_si256((__m256i *)out, _mm256_add_epi32(a, b));
    printf("%d\n", out[0]);
    return 0;
}
"""


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    d = tmp_path_factory.mktemp("cpu")
    subprocess.run(["gcc", "-O1", "-o", str(d / "probe"), str(ROOT / "bench/cpu_probe.c")], check=True)
    (d / "avx2.c").write_text(AVX2_ADD)
    subprocess.run(["gcc", "-O1", "-mavx2", "-o", str(d / "avx2"), str(d / "avx2.c")], check=True)
    return d


def test_the_probe_reports_each_emulated_cpus_extensions(programs):
    report = lambda cpu: cpu_profiles.run_on(cpu, [str(programs / "probe")])["stdout"].split()  # noqa: E731
    assert report("Westmere-v1") == ["sse4_2"]
    assert report("SandyBridge-v1") == ["sse4_2", "avx"]
    assert report("Haswell-v4") == ["sse4_2", "fma", "avx", "f16c", "avx2", "bmi2"]


def test_an_extension_the_cpu_lacks_dies_and_the_rule_says_so_first(programs):
    for cpu, computes in (("Haswell-v4", True), ("SandyBridge-v1", False), ("Westmere-v1", False)):
        flags = " ".join(cpu_profiles.run_on(cpu, [str(programs / "probe")])["stdout"].split())
        ran = cpu_profiles.run_on(cpu, [str(programs / "avx2")])
        assert (ran["rc"] == 0, ran["signal"]) == ((True, None) if computes else (False, "SIGILL")), cpu
        assert ran["stdout"].strip() == ("42" if computes else "")
        rule = cpu_profiles.rule_on(flags, ["sse42", "avx", "avx2"])
        assert rule["passes"] is computes, (cpu, rule)
    refused = cpu_profiles.rule_on("sse4_2", cpu_profiles.BASELINE)
    assert refused["found"] == ("a CPU without avx, avx2, bmi2, fma, f16c (its /proc/cpuinfo flags lack avx, avx2, "
                                "bmi2, f16c, fma)")  # fmt: skip
