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

// The single-block kernel (prefill, and the decode path's reference).
// q: [rows, n_heads, hd]; k, v: paged f16 caches (see kv_index); out: [rows, n_heads, hd].
// Block (head, row); dynamic shared memory: scores for positions 0..=pos rounded up to 4, then
// the f16-rounded query. The shared-memory size follows the largest position, so the launch
// changes from step to step.
extern "C" __global__ void attention_f32(float* out, const float* q, const u16* k, const u16* v,
                                         const i32* table, const i32* pos, int n_heads, int n_kv_heads,
                                         int hd, float scale, int window) {
    PDL_WAIT();
    PDL_TRIGGER();
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

// ---------------------------------------------------------------------------------------------
// Decode path (a few query rows): the positions are split into spans of `span_len` (a power of
// two, 16..=256, chosen per cache from its capacity by the host), and the launches depend only on
// the cache's shapes (n_heads, n_kv_heads, hd, capacity, rows, window), never on the current
// position, so a decode step can be captured in a CUDA graph and replayed: every kernel reads
// pos[row] on the device, and blocks whose span holds no attended position (beyond pos[row], or
// before the window) return at once, writing nothing.
//
// Same arithmetic as attention_f32, step for step: each score an f64 sum of the same exact
// products (split over fewer lanes, so regrouped), rounded to f32, times scale; the max is exact;
// each exp is ggml_expf(s - max) with the global max; the f32 sums of aligned groups of four are
// the same groups (spans start at multiples of span_len, itself a multiple of 16), added in f64;
// inv and the f16-rounded probabilities are the same; each output is an f64 sum of the same exact
// products, per position slice, per span, then over spans in span order. Only the grouping of
// f64 additions differs.
//
// Two launches, both grid (n_spans, n_heads, rows), ATTN_THREADS threads:
// - attention_scores_f32: a span's scores and their max; the last block of a (row, head) to
//   finish (a self-resetting atomic ticket) takes the global max and the sum of exps over the
//   attended groups, and stores (max, inv).
// - attention_pv_f32: a span's share of probs · V; the last block of a (row, head) adds the
//   spans' shares in span order and writes the output.
// Scratch, row-major, `h` the query head (n_spans = ceil(capacity / span_len)):
//   scores  f32 [rows, n_heads, n_spans * span_len]  scaled q·k; -inf outside [first, p]
//   smax    f32 [rows, n_heads, n_spans]             max of each span's scores
//   stats   f32 [rows, n_heads, 2]                   global max, inv = 1 / sum of exps
//   partial f64 [rows, n_heads, n_spans, hd]         each span's share of probs · V
//   tickets u32 [2, rows, n_heads]                   zero between launches (each kernel's last
//                                                    block wraps its ticket back to zero)
// Only the spans [lo, hi] of a row are written and read, and every kernel derives them from pos
// the same way (decode_range).
#define ATTN_THREADS 256
#define ATTN_MAX_SPAN 256

struct DecodeRange {
    int first, p;  // attended positions [first, p]
    int lo, hi;    // the spans holding them
};

// The positions `row` attends; false when pos[row] is outside the cache (nothing is read, and
// attention_pv_f32 writes NaN so that the caller's error shows).
__device__ __forceinline__ bool decode_range(const i32* pos, int row, int window, int capacity, int span_len,
                                             DecodeRange* r) {
    const int p = pos[row];
    if (p < 0 || p >= capacity) return false;
    r->p = p;
    r->first = window > 0 ? max(0, p + 1 - window) : 0;
    r->lo = r->first / span_len;
    r->hi = p / span_len;
    return true;
}

// Publishes this block's global writes and takes a ticket of the (row, head): true in the last
// of the `n_active` blocks to arrive, which then sees every other block's writes (read them with
// ld.global.cg, past the non-coherent L1). atomicInc wraps the ticket back to zero in that last
// block, ready for the next launch (or graph replay). Block-uniform; every thread must call it.
__device__ __forceinline__ bool last_block_of(u32* ticket, int n_active) {
    __shared__ u32 taken;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) taken = atomicInc(ticket, (u32)(n_active - 1));
    __syncthreads();
    const bool last = taken == (u32)(n_active - 1);
    if (last) __threadfence();
    return last;
}

