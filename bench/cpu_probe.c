/* The x86 extensions this CPU reports (cpuid), named as /proc/cpuinfo names them: those
 * ggml's CPU code is built for (llamacpp_cpu_features). bench/cpu_profiles.py runs it on
 * each CPU profile, QEMU's emulated ones included, whose /proc/cpuinfo is the host's. */
#include <cpuid.h>
#include <stdio.h>

static void say(unsigned reg, int bit, const char *name) {
    if (reg & (1u << bit)) printf("%s ", name);
}

int main(void) {
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        say(c, 20, "sse4_2"); say(c, 12, "fma"); say(c, 28, "avx"); say(c, 29, "f16c");
    }
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        say(b, 5, "avx2"); say(b, 8, "bmi2"); say(b, 16, "avx512f"); say(b, 17, "avx512dq");
        say(b, 28, "avx512cd"); say(b, 30, "avx512bw"); say(b, 31, "avx512vl");
        say(c, 1, "avx512vbmi"); say(c, 11, "avx512_vnni");
        say(d, 22, "amx_bf16"); say(d, 24, "amx_tile"); say(d, 25, "amx_int8");
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
        say(a, 4, "avx_vnni"); say(a, 5, "avx512_bf16");
    }
    printf("\n");
    return 0;
}
