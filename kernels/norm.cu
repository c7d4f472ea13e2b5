// RMSNorm: one block per row.
#include "common.cuh"

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for rows of `cols` values (cols == len(w)).
// Rows may be attention heads (QK-norm): the caller passes rows * heads rows of head_dim.
extern "C" __global__ void rms_norm_f32(float* out, const float* x, const float* w, int cols, float eps) {
    const int row = blockIdx.x;
    const float* xr = x + (i64)row * cols;
    float* yr = out + (i64)row * cols;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss);
    const float scale = rsqrtf(ss / (float)cols + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
}