__device__ __forceinline__ float load_cg(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ double load_cg(const double* p) {
    double v;
    asm volatile("ld.global.cg.f64 %0, [%1];" : "=d"(v) : "l"(p) : "memory");
    return v;
}

// q: [rows, n_heads, hd]; k: paged f16 cache. Block (span, head, row) writes this span's scores
// (all span_len of them, -inf where masked) and their max; the head's last block then stores
// stats = (global max, inv). Dynamic shared memory: hd f16-rounded query values, then span_len
// scores, then span_len / KV_PAGE page numbers (as floats' bits).
extern "C" __global__ void attention_scores_f32(float* scores, float* smax, float* stats, u32* tickets,
                                                const float* q, const u16* k, const i32* table, const i32* pos,
                                                int n_heads, int n_kv_heads, int hd, float scale, int window,
                                                int capacity, int span_len, int n_spans) {
    PDL_WAIT();
    PDL_TRIGGER();
    extern __shared__ float smem[];
    const int span = blockIdx.x, h = blockIdx.y, row = blockIdx.z;
    DecodeRange r;
    if (!decode_range(pos, row, window, capacity, span_len, &r) || span < r.lo || span > r.hi) return;
    const int S = span_len, t0 = span * S;
    const int kvh = h / (n_heads / n_kv_heads);
    const i64 head = (i64)row * n_heads + h;
    float* q16 = smem;                   // [hd]
    float* s = smem + hd;                // [S]
    i32* pages = (i32*)(smem + hd + S);  // [S / KV_PAGE]
    const float* qh = q + head * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) q16[d] = f16_to_f32(f32_to_f16(qh[d]));
    // The pages of the span's positions below the capacity (the table ends there).
    for (int i = threadIdx.x; i < S / KV_PAGE && t0 + i * KV_PAGE < capacity; i += blockDim.x) {
        pages[i] = table[t0 / KV_PAGE + i];
    }
    __syncthreads();

    // L lanes per position (aligned groups within a warp), each lane summing d = sub, sub + L, ...
    // in f64, then a butterfly within the group. Every thread runs the same number of
    // iterations, so the shuffles see every lane.
    const int L = hd > 128 ? 32 : (hd > 64 ? 16 : 8);
    const int sub = threadIdx.x % L, group = threadIdx.x / L, groups = blockDim.x / L;
    const int iters = (S + groups - 1) / groups;
    for (int it = 0; it < iters; ++it) {
        const int i = group + it * groups;
        const int t = t0 + i;
        const bool live = i < S && t >= r.first && t <= r.p;
        double acc = 0.0;
        if (live) {
            const u16* kr = k + (((i64)pages[i / KV_PAGE] * n_kv_heads + kvh) * KV_PAGE + t % KV_PAGE) * hd;
            for (int d = sub; d < hd; d += L) acc += (double)__fmul_rn(f16_to_f32(kr[d]), q16[d]);
        }
        for (int o = L / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (sub == 0 && i < S) s[i] = live ? __fmul_rn((float)acc, scale) : -INFINITY;
    }
    __syncthreads();

    float* out = scores + head * n_spans * S;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < S; i += blockDim.x) {
        out[t0 + i] = s[i];
        mx = fmaxf(mx, s[i]);
    }
    mx = block_max(mx);
    if (threadIdx.x == 0) smax[head * n_spans + span] = mx;

    if (!last_block_of(tickets + head, r.hi - r.lo + 1)) return;
    // The global max (exact, so any order), then the sum of exps over the aligned groups of four
    // holding [first, p] (those groups lie in spans [lo, hi], all written by this launch; the
    // others would add exp(-inf) = 0), the group sums added in f64.
    mx = -INFINITY;
    for (int sp = r.lo + threadIdx.x; sp <= r.hi; sp += blockDim.x) mx = fmaxf(mx, load_cg(smax + head * n_spans + sp));
    mx = block_max(mx);
    double sum = 0.0;
    for (int g = r.first / 4 + threadIdx.x; g <= r.p / 4; g += blockDim.x) {
        float e[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) e[i] = ggml_expf(__fsub_rn(load_cg(out + 4 * g + i), mx));
        sum += (double)__fadd_rn(__fadd_rn(e[0], e[1]), __fadd_rn(e[2], e[3]));
    }
    sum = block_sum_f64(sum);
    if (threadIdx.x == 0) {
        stats[head * 2] = mx;
        stats[head * 2 + 1] = (float)(1.0 / sum);
    }
}

