// Causal attention of query rows over an f16 KV cache, with GQA and sliding windows.
//
// The arithmetic follows the reference CPU path (llama.cpp's, flash attention off): q rounded
// to f16; each score an f64 sum of exact f16×f16 products, rounded to f32, times `scale`;
// softmax with ggml's polynomial exp, summed per aligned group of four in f32 and then in f64;
// probabilities rounded to f16; each output an f64 sum of exact f16×f16 products. f64 sums of
// exact products do not depend on their order in practice, so the GPU lands on the CPU's values.
#include "common.cuh"
#include "quant8.cuh"

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
// Two launches, both grid (n_spans, n_heads, rows), ATTN_THREADS threads (for ranges of at most
// short_max positions the first returns at once and one block per head of the second computes
// the head in one pass, see attention_short):
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

// Short ranges (at most short_max attended positions): one block per (row, head) computes the
// whole head in attention_pv_f32, and attention_scores_f32 returns at once: no scratch, no
// tickets, one pass over K and V. Same arithmetic as the split path.
__device__ __forceinline__ bool is_short(const DecodeRange& r, int short_max) {
    return r.p - r.first + 1 <= short_max;
}

// One head of one query row over positions [first, p] by the whole block (ATTN_THREADS threads;
// hd a multiple of 8 with hd / 8 in 4..32, which the host checks), as attention_f32 computes it:
// each score an f64 sum of exact products, rounded to f32, times scale; the max; the f64 sum of
// the aligned groups of four's f32 sums of ggml_expf(s - max); probabilities rounded to f16; each
// output an f64 sum of exact products. Lanes read 8 halves at once (L = hd / 8 lanes per cache
// row, ATTN_THREADS / L rows per pass) so that many loads are in flight: one block reads a head's
// keys and values in a few round trips. smem: hd + (p - first + 8) floats; red: hd × 8 doubles
// per pass row (ATTN_THREADS × 8 in all).
// STAGED: K and V rows [first, p] are already in shared memory (`ks`, `vs`: [p - first + 1][hd]
// halves, row t at t - first), copied there by attention_one_pass_f32; the same arithmetic.
// q16_ready: smem[0, hd) already holds the f16-rounded query (and the block has synchronised
// since it was written), so qh is not read. Returns, in thread t < hd, the output it wrote to
// out_h[t] (0 in the other threads). HD: the head dimension as a compile-time constant (the
// index arithmetic then shifts instead of dividing), or 0 for hd_in's.
#if defined(KTRACE)
// attention_short's phase marks (thread 0, global timer): scores, softmax, P·V, reduction done.
__shared__ unsigned long long attn_short_marks[4];
#define ATTN_MARK(i) \
    if (threadIdx.x == 0) attn_short_marks[i] = ktrace_now()
#else
#define ATTN_MARK(i)
#endif
template <bool STAGED, int HD = 0>
__device__ float attention_short(float* out_h, const float* qh, const u16* k, const u16* v, const i32* table,
                                 int kvh, int n_kv_heads, int hd_in, float scale, int first, int p, float* smem,
                                 double* red, const u16* ks = nullptr, const u16* vs = nullptr,
                                 bool q16_ready = false) {
    const int hd = HD ? HD : hd_in;
    float* q16 = smem;
    const int base = first / 4 * 4;
    const int n = (p / 4 + 1) * 4 - base;  // the aligned groups of four holding [first, p]
    float* s = smem + hd;                   // s[i]: position base + i
    if (!q16_ready) {
        for (int d = threadIdx.x; d < hd; d += blockDim.x) q16[d] = f16_to_f32(f32_to_f16(qh[d]));
        __syncthreads();
    }
    const int L = hd / 8;
    const int sub = threadIdx.x % L, slot = threadIdx.x / L, slots = ATTN_THREADS / L;
    const int d0 = 8 * sub;
    // Scores: cache row i = slot, slot + slots, ...; four rows' loads issued before their sums.
    // The loop bound is block-uniform, so every lane reaches the shuffles.
    for (int ib = 0; ib < n; ib += 4 * slots) {
        const int i0 = ib + slot;
        uint4 w[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int t = base + i0 + j * slots;
            w[j] = make_uint4(0, 0, 0, 0);
            if (i0 + j * slots < n && t >= first && t <= p) {
                w[j] = STAGED ? *(const uint4*)(ks + (i64)(t - first) * hd + d0)
                              : *(const uint4*)(k + kv_index(table, t, kvh, d0, n_kv_heads, hd));
            }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int i = i0 + j * slots;
            const int t = base + i;
            const u32 h[4] = {w[j].x, w[j].y, w[j].z, w[j].w};
            double acc = 0.0;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const u16 x = (u16)(h[e / 2] >> (16 * (e % 2)));
                acc += (double)__fmul_rn(f16_to_f32(x), q16[d0 + e]);
            }
            for (int o = L / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (sub == 0 && i < n) s[i] = (t >= first && t <= p) ? __fmul_rn((float)acc, scale) : -INFINITY;
        }
    }
    __syncthreads();
    ATTN_MARK(0);
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, s[i]);
    mx = block_max(mx);
    double sum = 0.0;
    for (int g = threadIdx.x; g < n / 4; g += blockDim.x) {
        float e[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            e[j] = ggml_expf(__fsub_rn(s[4 * g + j], mx));
            s[4 * g + j] = e[j];
        }
        sum += (double)__fadd_rn(__fadd_rn(e[0], e[1]), __fadd_rn(e[2], e[3]));
    }
    sum = block_sum_f64(sum);
    const float inv = (float)(1.0 / sum);
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = f16_to_f32(f32_to_f16(__fmul_rn(s[i], inv)));
    __syncthreads();
    ATTN_MARK(1);
    // P·V: thread (slot, sub) sums d0 .. d0 + 7 over positions first + slot, + slots, ... in f64;
    // the slots are then added in order.
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int t0 = first + slot; t0 <= p; t0 += 4 * slots) {
        uint4 w[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int t = t0 + j * slots;
            w[j] = t > p    ? make_uint4(0, 0, 0, 0)
                   : STAGED ? *(const uint4*)(vs + (i64)(t - first) * hd + d0)
                            : *(const uint4*)(v + kv_index(table, t, kvh, d0, n_kv_heads, hd));
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int t = t0 + j * slots;
            if (t > p) break;
            const float pr = s[t - base];
            const u32 h[4] = {w[j].x, w[j].y, w[j].z, w[j].w};
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] += (double)__fmul_rn(f16_to_f32((u16)(h[e / 2] >> (16 * (e % 2)))), pr);
        }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) red[slot * hd + d0 + e] = acc[e];
    __syncthreads();
    ATTN_MARK(2);
    float result = 0.0f;
    if (threadIdx.x < hd) {
        double o = red[threadIdx.x];
        for (int j = 1; j < slots; ++j) o += red[j * hd + threadIdx.x];
        result = (float)o;
        out_h[threadIdx.x] = result;
    }
    ATTN_MARK(3);
    return result;
}

