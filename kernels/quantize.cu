// Activation quantizers: f32 rows to the 8-bit formats ggml pairs with quantized weights,
// bit for bit with ggml's reference C (`quantize_row_q8_0_ref`, `_q8_1_ref`, `_q8_K_ref`, as
// synaptix-kernels-cpu reproduces them), including its handling of zeros, ties, tiny scales,
// infinities and NaN. Every float operation is an explicit round-to-nearest intrinsic, so the
// compiler cannot contract a multiply and an add into an FMA that the C code does not have.
//
// Output layout (one byte buffer `out`, offsets in bytes; rows of `k` elements, `k` a multiple of
// the block length, all rows back to back):
// - quants: `i8 qs[rows * k]` at `out`;
// - Q8_0 / Q8_1: per 32-element block a `u32` with the half bits of `d` (low 16) and, for Q8_1,
//   of `s = d * Σq` (high 16), then the block's `i32 Σq`: 8 bytes per block at `out + meta`;
// - Q8_K: per 256-element block `f32 d` at `out + meta` and sixteen `i16` sums of 16 quants at
//   `out + bsums`.
#include "common.cuh"
#include "quant8.cuh"

template <bool Q81>
__device__ void quantize_q8_32(const float* x, u8* out, long long meta, int n_blocks) {
    const int b = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (b >= n_blocks) return;  // whole warps leave together
    quantize_q8_32_block<Q81>(x, out, meta, b);
}

extern "C" __global__ void quantize_q8_0(const float* x, u8* out, long long meta, int n_blocks) {
    PDL_WAIT();
    PDL_TRIGGER();
    quantize_q8_32<false>(x, out, meta, n_blocks);
}

extern "C" __global__ void quantize_q8_1(const float* x, u8* out, long long meta, int n_blocks) {
    PDL_WAIT();
    PDL_TRIGGER();
    quantize_q8_32<true>(x, out, meta, n_blocks);
}

// Q8_K: one warp per 256-element block.
extern "C" __global__ void quantize_q8_k(const float* x, u8* out, long long meta, long long bsums,
                                         int n_blocks) {
    PDL_WAIT();
    PDL_TRIGGER();
    const int b = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (b >= n_blocks) return;
    quantize_q8_k_block(x, out, meta, bsums, b);
}

// RMSNorm (as norm.cu's rms_norm_vec_f32: the same operations, so the same values) writing y,
// then the block quantizes its row of y for the matvecs that follow: FMT 0 Q8_0, 1 Q8_1,
// 2 Q8_K, laid out as the quantize kernels above lay it out. One block per row (1024 threads,
// so that its warps quantize up to 32 activation blocks at once; it loads the norm weights before
// its PDL wait); cols % 4 == 0,
// cols <= RMS_QUANT_MAX_COLS (fused.rs checks it) and a multiple of the block length.
#define RMS_QUANT_MAX_COLS 4096
template <int FMT>
__device__ void rms_norm_quant(float* y, u8* out, long long meta, long long bsums, const float* x, const float* w,
                               int cols, float eps) {
    const int row = blockIdx.x;
    float4* yr = (float4*)(y + (i64)row * cols);
    // The normalised row, which the block's warps quantize from here (not back from y).
    __shared__ __align__(16) float vals[RMS_QUANT_MAX_COLS];
    float4 o[4];
    rms_norm_row4((const float4*)(x + (i64)row * cols), (const float4*)w, cols, eps, o);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < cols / 4) {
            yr[i] = o[j];
            ((float4*)vals)[i] = o[j];
        }
    }
    __syncthreads();  // the normalised row is visible to the whole block
    const int bl = FMT == 2 ? QK_K : 32;
    const int per_row = cols / bl;
    for (int bb = threadIdx.x / WARP; bb < per_row; bb += blockDim.x / WARP) {
        const int b = row * per_row + bb;
        if (FMT == 2) {
            quantize_q8_k_values(vals + bb * QK_K, out, meta, bsums, b);
        } else {
            quantize_q8_32_value<FMT == 1>(vals[bb * 32 + threadIdx.x % WARP], out, meta, b);
        }
    }
}

extern "C" __global__ void rms_norm_q8_0(float* y, u8* out, long long meta, long long bsums, const float* x,
                                         const float* w, int cols, float eps) {
    PDL_WAITS_INSIDE();
    rms_norm_quant<0>(y, out, meta, bsums, x, w, cols, eps);
}
extern "C" __global__ void rms_norm_q8_1(float* y, u8* out, long long meta, long long bsums, const float* x,
                                         const float* w, int cols, float eps) {
    PDL_WAITS_INSIDE();
    rms_norm_quant<1>(y, out, meta, bsums, x, w, cols, eps);
}
extern "C" __global__ void rms_norm_q8_k(float* y, u8* out, long long meta, long long bsums, const float* x,
                                         const float* w, int cols, float eps) {
    PDL_WAITS_INSIDE();
    rms_norm_quant<2>(y, out, meta, bsums, x, w, cols, eps);
}

