// Causal attention of query rows over an f16 KV cache, with GQA and sliding windows.
#include "common.cuh"

// q: [rows, n_heads, hd]; k, v: [n_kv_heads, capacity, hd] f16; out: [rows, n_heads, hd].
// Block (head, row); dynamic shared memory holds the scores of positions first..=pos.
extern "C" __global__ void attention_f32(float* out, const float* q, const u16* k, const u16* v,
                                         const i32* pos, int n_heads, int n_kv_heads, int hd,
                                         int capacity, float scale, int window) {
    extern __shared__ float scores[];
    const int h = blockIdx.x, row = blockIdx.y;
    const int kvh = h / (n_heads / n_kv_heads);
    const int p = pos[row];
    const int first = window > 0 ? max(0, p + 1 - window) : 0;
    const int n = p + 1 - first;
    const float* qh = q + ((i64)row * n_heads + h) * hd;
    const u16* kh = k + (i64)kvh * capacity * hd;
    const u16* vh = v + (i64)kvh * capacity * hd;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
    for (int t = warp; t < n; t += warps) {
        const u16* kr = kh + (i64)(first + t) * hd;
        float s = 0.0f;
        for (int d = lane; d < hd; d += WARP) s += qh[d] * f16_to_f32(kr[d]);
        s = warp_sum(s);
        if (lane == 0) scores[t] = s * scale;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int t = threadIdx.x; t < n; t += blockDim.x) mx = fmaxf(mx, scores[t]);
    mx = block_max(mx);
    float sum = 0.0f;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        const float e = expf(scores[t] - mx);
        scores[t] = e;
        sum += e;
    }
    sum = block_sum(sum);
    __syncthreads();
    const float inv = 1.0f / sum;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int t = 0; t < n; ++t) acc += scores[t] * f16_to_f32(vh[(i64)(first + t) * hd + d]);
        out[((i64)row * n_heads + h) * hd + d] = acc * inv;
    }
}

// Writes k, v: [rows, n_kv_heads * hd] (f32) into the caches at positions pos[row].
extern "C" __global__ void kv_store_f32(u16* kc, u16* vc, const float* k, const float* v, const i32* pos,
                                        int n_kv_heads, int hd, int capacity) {
    const int row = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_kv_heads * hd) return;
    const int h = i / hd, d = i % hd;
    const i64 dst = ((i64)h * capacity + pos[row]) * hd + d;
    kc[dst] = f32_to_f16(k[(i64)row * n_kv_heads * hd + i]);
    vc[dst] = f32_to_f16(v[(i64)row * n_kv_heads * hd + i]);
}
