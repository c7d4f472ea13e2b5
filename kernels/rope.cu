// Rotary position embedding, in place.
#include "common.cuh"

// x: [rows, n_heads * head_dim]; cs: [rows, n_rot / 2, 2] holding (cos, sin) of each pair's
// angle, computed on the host exactly as the CPU reference computes them. Rotates the first
// n_rot dimensions of each head: pairs (2i, 2i+1) when neox == 0, (i, i + n_rot/2) otherwise.
extern "C" __global__ void rope_f32(float* x, const float* cs, int n_heads, int head_dim, int n_rot, int neox) {
    PDL_WAIT();
    PDL_TRIGGER();
    const int row = blockIdx.y;
    const int half = n_rot / 2;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;  // one (head, pair) per thread
    if (t >= n_heads * half) return;
    const int h = t / half, i = t % half;
    float* hp = x + ((i64)row * n_heads + h) * head_dim;
    const rope_pair p = rope_rotate(hp, cs + (i64)row * half * 2, i, half, neox, false, 1.0f);
    hp[p.a] = p.r0;
    hp[p.b] = p.r1;
}

// The query and key rotations of one attention layer in one launch (same table), and the
// query's optional scale (applied after the rotation, as the CPU does; scale_q != 1 needs
// n_rot == head_dim so that every query element is rotated). q: [rows, n_q * head_dim],
// k: [rows, n_k * head_dim]; threads (head, pair) cover the query heads, then the key heads.
extern "C" __global__ void rope_qk_f32(float* q, float* k, const float* cs, int n_q, int n_k, int head_dim,
                                       int n_rot, int neox, float scale_q, int use_scale) {
    PDL_WAIT();
    PDL_TRIGGER();
    const int row = blockIdx.y;
    const int half = n_rot / 2;
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (n_q + n_k) * half) return;
    const bool is_q = t < n_q * half;
    if (!is_q) t -= n_q * half;
    const int h = t / half, i = t % half;
    float* hp = is_q ? q + ((i64)row * n_q + h) * head_dim : k + ((i64)row * n_k + h) * head_dim;
    const rope_pair p = rope_rotate(hp, cs + (i64)row * half * 2, i, half, neox, is_q && use_scale, scale_q);
    hp[p.a] = p.r0;
    hp[p.b] = p.r1;
}
