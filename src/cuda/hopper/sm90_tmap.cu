/*
 * sm90_tmap.cu - builds the TMA tensor maps of the Hopper kernels through the runtime's
 * driver entry point for cuTensorMapEncodeTiled, so that nothing links libcuda directly.
 */
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "sm90_tmap.h"

static PFN_cuTensorMapEncodeTiled_v12000 sm90_encoder(void)
{
    static PFN_cuTensorMapEncodeTiled_v12000 fn = NULL; /* same value from any thread */
    if (!fn) {
        void *ptr = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault,
                                             &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)ptr;
    }
    return fn;
}

int fc_sm90_encode_map(CUtensorMap *map, const void *ptr, int bf16, int64_t d, int64_t seqlen,
                       int64_t heads, int64_t batch, int64_t ss, int64_t sh, int64_t sb,
                       int box_rows)
{
    PFN_cuTensorMapEncodeTiled_v12000 enc = sm90_encoder();
    if (!enc) return 0;
    if (seqlen < 1) seqlen = 1; /* an empty key set is never loaded; keep the map valid */
    if (batch < 1) batch = 1;
    /* a dimension of one element gets the dense stride: TMA wants every stride a positive
     * multiple of 16 bytes, and a caller's stride there is arbitrary */
    const int64_t dense_s = d, dense_h = d * seqlen, dense_b = d * seqlen * heads;
    if (seqlen <= 1) ss = dense_s;
    if (heads <= 1) sh = dense_h;
    if (batch <= 1) sb = dense_b;
    cuuint64_t dims[4] = {(cuuint64_t)d, (cuuint64_t)seqlen, (cuuint64_t)heads, (cuuint64_t)batch};
    cuuint64_t strides[3] = {(cuuint64_t)ss * 2, (cuuint64_t)sh * 2, (cuuint64_t)sb * 2};
    cuuint32_t box[4] = {64, (cuuint32_t)box_rows, 1, 1};
    cuuint32_t estr[4] = {1, 1, 1, 1};
    CUresult r = enc(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                     (void *)ptr, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                     CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS;
}