// The head `head` (of all rows' heads) of out: [rows, n_heads, hd], just written by this block,
// also quantized for the output projection as quantize_q8_* would quantize out: acts_format 1
// Q8_0, 2 Q8_1 (hd a multiple of 32: the head holds whole blocks), 3 Q8_K (hd divides 256: a
// block holds 256 / hd heads, and the last of their blocks to finish, by `tickets[block]`,
// quantizes it). The host checks the shapes.
__device__ __forceinline__ void quantize_head(const float* out, u8* acts, long long acts_meta, long long acts_bsums,
                                              int acts_format, u32* tickets, i64 head, int hd) {
    if (acts_format == 0) return;
    if (acts_format == 3) {
        __shared__ __align__(16) float vals[QK_K];
        const int per = QK_K / hd;
        const i64 b = head / per;
        if (!last_block_of(tickets + b, per)) return;
        for (int i = threadIdx.x; i < QK_K; i += blockDim.x) vals[i] = load_cg(out + b * QK_K + i);
        __syncthreads();
        if (threadIdx.x < WARP) quantize_q8_k_values(vals, acts, acts_meta, acts_bsums, (int)b);
        return;
    }
    __syncthreads();  // the head's output row is visible to the block
    const int warp = threadIdx.x / WARP;
    const int block0 = (int)(head * (hd / 32));
    if (warp < hd / 32) {
        if (acts_format == 2) {
            quantize_q8_32_block<true>(out, acts, acts_meta, block0 + warp);
        } else {
            quantize_q8_32_block<false>(out, acts, acts_meta, block0 + warp);
        }
    }
}

// Prefill with the one-pass head computation: block (row, head), ATTN_THREADS threads, hd in
// {32, 64, 128, 256}; dynamic shared memory hd + max_pos + 8 floats (max_pos: the largest
// position of the rows, sized by the host). The signature of attention_tiled_f32. Bit for bit
// attention_f32 (f64 sums of exact products; only their grouping differs), with 16-byte reads
// of the cache instead of one half per lane. A row whose position is outside the cache gets NaN.
extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
    attention_rows_f32(float* out, const float* q, const u16* k, const u16* v, const i32* table, const i32* pos,
                       int rows, int n_heads, int n_kv_heads, int hd, float scale, int window, int capacity) {
    PDL_WAIT();
    PDL_TRIGGER();
    extern __shared__ float smem[];
    __shared__ double red[8 * ATTN_THREADS];
    const int row = blockIdx.x, h = blockIdx.y;
    const i64 head = (i64)row * n_heads + h;
    const int p = pos[row];
    if (p < 0 || p >= capacity) {
        for (int d = threadIdx.x; d < hd; d += blockDim.x) out[head * hd + d] = __int_as_float(0x7fc00000);
        return;
    }
    const int first = window > 0 ? max(0, p + 1 - window) : 0;
    attention_short<false>(out + head * hd, q + head * hd, k, v, table, h / (n_heads / n_kv_heads), n_kv_heads, hd, scale,
                           first, p, smem, red);
}