// The gated activation of an MLP (as elementwise.cu's swiglu_f32 / geglu_f32: the same
// operations) writing y, quantized for the down projection as it is computed: one warp per
// activation block (32 values for Q8_0 / Q8_1, lane i computing value i; 256 for Q8_K, lane i
// computing values 8i .. 8i + 7), which then quantizes the block it wrote. ACT 0: SiLU (ggml's
// polynomial exp for groups of four, expf for a row's tail), 1: GELU from ggml's f16 table.
// Grid: ceil(blocks / 8) blocks of 8 warps, over all rows' activation blocks.
template <int ACT>
__device__ __forceinline__ float glu_value(const float* gate, const float* up, i64 i, int c, int cols,
                                           const u16* table) {
    return ACT == 0 ? swiglu_one(gate[i], up[i], c, cols) : geglu_one(gate[i], up[i], table);
}

template <int FMT, int ACT>
__device__ void glu_quant(float* y, u8* out, long long meta, long long bsums, const float* gate, const float* up,
                          int cols, int n_blocks, const u16* table) {
    const int lane = threadIdx.x % WARP;
    const int b = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (b >= n_blocks) return;  // whole warps leave together
    const int bl = FMT == 2 ? QK_K : 32;
    const int per = bl / WARP;  // values per lane
    for (int j = 0; j < per; ++j) {
        const i64 i = (i64)b * bl + lane * per + j;
        y[i] = glu_value<ACT>(gate, up, i, (int)(i % cols), cols, table);
    }
    __syncwarp();  // the block of y is visible to the warp
    if (FMT == 2) {
        quantize_q8_k_block(y, out, meta, bsums, b);
    } else {
        quantize_q8_32_block<FMT == 1>(y, out, meta, b);
    }
}

// The Q8_K form: one thread block of QK_K threads per 256-value block (thread t computes value t,
// into y and shared memory), whose first warp then quantizes the block from shared memory. A
// warp per block computing 8 values per lane, as glu_quant does, was latency-bound: a
// 4864- or 8960-wide row has only 19 or 35 blocks.
template <int ACT>
__device__ void glu_quant_k(float* y, u8* out, long long meta, long long bsums, const float* gate,
                            const float* up, int cols, const u16* table) {
    __shared__ __align__(16) float vals[QK_K];
    const int b = blockIdx.x;
    const i64 i = (i64)b * QK_K + threadIdx.x;
    const float v = glu_value<ACT>(gate, up, i, (int)(i % cols), cols, table);
    y[i] = v;
    vals[threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.x < WARP) quantize_q8_k_values(vals, out, meta, bsums, b);
}

#define GLU_QUANT(name, fmt, act)                                                                      \
    extern "C" __global__ void name(float* y, u8* out, long long meta, long long bsums, const float* gate, \
                                    const float* up, int cols, int n_blocks, const u16* table) {        \
        PDL_WAITS_INSIDE(); /* before the wait: the trace's timer only */                             \
        KTRACE_START();                                                                                \
        PDL_WAIT();                                                                                    \
        PDL_TRIGGER();                                                                                 \
        KTRACE_WAITED();                                                                               \
        glu_quant<fmt, act>(y, out, meta, bsums, gate, up, cols, n_blocks, table);                     \
        KTRACE_END("glu", n_blocks, cols);                                                             \
    }
GLU_QUANT(swiglu_q8_0, 0, 0)
GLU_QUANT(swiglu_q8_1, 1, 0)
#define GLU_QUANT_K(name, act)                                                                         \
    extern "C" __global__ void name(float* y, u8* out, long long meta, long long bsums, const float* gate, \
                                    const float* up, int cols, int n_blocks, const u16* table) {        \
        PDL_WAIT();                                                                                    \
        PDL_TRIGGER();                                                                                 \
        glu_quant_k<act>(y, out, meta, bsums, gate, up, cols, table);                                  \
    }
GLU_QUANT_K(swiglu_q8_k, 0)
GLU_QUANT(geglu_q8_0, 0, 1)
GLU_QUANT(geglu_q8_1, 1, 1)
GLU_QUANT_K(geglu_q8_k, 1)