// Block (span, head, row): this span's share of probs · V for each d, in f64 over position
// slices (ATTN_THREADS / hd of them, each summed in position order, then added in slice order);
// the head's last block adds the spans' shares in span order into out: [rows, n_heads, hd].
// v: paged f16 cache. Dynamic shared memory: span_len f16-rounded probabilities, then
// span_len / KV_PAGE page numbers.
extern "C" __global__ void attention_pv_f32(float* out, double* partial, u32* tickets, const float* scores,
                                            const float* stats, const u16* v, const i32* table, const i32* pos,
                                            int n_heads, int n_kv_heads, int hd, int window, int capacity,
                                            int span_len, int n_spans) {
    PDL_WAIT();
    PDL_TRIGGER();
    extern __shared__ float probs[];
    __shared__ double red[ATTN_THREADS];
    const int span = blockIdx.x, h = blockIdx.y, row = blockIdx.z;
    const i64 head = (i64)row * n_heads + h;
    DecodeRange r;
    if (!decode_range(pos, row, window, capacity, span_len, &r)) {
        if (span == 0) {
            for (int d = threadIdx.x; d < hd; d += blockDim.x) out[head * hd + d] = __int_as_float(0x7fc00000);
        }
        return;
    }
    if (span < r.lo || span > r.hi) return;
    const int S = span_len, t0 = span * S;
    const int kvh = h / (n_heads / n_kv_heads);
    i32* pages = (i32*)(probs + S);  // [S / KV_PAGE]
    const float mx = stats[head * 2], inv = stats[head * 2 + 1];
    const float* sc = scores + head * n_spans * S + t0;
    for (int i = threadIdx.x; i < S; i += blockDim.x) {
        probs[i] = f16_to_f32(f32_to_f16(__fmul_rn(ggml_expf(__fsub_rn(sc[i], mx)), inv)));
    }
    // The pages of the span's positions below the capacity (the table ends there).
    for (int i = threadIdx.x; i < S / KV_PAGE && t0 + i * KV_PAGE < capacity; i += blockDim.x) {
        pages[i] = table[t0 / KV_PAGE + i];
    }
    __syncthreads();

    const int slices = ATTN_THREADS / hd;  // hd <= ATTN_THREADS (the host checks it)
    const int d = threadIdx.x % hd, slice = threadIdx.x / hd;
    const int lo_t = max(t0, r.first), hi_t = min(t0 + S - 1, r.p);
    const int per = (hi_t - lo_t + slices) / slices;
    double acc = 0.0;
    if (slice < slices) {
        const int a = lo_t + slice * per, b = min(hi_t, a + per - 1);
#pragma unroll 4
        for (int t = a; t <= b; ++t) {
            const i32 page = pages[(t - t0) / KV_PAGE];
            const u16 x = v[(((i64)page * n_kv_heads + kvh) * KV_PAGE + t % KV_PAGE) * hd + d];
            acc += (double)__fmul_rn(f16_to_f32(x), probs[t - t0]);
        }
    }
    red[threadIdx.x] = acc;
    __syncthreads();
    double* part = partial + head * n_spans * hd;
    if (threadIdx.x < hd) {
        double s = red[threadIdx.x];
        for (int j = 1; j < slices; ++j) s += red[j * hd + threadIdx.x];
        part[(i64)span * hd + threadIdx.x] = s;
    }

    if (!last_block_of(tickets + head, r.hi - r.lo + 1)) return;
    // The spans' shares: slice j adds spans lo + j*per2 .. in order, then the slices in order.
    const int n_sp = r.hi - r.lo + 1;
    const int per2 = (n_sp + slices - 1) / slices;
    acc = 0.0;
    if (slice < slices) {
        const int a = r.lo + slice * per2, b = min(r.hi, a + per2 - 1);
        int sp = a;
        for (; sp + 3 <= b; sp += 4) {
            double x[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) x[i] = load_cg(part + (i64)(sp + i) * hd + d);
#pragma unroll
            for (int i = 0; i < 4; ++i) acc += x[i];
        }
        for (; sp <= b; ++sp) acc += load_cg(part + (i64)sp * hd + d);
    }
    __syncthreads();  // every thread has read red above
    red[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x < hd) {
        double s = red[threadIdx.x];
        for (int j = 1; j < slices; ++j) s += red[j * hd + threadIdx.x];
        out[head * hd + threadIdx.x] = (float)s;
    }
}

// Writes k, v: [rows, n_kv_heads * hd] (f32) into the paged caches at positions pos[row].
extern "C" __global__ void kv_store_f32(u16* kc, u16* vc, const float* k, const float* v, const i32* table,
                                        const i32* pos, int n_kv_heads, int hd) {
    PDL_WAIT();
    PDL_TRIGGER();
    const int row = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_kv_heads * hd) return;
    const int h = i / hd, d = i % hd;
    const i64 dst = kv_index(table, pos[row], h, d, n_kv_heads, hd);
    kc[dst] = f32_to_f16(k[(i64)row * n_kv_heads * hd + i]);
    vc[dst] = f32_to_f16(v[(i64)row * n_kv_heads * hd + i]);
}