// q: [rows, n_heads, hd]; k: paged f16 cache. Block (span, head, row) writes this span's scores
// (all span_len of them, -inf where masked) and their max; the head's last block then stores
// stats = (global max, inv). Dynamic shared memory: hd f16-rounded query values, then span_len
// scores, then span_len / KV_PAGE page numbers (as floats' bits).
extern "C" __global__ void attention_scores_f32(float* scores, float* smax, float* stats, u32* tickets,
                                                const float* q, const u16* k, const i32* table, const i32* pos,
                                                int n_heads, int n_kv_heads, int hd, float scale, int window,
                                                int capacity, int span_len, int n_spans, int short_max) {
    PDL_WAIT();
    PDL_TRIGGER();
    extern __shared__ float smem[];
    const int span = blockIdx.x, h = blockIdx.y, row = blockIdx.z;
    DecodeRange r;
    if (!decode_range(pos, row, window, capacity, span_len, &r) || span < r.lo || span > r.hi) return;
    if (is_short(r, short_max)) return;  // attention_pv_f32 does it all
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
// span_len / KV_PAGE page numbers; or, for a short range, block (hi, head, row) alone computes
// the head (attention_short: hd + short_max + 8 floats).
extern "C" __global__ void attention_pv_f32(float* out, double* partial, u32* tickets, const float* scores,
                                            const float* stats, const u16* v, const i32* table, const i32* pos,
                                            int n_heads, int n_kv_heads, int hd, int window, int capacity,
                                            int span_len, int n_spans, u8* acts, long long acts_meta,
                                            long long acts_bsums, int acts_format, u32* acts_tickets,
                                            const float* q, const u16* k, float scale, int short_max) {
    PDL_WAIT();
    PDL_TRIGGER();
    extern __shared__ float probs[];
    // ATTN_THREADS entries for the split path, 8 × ATTN_THREADS for attention_short.
    __shared__ double red[8 * ATTN_THREADS];
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
    const int kvh = h / (n_heads / n_kv_heads);
    if (is_short(r, short_max)) {
        if (span != r.hi) return;
        attention_short<false>(out + head * hd, q + head * hd, k, v, table, kvh, n_kv_heads, hd, scale, r.first,
                               r.p, probs, red);
        quantize_head(out, acts, acts_meta, acts_bsums, acts_format, acts_tickets, head, hd);
        return;
    }
    const int S = span_len, t0 = span * S;
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
    quantize_head(out, acts, acts_meta, acts_bsums, acts_format, acts_tickets, head, hd);
}

// rope_qk_f32 (kernels/rope.cu, the same rope_rotate) and kv_store_f32 in one launch: rotates q
// and k in place and writes the rotated k and v into the paged caches at pos[row]. Block row:
// blockIdx.y. Threads cover (head, pair) of the query heads, then of the key heads (each also
// storing its two rotated key values), then every (kv head, d) for v and the unrotated key
// dimensions d >= n_rot. cs: [rows, n_rot / 2, 2] (cos, sin).
extern "C" __global__ void rope_qk_store_f32(float* q, float* k, const float* v, u16* kc, u16* vc,
                                             const float* cs, const i32* table, const i32* pos, int n_q, int n_k,
                                             int hd, int n_rot, int neox, float scale_q, int use_scale) {
    PDL_WAIT();
    PDL_TRIGGER();
    const int row = blockIdx.y;
    const int half = n_rot / 2;
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    const int rotations = (n_q + n_k) * half;
    if (t >= rotations + n_k * hd) return;
    const int p = pos[row];
    if (t >= rotations) {
        t -= rotations;
        const int h = t / hd, d = t % hd;
        const i64 src = (i64)row * n_k * hd + t;
        const i64 dst = kv_index(table, p, h, d, n_k, hd);
        vc[dst] = f32_to_f16(v[src]);
        if (d >= n_rot) kc[dst] = f32_to_f16(k[src]);
        return;
    }
    const bool is_q = t < n_q * half;
    if (!is_q) t -= n_q * half;
    const int h = t / half, i = t % half;
    float* hp = is_q ? q + ((i64)row * n_q + h) * hd : k + ((i64)row * n_k + h) * hd;
    const rope_pair r = rope_rotate(hp, cs + (i64)row * half * 2, i, half, neox, is_q && use_scale, scale_q);
    hp[r.a] = r.r0;
    hp[r.b] = r.r1;
    if (!is_q) {
        kc[kv_index(table, p, h, r.a, n_k, hd)] = f32_to_f16(r.r0);
        kc[kv_index(table, p, h, r.b, n_k, hd)] = f32_to_f16(r.r1);
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

// ---------------------------------------------------------------------------------------------
// Prefill: attention on tensor cores (mma.sync m16n8k16, f16 inputs, f32 accumulators), tiled
// like flash attention (nothing of size rows × positions is stored), with GQA, causal and
// sliding-window masks read from each row's position, over the paged cache.
//
// Block (query tile, head), FA_WARPS warps, each owning 16 query rows. The tile's queries are
// rounded to f16 (as the CPU rounds q) into shared memory. Cache positions are visited in tiles
// of T between the smallest first position and the largest position of the block's rows, K
// staged as [T][HD] and V transposed as [HD][T] (rows padded by 8 halves so that a warp's
// fragment loads hit 32 distinct banks). Two passes keep the CPU's normalised probabilities:
// (1) the row max of the scores s = (q·k)·scale and the sum of ggml_expf(s - max), each lane
// keeping a running maximum and an f64 sum rescaled when it grows, the four lanes of a row then
// combined; (2) the probabilities ggml_expf(s - max) · (1 / sum) rounded to f16, as the CPU
// rounds them, and O = P·V. The score sums (f32 mma instead of an exact f64 sum), the exp sum's
// grouping and rescaling, and the P·V sums (f32) differ from attention_f32, so the values stay
// within ~1e-7 of it, and an f16 probability rarely rounds the other way. (Rounding
// unnormalised probabilities, the usual one-pass online softmax, moved Gemma 3's greedy
// tokens.)
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .f16 A/B, .f32 C/D; g = lane / 4, c = lane % 4):
//   A (16×16, row-major): a0 = (g, 2c..2c+1), a1 = (g+8, 2c..), a2 = (g, 2c+8..), a3 = (g+8, 2c+8..)
//   B (16×8, k × n):      b0 = (k 2c..2c+1, n g), b1 = (k 2c+8..2c+9, n g)
//   C (16×8):             c0, c1 = (g, 2c..2c+1), c2, c3 = (g+8, 2c..2c+1)
// Two adjacent n-tiles of S in C layout are exactly one A fragment of P (c0c1 of tile 2j → a0,
// c2c3 → a1, tile 2j+1 → a2, a3), so P never leaves registers; and the aligned group of four
// positions 4q..4q+3 of a row lies in the lanes c = 2q', 2q'+1 of one n-tile.
#define FA_WARPS 4
#define FA_ROWS (16 * FA_WARPS)

__device__ __forceinline__ void fa_mma(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 fa_pack(float lo, float hi) {
    return (u32)f32_to_f16(lo) | ((u32)f32_to_f16(hi) << 16);
}

__device__ __forceinline__ u32 fa_ld32(const u16* p) { return *(const u32*)p; }

// Shared memory (halves): Q [FA_ROWS][HD + 8], K [T][HD + 8], Vᵀ [HD][T + 8].
template <int HD, int T>
__device__ __forceinline__ void flash_attention(float* out, const float* q, const u16* k, const u16* v,
                                                const i32* table, const i32* pos, int rows, int n_heads,
                                                int n_kv_heads, float scale, int window, int capacity) {
    constexpr int QS = HD + 8, VS = T + 8, NT = T / 8, ND = HD / 8;
    extern __shared__ __align__(16) u16 fa_smem[];
    u16* qs = fa_smem;
    u16* ks = qs + FA_ROWS * QS;
    u16* vt = ks + T * QS;
    __shared__ int range[2];

    const int h = blockIdx.y, r0 = blockIdx.x * FA_ROWS;
    const int kvh = h / (n_heads / n_kv_heads);
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const int g = lane >> 2, c = lane & 3;
    if (tid == 0) {
        range[0] = 0x7fffffff;
        range[1] = -1;
    }
    __syncthreads();
    for (int i = tid; i < FA_ROWS * (HD / 2); i += blockDim.x) {
        const int r = i / (HD / 2), d = (i % (HD / 2)) * 2;
        float2 x = make_float2(0.0f, 0.0f);
        if (r0 + r < rows) x = *(const float2*)(q + ((i64)(r0 + r) * n_heads + h) * HD + d);
        *(u32*)(qs + r * QS + d) = fa_pack(x.x, x.y);
    }
    if (tid < FA_ROWS && r0 + tid < rows) {
        const int p = pos[r0 + tid];
        if (p >= 0 && p < capacity) {
            atomicMin(&range[0], window > 0 ? max(0, p + 1 - window) : 0);
            atomicMax(&range[1], p);
        }
    }
    __syncthreads();
    const int hi = range[1];
    const int t_first = hi < 0 ? 0x7fffffff : range[0] / T * T;
    // This thread's two rows (g and g + 8 of the warp's 16) and the positions they attend.
    const int ra = r0 + warp * 16 + g, rb = ra + 8;
    const int pa = ra < rows ? pos[ra] : -1, pb = rb < rows ? pos[rb] : -1;
    const int fa = window > 0 ? pa + 1 - window : 0, fb = window > 0 ? pb + 1 - window : 0;
    const u16* qw = qs + (warp * 16 + g) * QS + 2 * c;

    // Stages the cache tile at t0 (K, and V transposed when with_v); positions past hi are zero.
    // Consecutive threads take consecutive positions: 16-byte K stores land an odd number of
    // 16-byte units apart, V's transposed stores on consecutive halves.
    auto stage = [&](int t0, bool with_v) {
        __syncthreads();  // the previous tile is no longer read
        for (int i = tid; i < T * ND; i += blockDim.x) {
            const int j = i % T, d = (i / T) * 8, t = t0 + j;
            uint4 kx = make_uint4(0, 0, 0, 0), vx = make_uint4(0, 0, 0, 0);
            if (t <= hi) {
                const i64 at = kv_index(table, t, kvh, d, n_kv_heads, HD);
                kx = *(const uint4*)(k + at);
                if (with_v) vx = *(const uint4*)(v + at);
            }
            *(uint4*)(ks + j * QS + d) = kx;
            if (with_v) {
                const u16* ve = (const u16*)&vx;
#pragma unroll
                for (int e = 0; e < 8; ++e) vt[(d + e) * VS + j] = ve[e];
            }
        }
        __syncthreads();
    };
    // The warp's scores for the staged tile: (q·k)·scale, -inf where masked.
    auto scores = [&](int t0, float (&s)[NT][4]) {
#pragma unroll
        for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
            const u16* qa = qw + kk * 16;
            const u32 a0 = fa_ld32(qa), a1 = fa_ld32(qa + 8 * QS), a2 = fa_ld32(qa + 8),
                      a3 = fa_ld32(qa + 8 * QS + 8);
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const u16* kb = ks + (n * 8 + g) * QS + kk * 16 + 2 * c;
                fa_mma(s[n], a0, a1, a2, a3, fa_ld32(kb), fa_ld32(kb + 8));
            }
        }
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int t = t0 + n * 8 + 2 * c + (e & 1);
                const bool ok = e < 2 ? (t <= pa && t >= fa) : (t <= pb && t >= fb);
                s[n][e] = ok ? __fmul_rn(s[n][e], scale) : -INFINITY;
            }
        }
    };

    // Pass 1: each lane's running maximum of its scores and the f64 sum of its exps relative
    // to it (rescaled when the maximum grows); then the lanes of a row combined.
    float m[2] = {-INFINITY, -INFINITY};
    double sum[2] = {0.0, 0.0};
    for (int t0 = t_first; t0 <= hi; t0 += T) {
        stage(t0, false);
        float s[NT][4];
        scores(t0, s);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            float tile_max = -INFINITY;
#pragma unroll
            for (int n = 0; n < NT; ++n) tile_max = fmaxf(tile_max, fmaxf(s[n][2 * i], s[n][2 * i + 1]));
            if (tile_max == -INFINITY) continue;  // nothing of this tile is attended
            if (tile_max > m[i]) {
                if (m[i] != -INFINITY) sum[i] *= (double)ggml_expf(__fsub_rn(m[i], tile_max));
                m[i] = tile_max;
            }
            float part = 0.0f;
#pragma unroll
            for (int n = 0; n < NT; ++n)
                part = __fadd_rn(part, __fadd_rn(ggml_expf(__fsub_rn(s[n][2 * i], m[i])),
                                                  ggml_expf(__fsub_rn(s[n][2 * i + 1], m[i]))));
            sum[i] += (double)part;
        }
    }
    float inv[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float row_max = m[i];
        row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
        row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
        double mine = m[i] == -INFINITY ? 0.0 : sum[i] * (double)ggml_expf(__fsub_rn(m[i], row_max));
        mine += __shfl_xor_sync(0xffffffffu, mine, 1);
        mine += __shfl_xor_sync(0xffffffffu, mine, 2);
        m[i] = row_max;
        inv[i] = (float)(1.0 / mine);
    }

    // Pass 2: P = f16(exp · inv), O += P·V.
    float o[ND][4];
