// Rotary position embedding, in place.
#include "common.cuh"

// x: [rows, n_heads * head_dim]; row r at position pos[r]. Rotates the first n_rot dimensions
// of each head: pairs (2i, 2i+1) when neox == 0, (i, i + n_rot/2) when neox != 0.
// theta_i = pos * freq_scale * base^(-2i/n_rot) / factors[i] (factors may be null).
extern "C" __global__ void rope_f32(float* x, const i32* pos, int n_heads, int head_dim, int n_rot,
                                    float base, float freq_scale, const float* factors, int neox) {
    const int row = blockIdx.y;
    const int half = n_rot / 2;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;  // one (head, pair) per thread
    if (t >= n_heads * half) return;
    const int h = t / half, i = t % half;
    float theta = (float)pos[row] * powf(base, -2.0f * (float)i / (float)n_rot);
    if (factors) theta /= factors[i];
    theta *= freq_scale;
    float s, c;
    sincosf(theta, &s, &c);
    float* hp = x + ((i64)row * n_heads + h) * head_dim;
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + half : 2 * i + 1;
    const float x0 = hp[a], x1 = hp[b];
    hp[a] = x0 * c - x1 * s;
    hp[b] = x0 * s + x1 * c;
}
