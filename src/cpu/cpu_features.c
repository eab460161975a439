/*
 * cpu_features.c - cpuid and xgetbv probing (x86-64) and the hardware capabilities the
 * kernel reports (AArch64), so that SIMD paths are chosen at run time and one binary runs on
 * any processor of the architecture.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#if defined(__linux__)
#include <sched.h>
#if defined(__aarch64__)
#include <sys/auxv.h> /* getauxval, HWCAP2_BF16 */
#endif
#endif

#include "cpu/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static unsigned long long read_xcr0(void)
{
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

static void probe(flashc_cpu_features *f)
{
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return;
    int osxsave = (c >> 27) & 1;
    int fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    unsigned long long xcr0 = osxsave ? read_xcr0() : 0;
    int os_avx = (xcr0 & 0x6) == 0x6;            /* XMM and YMM state */
    int os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0; /* opmask, ZMM hi */
    int os_amx = (xcr0 & 0x60000) == 0x60000;    /* XTILECFG, XTILEDATA */
    if (__get_cpuid_max(0, NULL) < 7)
        return;
    __cpuid_count(7, 0, a, b, c, d);
    f->avx2 = os_avx && ((b >> 5) & 1);
    f->fma = os_avx && fma;
    f->f16c = os_avx && f16c;
    f->avx512f = os_avx512 && ((b >> 16) & 1);
    f->avx512bw = os_avx512 && ((b >> 30) & 1);
    f->avx512vl = os_avx512 && ((b >> 31) & 1);
    f->avx512fp16 = os_avx512 && ((d >> 23) & 1);
    f->amx_bf16 = os_amx && ((d >> 22) & 1);
    f->amx_tile = os_amx && ((d >> 24) & 1);
    unsigned int a1, b1, c1, d1;
    __cpuid_count(7, 1, a1, b1, c1, d1);
    f->avx512bf16 = os_avx512 && ((a1 >> 5) & 1);
    f->amx_fp16 = os_amx && ((a1 >> 21) & 1);
}
#else
static void probe(flashc_cpu_features *f)
{
#if defined(__aarch64__)
    f->neon = 1;
#if defined(__linux__) && defined(HWCAP2_BF16)
    f->neon_bf16 = (getauxval(AT_HWCAP2) & HWCAP2_BF16) != 0;
#endif
#endif
}
#endif

static flashc_cpu_features features;
static pthread_once_t features_once = PTHREAD_ONCE_INIT;

static void init_features(void)
{
    memset(&features, 0, sizeof features);
    probe(&features);
}

const flashc_cpu_features *flashc_cpu_get_features(void)
{
    pthread_once(&features_once, init_features);
    return &features;
}

void flashc_cpu_features_string(char *buf, size_t size)
{
    const flashc_cpu_features *f = flashc_cpu_get_features();
    struct {
        const char *name;
        int on;
    } list[] = {{"avx2", f->avx2},         {"fma", f->fma},           {"f16c", f->f16c},
                {"avx512f", f->avx512f},   {"avx512bw", f->avx512bw}, {"avx512vl", f->avx512vl},
                {"avx512bf16", f->avx512bf16}, {"avx512fp16", f->avx512fp16},
                {"amx-tile", f->amx_tile}, {"amx-bf16", f->amx_bf16}, {"amx-fp16", f->amx_fp16},
                {"neon", f->neon},         {"bf16", f->neon_bf16}};
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) {
        if (!list[i].on)
            continue;
        int w = snprintf(buf + used, size - used, "%s%s", used ? " " : "", list[i].name);
        if (w < 0 || (size_t)w >= size - used)
            break;
        used += (size_t)w;
    }
    if (used == 0)
        snprintf(buf, size, "(no SIMD extensions detected)");
}

int flashc_cpu_count(void)
{
#if defined(__linux__) && defined(CPU_COUNT)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0)
            return n;
    }
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