#pragma unroll
    for (int j = 0; j < ND; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    for (int t0 = t_first; t0 <= hi; t0 += T) {
        stage(t0, true);
        float s[NT][4];
        scores(t0, s);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[n][e] = __fmul_rn(ggml_expf(__fsub_rn(s[n][e], m[e >> 1])), inv[e >> 1]);
            }
        }
#pragma unroll
        for (int kk = 0; kk < T / 16; ++kk) {
            const u32 a0 = fa_pack(s[2 * kk][0], s[2 * kk][1]), a1 = fa_pack(s[2 * kk][2], s[2 * kk][3]);
            const u32 a2 = fa_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                      a3 = fa_pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int j = 0; j < ND; ++j) {
                const u16* vb = vt + (j * 8 + g) * VS + kk * 16 + 2 * c;
                fa_mma(o[j], a0, a1, a2, a3, fa_ld32(vb), fa_ld32(vb + 8));
            }
        }
    }

    // A row that attended nothing (its position outside the cache) has a NaN sum: NaN shows
    // the caller's error.
#pragma unroll
    for (int j = 0; j < ND; ++j) {
        const int d = j * 8 + 2 * c;
        if (ra < rows) *(float2*)(out + ((i64)ra * n_heads + h) * HD + d) = make_float2(o[j][0], o[j][1]);
        if (rb < rows) *(float2*)(out + ((i64)rb * n_heads + h) * HD + d) = make_float2(o[j][2], o[j][3]);
    }
}

