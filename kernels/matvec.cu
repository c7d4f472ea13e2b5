// y = x · Wᵀ with W: [n_out, n_in] in its stored format, read block by block.
//
// One warp per output row; each lane walks whole blocks of the row and accumulates the
// dequantized weight times the activation. Grid: (ceil(n_out / warps per block), m rows of x).
#include "common.cuh"

template <typename F>
__device__ void matvec(float* y, const u8* w, const float* x, int n_out, int n_in) {
    const int warps = blockDim.x / WARP;
    const int row = blockIdx.x * warps + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    const int m = blockIdx.y;
    if (row >= n_out) return;
    const int n_blocks = n_in / F::BLOCK;
    const u8* wr = w + (i64)row * n_blocks * F::BYTES;
    const float* xr = x + (i64)m * n_in;
    float acc = 0.0f;
    if (F::BLOCK == 1) {
        for (int k = lane; k < n_in; k += WARP) acc += F::get(wr + (i64)k * F::BYTES, 0) * xr[k];
    } else {
        // Lanes split each block's elements so loads of x stay coalesced.
        for (int b = 0; b < n_blocks; ++b) {
            const u8* blk = wr + (i64)b * F::BYTES;
            for (int j = lane; j < F::BLOCK; j += WARP) acc += F::get(blk, j) * xr[b * F::BLOCK + j];
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) y[(i64)m * n_out + row] = acc;
}

#define MATVEC(name, fmt)                                                                        \
    extern "C" __global__ void matvec_##name(float* y, const u8* w, const float* x, int n_out,   \
                                             int n_in) {                                         \
        matvec<fmt>(y, w, x, n_out, n_in);                                                       \
    }
FOR_EACH_FORMAT(MATVEC)
