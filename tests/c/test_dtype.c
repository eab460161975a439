/*
 * test_dtype.c - the fp16 and bf16 conversions: every 16-bit pattern round-trips through
 * float; float -> 16-bit rounds to nearest even (checked against an exact rounding done in
 * double arithmetic, and against the compiler's _Float16 where it has one), overflow gives
 * inf, NaN stays NaN.
 */
#include <math.h>
#include <string.h>

#include "test_util.h"
#include "../../src/dtype.h"

/* Nearest-even rounding of x to a format with `mant` stored mantissa bits, minimum normal
 * exponent emin and largest finite max_finite, computed exactly in double. */
static double round_exact(double x, int mant, int emin, double max_finite)
{
    if (x == 0 || !isfinite(x))
        return x;
    int e;
    frexp(fabs(x), &e); /* |x| = f * 2^e, f in [0.5, 1) */
    int exp = e - 1 < emin ? emin : e - 1;
    double ulp = ldexp(1.0, exp - mant);
    double q = x / ulp, r = nearbyint(q); /* default rounding mode: to nearest even */
    double y = r * ulp;
    double limit = max_finite + 0.5 * ldexp(1.0, (int)log2(max_finite) - mant);
    if (fabs(x) >= limit)
        return x > 0 ? INFINITY : -INFINITY;
    return y;
}

int main(void)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = flashc_f16_to_f32((uint16_t)h);
        uint16_t back = flashc_f32_to_f16(f);
        if (isnan(f))
            CHECK(isnan(flashc_f16_to_f32(back)), "f16 NaN 0x%04x lost", h);
        else
            CHECK(back == h, "f16 0x%04x -> %g -> 0x%04x", h, f, back);
        float g = flashc_bf16_to_f32((uint16_t)h);
        uint16_t bback = flashc_f32_to_bf16(g);
        if (isnan(g))
            CHECK(isnan(flashc_bf16_to_f32(bback)), "bf16 NaN 0x%04x lost", h);
        else
            CHECK(bback == h, "bf16 0x%04x -> %g -> 0x%04x", h, g, bback);
    }
    test_rng rng;
    rng_seed(&rng, 11);
    for (int i = 0; i < 2000000; i++) {
        /* random bit patterns cover every exponent, ties included via the low bits */
        uint32_t bits = (uint32_t)rng_next(&rng);
        if (i % 4 == 0)
            bits &= 0xffffe000u | (1u << 12); /* exact ties for f16 */
        float f = flashc_bits_f32(bits);
        if (isnan(f))
            continue;
        double want16 = round_exact(f, 10, -14, 65504.0);
        double got16 = flashc_f16_to_f32(flashc_f32_to_f16(f));
        CHECK(got16 == want16 || (want16 == 0 && got16 == 0),
              "f32 %a -> f16 %a, want %a", (double)f, got16, want16);
        double wantb = round_exact(f, 7, -126, 3.3895313892515355e38);
        double gotb = flashc_bf16_to_f32(flashc_f32_to_bf16(f));
        CHECK(gotb == wantb || (wantb == 0 && gotb == 0), "f32 %a -> bf16 %a, want %a",
              (double)f, gotb, wantb);
#ifdef __FLT16_MAX__
        _Float16 hc = (_Float16)f;
        uint16_t hb;
        memcpy(&hb, &hc, 2);
        CHECK(hb == flashc_f32_to_f16(f), "f32 %a: compiler f16 0x%04x, flashc 0x%04x",
              (double)f, hb, flashc_f32_to_f16(f));
#endif
        if (test_failures > 20)
            break;
    }
    CHECK(flashc_f32_to_f16(1e6f) == 0x7c00u, "f16 overflow to inf");
    CHECK(flashc_f32_to_f16(-1e6f) == 0xfc00u, "f16 overflow to -inf");
    CHECK(flashc_f32_to_bf16(INFINITY) == 0x7f80u, "bf16 inf");
    CHECK(isnan(flashc_bf16_to_f32(flashc_f32_to_bf16(NAN))), "bf16 NaN");
    return test_finish("test_dtype");
}