// out, q: [rows, n_heads, HD]; k, v: paged f16 caches (hd = HD, unused: the same parameters as
// attention_tiled_f32, so one host launcher serves both); grid (ceil(rows / FA_ROWS), n_heads),
// FA_WARPS * 32 threads, dynamic shared memory (FA_ROWS + T) * (HD + 8) * 2 + HD * (T + 8) * 2.
#define FLASH_KERNEL(HD, T)                                                                               \
    extern "C" __global__ void __launch_bounds__(FA_WARPS * WARP)                                         \
        attention_flash_hd##HD(float* out, const float* q, const u16* k, const u16* v, const i32* table,  \
                               const i32* pos, int rows, int n_heads, int n_kv_heads, int hd,             \
                               float scale, int window, int capacity) {                                   \
        PDL_WAIT();                                                                                       \
        PDL_TRIGGER();                                                                                    \
        (void)hd; /* HD is the template's; the parameter keeps attention_tiled_f32's signature */         \
        flash_attention<HD, T>(out, q, k, v, table, pos, rows, n_heads, n_kv_heads, scale, window,       \
                               capacity);                                                                 \
    }
FLASH_KERNEL(32, 64)
FLASH_KERNEL(64, 64)
FLASH_KERNEL(128, 64)
FLASH_KERNEL(256, 32)

// ---------------------------------------------------------------------------------------------
// Prefill, exact and tiled: attention_f32's arithmetic (bit for bit the same values), organised
// like flash attention. Block (16 query rows, head), 256 threads; cache positions are visited in
// tiles of EX_T between the smallest first position and the largest position of the block's
// rows, three times (row max; sum of exps; probabilities · V), so nothing of size rows ×
// positions is stored and every K/V tile is shared by 16 rows.
//
// Scores: warp w owns rows 2w and 2w + 1, lane j position t0 + j; s = Σ_d q16·k16 in f64 (the
// products are exact in f64, so the f64 FMA adds exactly what attention_f32 adds), rounded to
// f32, times scale. The exps of an aligned group of four positions (lanes 4q .. 4q+3) are added
// in f32 as ((e0 + e1) + (e2 + e3)), the groups in f64; probabilities f16(exp · inv); each output
// an f64 sum of the exact products p·v. f64 sums of exact products do not depend on their order
// in practice (as in the decode kernels), which is what makes the result attention_f32's.
//
// Shared memory: Q [EX_ROWS][hd] f64, K [EX_T][hd + 1] f32 (f16 values; padded so the lanes of
// a warp, reading one d of 32 positions, hit 32 banks), V [EX_T][hd] f32, P [EX_ROWS][EX_T] f32.
#define EX_ROWS 16
#define EX_T 32
#define EX_THREADS 256

