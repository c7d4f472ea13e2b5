// Rotary position embedding, in place.
#include "common.cuh"

// x: [rows, n_heads * head_dim]; row r at position pos[r]. Rotates the first n_rot dimensions
// of each head: pairs (2i, 2i+1) when neox == 0, (i, i + n_rot/2) when neox != 0. As the
// reference: theta_i = pos * theta_scale^i by repeated f32 multiplication
// (theta_scale = base^(-2/n_rot)), divided by factors[i] when given, times freq_scale.
extern "C" __global__ void rope_f32(float* x, const i32* pos, int n_heads, int head_dim, int n_rot,
                                    float theta_scale, float freq_scale, const float* factors, int neox) {
    const int row = blockIdx.y;
    const int half = n_rot / 2;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;  // one (head, pair) per thread
    if (t >= n_heads * half) return;
    const int h = t / half, i = t % half;
    float theta = (float)pos[row];
    for (int j = 0; j < i; ++j) theta = __fmul_rn(theta, theta_scale);
    if (factors) theta = __fdiv_rn(theta, factors[i]);
    theta = __fmul_rn(freq_scale, theta);
    const float c = cosf(theta), s = sinf(theta);
    float* hp = x + ((i64)row * n_heads + h) * head_dim;
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + half : 2 * i + 1;
    const float x0 = hp[a], x1 = hp[b];
    hp[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    hp[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}
