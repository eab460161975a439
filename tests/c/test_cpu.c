/*
 * test_cpu.c - the CPU backend against the float64 reference over the grid of odd cases:
 * every dtype; head dims 1..256; seqlen 1, 17 and lengths that are not block multiples,
 * seqlen_q != seqlen_k both ways; no mask, causal bottom-right and top-left; MHA, GQA, MQA;
 * contiguous, SDPA-layout and padded views; outputs poisoned before each run. The micro-kernel
 * set can be forced with FLASHC_CPU_ISA; the test runs every set this processor supports.
 */
#include <stdlib.h>
#include <string.h>

#include "attention_check.h"
#include "../../src/cpu/kernels.h"

static const flashc_dtype dtypes[] = {FLASHC_F32, FLASHC_F16, FLASHC_BF16};
static const int64_t head_dims[] = {1, 32, 64, 80, 128, 256};
static const int64_t seqlens[][2] = {{1, 1}, {17, 17}, {17, 40}, {40, 17}, {130, 65}, {1, 70}};
static const int64_t heads[][2] = {{2, 2}, {4, 1}, {6, 2}};
static const int32_t causals[] = {FLASHC_CAUSAL_NONE, FLASHC_CAUSAL_BOTTOM_RIGHT,
                                  FLASHC_CAUSAL_TOP_LEFT};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void run_grid(flashc_backend *be, const char *isa)
{
    uint64_t seed = 1;
    for (int di = 0; di < COUNT(dtypes); di++) {
        error_summary sum;
        memset(&sum, 0, sizeof sum);
        for (int hd = 0; hd < COUNT(head_dims); hd++)
            for (int sl = 0; sl < COUNT(seqlens); sl++)
                for (int ci = 0; ci < COUNT(causals); ci++) {
                    int variant = hd + sl + ci;
                    attention_case c = {dtypes[di], 1 + (variant % 2), seqlens[sl][0],
                                        seqlens[sl][1], heads[variant % 3][0],
                                        heads[variant % 3][1], head_dims[hd], causals[ci],
                                        0.0f, (test_layout)(variant % LAYOUT_COUNT), 1.0, 1};
                    attention_errors e = run_attention_case(be, &c, seed++);
                    summary_add(&sum, &e);
                }
        char label[64];
        snprintf(label, sizeof label, "cpu/%s %s grid", isa, dtype_name(dtypes[di]));
        summary_print(label, &sum);
    }
}

/* Long sequences: many key blocks, partial last blocks, the online softmax rescaling. */
static void run_long(flashc_backend *be, const char *isa)
{
    const attention_case cases[] = {
        {FLASHC_F32, 1, 1000, 1000, 2, 1, 64, FLASHC_CAUSAL_BOTTOM_RIGHT, 0.0f, LAYOUT_BSHD, 1.0, 1},
        {FLASHC_BF16, 1, 1000, 1000, 2, 2, 128, FLASHC_CAUSAL_NONE, 0.0f, LAYOUT_BHSD, 1.0, 1},
        {FLASHC_F16, 1, 1000, 700, 1, 1, 256, FLASHC_CAUSAL_TOP_LEFT, 0.0f, LAYOUT_PADDED, 1.0, 1},
        {FLASHC_F16, 1, 300, 1000, 2, 1, 32, FLASHC_CAUSAL_BOTTOM_RIGHT, 0.0f, LAYOUT_BSHD, 1.0, 1},
        /* large logits: scale 1 with std 2 inputs gives |S| in the tens */
        {FLASHC_F32, 1, 257, 513, 1, 1, 64, FLASHC_CAUSAL_NONE, 1.0f, LAYOUT_BSHD, 2.0, 1},
    };
    error_summary sum;
    memset(&sum, 0, sizeof sum);
    for (int i = 0; i < COUNT(cases); i++) {
        attention_errors e = run_attention_case(be, &cases[i], 1000 + (uint64_t)i);
        summary_add(&sum, &e);
        char what[160];
        describe_case(&cases[i], what, sizeof what);
        printf("  %-44s O %.2e LSE %.2e dQ %.2e dK %.2e dV %.2e\n", what, e.out.rel, e.lse.rel,
               e.dq.rel, e.dk.rel, e.dv.rel);
    }
    char label[64];
    snprintf(label, sizeof label, "cpu/%s long", isa);
    summary_print(label, &sum);
}

int main(void)
{
    const char *sets[] = TEST_CPU_SETS;
    int ran = 0;
    for (int i = 0; i < COUNT(sets); i++) {
        if (!flashc_cpu_pick_kernels(sets[i]))
            continue;
        flashc_backend_config cfg;
        flashc_backend_config_init(&cfg);
        cfg.cpu_isa = sets[i];
        cfg.num_threads = 2;
        flashc_backend *be = NULL;
        flashc_status st = flashc_backend_create("cpu", &cfg, &be);
        CHECK(st == FLASHC_OK, "cpu backend with %s: %s", sets[i], flashc_last_error());
        if (!be)
            continue;
        printf("%s\n", flashc_backend_describe(be));
        run_grid(be, sets[i]);
        run_long(be, sets[i]);
        flashc_backend_destroy(be);
        ran++;
    }
    CHECK(ran >= 1, "no CPU micro-kernel set ran");
    return test_finish("test_cpu");
}
