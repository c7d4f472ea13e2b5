// RMSNorm: one block per row.
#include "common.cuh"

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for rows of `cols` values (cols == len(w)).
// Rows may be attention heads (QK-norm): the caller passes rows * heads rows of head_dim.
extern "C" __global__ void rms_norm_f32(float* out, const float* x, const float* w, int cols, float eps) {
    PDL_WAIT();
    PDL_TRIGGER();
    const int row = blockIdx.x;
    const float* xr = x + (i64)row * cols;
    float* yr = out + (i64)row * cols;
    // As the reference: f32 squares summed in f64, 1/sqrtf(mean + eps), scale, then weight.
    double ss = 0.0;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) ss += (double)__fmul_rn(xr[i], xr[i]);
    ss = block_sum_f64(ss);
    const float mean = (float)(ss / (double)cols);
    const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
    for (int i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
}

// The same for rows of at most 4 * 4 * blockDim.x values with cols % 4 == 0: each thread keeps
// its (up to four) float4 of the row in registers between the two passes, so the row is read
// once, with 16-byte loads. One block per row.
extern "C" __global__ void rms_norm_vec_f32(float* out, const float* x, const float* w, int cols, float eps) {
    PDL_WAITS_INSIDE();
    const int row = blockIdx.x;
    float4 o[4];
    rms_norm_row4((const float4*)(x + (i64)row * cols), (const float4*)w, cols, eps, o);
    float4* yr = (float4*)(out + (i64)row * cols);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < cols / 4) yr[i] = o[j];
    }
}
