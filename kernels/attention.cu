// Causal attention of query rows over an f16 KV cache, with GQA and sliding windows.
//
// The arithmetic follows the reference CPU path (llama.cpp's, flash attention off): q rounded
// to f16; each score an f64 sum of exact f16×f16 products, rounded to f32, times `scale`;
// softmax with ggml's polynomial exp, summed per aligned group of four in f32 and then in f64;
// probabilities rounded to f16; each output an f64 sum of exact f16×f16 products. f64 sums of
// exact products do not depend on their order in practice, so the GPU lands on the CPU's values.
#include "common.cuh"

// The KV cache is paged: position t of a sequence lives in page table[t / KV_PAGE], slot
// t % KV_PAGE; a page holds [n_kv_heads, KV_PAGE, hd] f16 values.
#define KV_PAGE 16

__device__ __forceinline__ i64 kv_index(const i32* table, int t, int h, int d, int n_kv_heads, int hd) {
    const i64 page = table[t / KV_PAGE];
    return ((page * n_kv_heads + h) * KV_PAGE + t % KV_PAGE) * (i64)hd + d;
}

// q: [rows, n_heads, hd]; k, v: paged f16 caches (see kv_index); out: [rows, n_heads, hd].
// Block (head, row); dynamic shared memory: scores for positions 0..=pos rounded up to 4, then
// the f16-rounded query.
extern "C" __global__ void attention_f32(float* out, const float* q, const u16* k, const u16* v,
                                         const i32* table, const i32* pos, int n_heads, int n_kv_heads,
                                         int hd, float scale, int window) {
    extern __shared__ float smem[];
    const int h = blockIdx.x, row = blockIdx.y;
    const int kvh = h / (n_heads / n_kv_heads);
    const int p = pos[row];
    const int first = window > 0 ? max(0, p + 1 - window) : 0;
    const int n_padded = (p + 4) / 4 * 4;
    float* scores = smem;
    float* q16 = smem + n_padded;
    const float* qh = q + ((i64)row * n_heads + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) q16[d] = f16_to_f32(f32_to_f16(qh[d]));
    __syncthreads();

    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
    for (int t = warp; t < n_padded; t += warps) {
        float s = -INFINITY;
        if (t >= first && t <= p) {
            const u16* kr = k + kv_index(table, t, kvh, 0, n_kv_heads, hd);
            double acc = 0.0;
            for (int d = lane; d < hd; d += WARP) acc += (double)__fmul_rn(f16_to_f32(kr[d]), q16[d]);
            acc = warp_sum_f64(acc);
            s = __fmul_rn((float)acc, scale);
        }
        if (lane == 0) scores[t] = s;
    }
    __syncthreads();

    float mx = -INFINITY;
    for (int t = threadIdx.x; t < n_padded; t += blockDim.x) mx = fmaxf(mx, scores[t]);
    mx = block_max(mx);
    double sum = 0.0;
    for (int g = threadIdx.x; g < n_padded / 4; g += blockDim.x) {
        float e[4];
        for (int i = 0; i < 4; ++i) {
            e[i] = ggml_expf(__fsub_rn(scores[4 * g + i], mx));
            scores[4 * g + i] = e[i];
        }
        sum += (double)__fadd_rn(__fadd_rn(e[0], e[1]), __fadd_rn(e[2], e[3]));
    }
    sum = block_sum_f64(sum);
    const float inv = (float)(1.0 / sum);
    __syncthreads();
    for (int t = threadIdx.x; t < n_padded; t += blockDim.x) {
        scores[t] = f16_to_f32(f32_to_f16(__fmul_rn(scores[t], inv)));
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        double acc = 0.0;
        for (int t = first; t <= p; ++t) {
            acc += (double)__fmul_rn(f16_to_f32(v[kv_index(table, t, kvh, d, n_kv_heads, hd)]), scores[t]);
        }
        out[((i64)row * n_heads + h) * hd + d] = (float)acc;
    }
}

// Writes k, v: [rows, n_kv_heads * hd] (f32) into the paged caches at positions pos[row].
extern "C" __global__ void kv_store_f32(u16* kc, u16* vc, const float* k, const float* v, const i32* table,
                                        const i32* pos, int n_kv_heads, int hd) {
    const int row = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_kv_heads * hd) return;
    const int h = i / hd, d = i % hd;
    const i64 dst = kv_index(table, pos[row], h, d, n_kv_heads, hd);
    kc[dst] = f32_to_f16(k[(i64)row * n_kv_heads * hd + i]);
    vc[dst] = f32_to_f16(v[(i64)row * n_kv_heads * hd + i]);
}
