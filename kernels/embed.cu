// Embedding lookup: rows of a table in any weight format, dequantized to f32.
#include "common.cuh"

template <typename F>
__device__ void get_rows(float* out, const u8* table, const i32* ids, int cols, float scale) {
    const int r = blockIdx.x;
    const i64 row_bytes = (i64)(cols / F::BLOCK) * F::BYTES;
    const u8* src = table + (i64)ids[r] * row_bytes;
    for (int e = threadIdx.x; e < cols; e += blockDim.x) {
        out[(i64)r * cols + e] = F::get(src + (e / F::BLOCK) * F::BYTES, e % F::BLOCK) * scale;
    }
}

#define GET_ROWS(name, fmt)                                                                      \
    extern "C" __global__ void get_rows_##name(float* out, const u8* table, const i32* ids,     \
                                               int cols, float scale) {                          \
        PDL_WAIT();                                                                              \
        PDL_TRIGGER();                                                                           \
        get_rows<fmt>(out, table, ids, cols, scale);                                             \
    }
FOR_EACH_FORMAT(GET_ROWS)