extern "C" __global__ void __launch_bounds__(EX_THREADS)
    attention_tiled_f32(float* out, const float* q, const u16* k, const u16* v, const i32* table, const i32* pos,
                        int rows, int n_heads, int n_kv_heads, int hd, float scale, int window, int capacity) {
    PDL_WAIT();
    PDL_TRIGGER();
    extern __shared__ __align__(16) double ex_smem[];
    double* qs = ex_smem;                          // [EX_ROWS][hd]
    float* ks = (float*)(qs + EX_ROWS * hd);       // [EX_T][hd + 1]
    float* vs = ks + EX_T * (hd + 1);              // [EX_T][hd]
    float* ps = vs + EX_T * hd;                    // [EX_ROWS][EX_T]
    __shared__ int range[2];

    const int h = blockIdx.y, r0 = blockIdx.x * EX_ROWS;
    const int kvh = h / (n_heads / n_kv_heads);
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    if (tid == 0) {
        range[0] = 0x7fffffff;
        range[1] = -1;
    }
    __syncthreads();
    for (int i = tid; i < EX_ROWS * hd; i += blockDim.x) {
        const int r = i / hd, d = i % hd;
        const float x = r0 + r < rows ? q[((i64)(r0 + r) * n_heads + h) * hd + d] : 0.0f;
        qs[i] = (double)f16_to_f32(f32_to_f16(x));
    }
    if (tid < EX_ROWS && r0 + tid < rows) {
        const int p = pos[r0 + tid];
        if (p >= 0 && p < capacity) {
            atomicMin(&range[0], window > 0 ? max(0, p + 1 - window) : 0);
            atomicMax(&range[1], p);
        }
    }
    __syncthreads();
    const int hi = range[1];
    const int t_first = hi < 0 ? 0x7fffffff : range[0] / EX_T * EX_T;
    // This warp's two rows and the positions they attend (-1: none).
    int prow[2], frow[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = r0 + 2 * warp + i;
        prow[i] = r < rows ? pos[r] : -1;
        frow[i] = window > 0 ? max(0, prow[i] + 1 - window) : 0;
    }
    const double* q0 = qs + (2 * warp) * hd;
    const double* q1 = q0 + hd;

    auto stage = [&](int t0, bool with_v) {
        __syncthreads();  // the previous tile is no longer read
        for (int i = tid; i < EX_T * hd; i += blockDim.x) {
            const int j = i / hd, d = i % hd, t = t0 + j;
            u16 kx = 0, vx = 0;
            if (t <= hi) {
                const i64 at = kv_index(table, t, kvh, d, n_kv_heads, hd);
                kx = k[at];
                if (with_v) vx = v[at];
            }
            ks[j * (hd + 1) + d] = f16_to_f32(kx);
            if (with_v) vs[j * hd + d] = f16_to_f32(vx);
        }
        __syncthreads();
    };
    // Scores of this warp's two rows at position t0 + lane: -inf where masked.
    auto scores = [&](int t0, float (&s)[2]) {
        const float* kr = ks + lane * (hd + 1);
        double a0 = 0.0, a1 = 0.0;
        for (int d = 0; d < hd; ++d) {
            const double kd = (double)kr[d];
            a0 = fma(q0[d], kd, a0);
            a1 = fma(q1[d], kd, a1);
        }
        const int t = t0 + lane;
        s[0] = t >= frow[0] && t <= prow[0] ? __fmul_rn((float)a0, scale) : -INFINITY;
        s[1] = t >= frow[1] && t <= prow[1] ? __fmul_rn((float)a1, scale) : -INFINITY;
    };

    // Pass 1: the row maxima.
    float m[2] = {-INFINITY, -INFINITY};
    for (int t0 = t_first; t0 <= hi; t0 += EX_T) {
        stage(t0, false);
        float s[2];
        scores(t0, s);
        m[0] = fmaxf(m[0], warp_max(s[0]));
        m[1] = fmaxf(m[1], warp_max(s[1]));
    }
    // Pass 2: the sums of exps over aligned groups of four (f32), the groups in f64.
    double sum[2] = {0.0, 0.0};
    for (int t0 = t_first; t0 <= hi; t0 += EX_T) {
        stage(t0, false);
        float s[2];
        scores(t0, s);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const float e = ggml_expf(__fsub_rn(s[i], m[i]));
            const float pair = __fadd_rn(e, __shfl_xor_sync(0xffffffffu, e, 1));
            const float group = __fadd_rn(pair, __shfl_xor_sync(0xffffffffu, pair, 2));
            if (lane % 4 == 0) sum[i] += (double)group;
        }
    }
    float inv[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) inv[i] = (float)(1.0 / warp_sum_f64(sum[i]));

    // Pass 3: f16-rounded probabilities into P, then each thread's outputs (d = tid % hd, rows
    // tid / hd + k · 256 / hd) accumulate p · v in f64.
    const int d = tid % hd, rg = EX_THREADS / hd, rpt = EX_ROWS / rg;
    double acc[EX_ROWS];
#pragma unroll
    for (int i = 0; i < EX_ROWS; ++i) acc[i] = 0.0;
    for (int t0 = t_first; t0 <= hi; t0 += EX_T) {
        stage(t0, true);
        float s[2];
        scores(t0, s);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            ps[(2 * warp + i) * EX_T + lane] =
                f16_to_f32(f32_to_f16(__fmul_rn(ggml_expf(__fsub_rn(s[i], m[i])), inv[i])));
        }
        __syncthreads();
        for (int j = 0; j < EX_T; ++j) {
            const double vv = (double)vs[j * hd + d];
#pragma unroll
            for (int i = 0; i < EX_ROWS; ++i) {
                if (i < rpt) acc[i] = fma((double)ps[(tid / hd + i * rg) * EX_T + j], vv, acc[i]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < EX_ROWS; ++i) {
        const int r = r0 + tid / hd + i * rg;
        if (i < rpt && r < rows) out[((i64)r * n_heads + h) * hd + d] = (float)acc[i];
    }
}

// 16 bytes from global to shared memory, asynchronously (L2 only).
__device__ __forceinline__ void attn_cp_async16(void* dst, const void* src) {
    const u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}

// Decode steps whose every row attends at most `stage_rows` positions (the one-pass side of
// attention_pv_f32, launched alone): block (0, head, row) computes the head as attention_short
// does, bit for bit, from K and V rows copied to shared memory first. Rows below pos[row] were
// written by earlier steps and positions and pages by the host before the step, and every kernel
// of the step waits for its predecessor before letting its dependents start: so the rows below
// every row's position are copied before this kernel's PDL wait, their DRAM latency overlapping
// the previous kernels, and only the rows from the smallest position on (which the previous
// kernel, RoPE with the cache store, writes) after it. The caller's contract: the kernel launched
// just before writes no cache row below the smallest position. One round trip for the whole head
// instead of one per pass of the block over K, then V.
// Grid (1, n_heads, rows), ATTN_THREADS threads; dynamic shared memory: the attention_short
// floats (hd + stage_rows + 8, rounded up to a multiple of 4), then K and V [stage_rows][hd]
// halves each. A row attending more than stage_rows positions (which the host rules out) or a
// position outside the cache gets NaN.
//
// With `k_new` (one row, the decode step's: the host checks), the step's key and value are not in
// the cache yet: the block rotates its query head in place and the key of its KV head (RoPE with
// the (cos, sin) of `cs`, rope_qk_store_f32's arithmetic), puts that key and value (rounded to
// f16) in shared memory as the current row, and the first query head of each KV group stores
// them in the cache and the rotated f32 key in `k_rot` (the tensor the host returns as the
// rotated keys). Then no RoPE-and-store launch precedes this one.
//
// `attention_one_pass_hd64_f32` / `_hd128_f32`: the same kernel for one head dimension, known at
// compile time (HD; the `hd` argument must equal it: the host checks). Taken only with
// SYNAPTIX_ATTN_HD=1 until measured (docs/cuda.md, fifteenth pass).
#define ATTN_ONE_PASS_PARAMS                                                                                     \
    float *out, float *q, u16 *k, u16 *v, const i32 *table, const i32 *pos, int n_heads, int n_kv_heads,         \
        int hd_in, int window, int capacity, int stage_rows, float scale, u8 *acts, long long acts_meta,         \
        long long acts_bsums, int acts_format, u32 *acts_tickets, const float *k_new, const float *v_new,        \
        float *k_rot, const float *cs, int n_rot, int neox, float scale_q, int use_scale
#define ATTN_ONE_PASS_ARGS                                                                                       \
    out, q, k, v, table, pos, n_heads, n_kv_heads, hd_in, window, capacity, stage_rows, scale, acts, acts_meta,  \
        acts_bsums, acts_format, acts_tickets, k_new, v_new, k_rot, cs, n_rot, neox, scale_q, use_scale
template <int HD>
__device__ __forceinline__ void attention_one_pass(ATTN_ONE_PASS_PARAMS) {
    const int hd = HD ? HD : hd_in;
#if defined(KTRACE)
    const unsigned long long kt0 = ktrace_now();
#endif
    extern __shared__ __align__(16) float one_pass_smem[];
    float* const smem = one_pass_smem;
    __shared__ double red[8 * ATTN_THREADS];
    const int h = blockIdx.y, row = blockIdx.z;
    const i64 head = (i64)row * n_heads + h;
    const int kvh = h / (n_heads / n_kv_heads);
    const int p = pos[row];
    const int first = window > 0 ? max(0, p + 1 - window) : 0;
    const bool ok = p >= 0 && p < capacity && p - first + 1 <= stage_rows;
    const int floats = (hd + stage_rows + 8 + 3) / 4 * 4;
    u16* ks = (u16*)(smem + floats);
    u16* vs = ks + (i64)stage_rows * hd;
    const int L = hd / 8;
    // Positions from the smallest of the rows' on may be the previous kernel's writes.
    int early_end = p;
    for (int j = 0; j < (int)gridDim.z; ++j) early_end = min(early_end, pos[j]);
    early_end = max(early_end, first);
    auto stage = [&](int from, int to) {  // K and V rows [from, to)
        for (int i = threadIdx.x; i < (to - from) * L; i += blockDim.x) {
            const int t = from + i / L, d0 = 8 * (i % L);
            const i64 at = kv_index(table, t, kvh, d0, n_kv_heads, hd), at_s = (i64)(t - first) * hd + d0;
            attn_cp_async16(ks + at_s, k + at);
            attn_cp_async16(vs + at_s, v + at);
        }
    };
    if (ok) stage(first, early_end);
    PDL_WAIT();
    PDL_TRIGGER();
#if defined(KTRACE)
    const unsigned long long kt1 = ktrace_now();
#endif
    if (!ok) {
        for (int d = threadIdx.x; d < hd; d += blockDim.x) out[head * hd + d] = __int_as_float(0x7fc00000);
        return;
    }
    if (k_new) {
        const int half = n_rot / 2;
        const bool leader = h % (n_heads / n_kv_heads) == 0;
        float* qh = q + head * hd;
        const float* kh = k_new + (i64)kvh * hd;
        const float* vh = v_new + (i64)kvh * hd;
        u16* ksr = ks + (i64)(p - first) * hd;
        u16* vsr = vs + (i64)(p - first) * hd;
        // hd <= 256 = ATTN_THREADS (the host checks hd / 8 <= 32): thread t rotates pair t < half
        // and handles element t < hd. Every value read first, so that the three reads of the
        // previous kernel's output are one round trip, not one after each store.
        const int t = threadIdx.x;
        const bool pair = t < half, elem = t < hd, tail = elem && t >= n_rot;
        float vt = 0.0f, qt = 0.0f, kt = 0.0f;
        if (elem) vt = vh[t];
        if (tail) {
            qt = qh[t];
            kt = kh[t];
        }
        rope_pair rq, rk;
        if (pair) {
            rq = rope_rotate(qh, cs, t, half, neox, use_scale != 0, scale_q);
            rk = rope_rotate(kh, cs, t, half, neox, false, 1.0f);
        }
        if (pair) {
            qh[rq.a] = rq.r0;
            qh[rq.b] = rq.r1;
            // attention_short's f16-rounded query, without reading qh back.
            smem[rq.a] = f16_to_f32(f32_to_f16(rq.r0));
            smem[rq.b] = f16_to_f32(f32_to_f16(rq.r1));
            const u16 a = f32_to_f16(rk.r0), b = f32_to_f16(rk.r1);
            ksr[rk.a] = a;
            ksr[rk.b] = b;
            if (leader) {
                k[kv_index(table, p, kvh, rk.a, n_kv_heads, hd)] = a;
                k[kv_index(table, p, kvh, rk.b, n_kv_heads, hd)] = b;
                k_rot[(i64)kvh * hd + rk.a] = rk.r0;
                k_rot[(i64)kvh * hd + rk.b] = rk.r1;
            }
        }
        if (elem) {
            const u16 c = f32_to_f16(vt);
            vsr[t] = c;
            if (leader) v[kv_index(table, p, kvh, t, n_kv_heads, hd)] = c;
            if (tail) {
                smem[t] = f16_to_f32(f32_to_f16(qt));
                const u16 a = f32_to_f16(kt);
                ksr[t] = a;
                if (leader) {
                    k[kv_index(table, p, kvh, t, n_kv_heads, hd)] = a;
                    k_rot[(i64)kvh * hd + t] = kt;
                }
            }
        }
    } else {
        stage(early_end, p + 1);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();  // the staged rows, the current row and the rotated query are in place
#if defined(KTRACE)
    const unsigned long long kt2 = ktrace_now();
#endif
    const float o = attention_short<true, HD>(out + head * hd, q + head * hd, k, v, table, kvh, n_kv_heads, hd, scale,
                                          first, p, smem, red, ks, vs, k_new != nullptr);
#if defined(KTRACE)
    if (threadIdx.x == 0)
        printf("KT attn %d %d %d %d %llu %llu %llu %llu %llu\n", n_heads, hd, h, p, kt0, kt1, kt2, ktrace_now(),
               ktrace_now());
    // The phases: "KTA <head> <position> <row ready> <scores> <softmax> <P·V> <reduced>" (the
    // quantization for the output projection follows, untimed).
    if (threadIdx.x == 0)
        printf("KTA %d %d %llu %llu %llu %llu %llu\n", h, p, kt2, attn_short_marks[0], attn_short_marks[1],
               attn_short_marks[2], attn_short_marks[3]);
#endif
    if (acts_format == 1 || acts_format == 2) {
        // Q8_0 / Q8_1 blocks of 32 outputs: warp w < hd / 32 holds outputs 32w .. 32w + 31 in
        // its lanes, the values quantize_head would read back from out.
        const int warp = threadIdx.x / WARP;
        const int block = (int)(head * (hd / 32)) + warp;
        if (warp < hd / 32) {
            if (acts_format == 2) {
                quantize_q8_32_value<true>(o, acts, acts_meta, block);
            } else {
                quantize_q8_32_value<false>(o, acts, acts_meta, block);
            }
        }
        return;
    }
    quantize_head(out, acts, acts_meta, acts_bsums, acts_format, acts_tickets, head, hd);
}
extern "C" __global__ void attention_one_pass_f32(ATTN_ONE_PASS_PARAMS) {
    PDL_WAITS_INSIDE();
    attention_one_pass<0>(ATTN_ONE_PASS_ARGS);
}
extern "C" __global__ void attention_one_pass_hd64_f32(ATTN_ONE_PASS_PARAMS) {
    PDL_WAITS_INSIDE();
    attention_one_pass<64>(ATTN_ONE_PASS_ARGS);
}
extern "C" __global__ void attention_one_pass_hd128_f32(ATTN_ONE_PASS_PARAMS) {
    PDL_WAITS_INSIDE();
    attention_one_pass<128>(ATTN_ONE_PASS_ARGS);
}
