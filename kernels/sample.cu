// Token choice on the GPU, so only ids cross to the host.
#include "common.cuh"

// out[0] = index of the largest x (lowest index on ties). One block.
extern "C" __global__ void argmax_f32(i32* out, const float* x, int n) {
    PDL_WAIT();
    PDL_TRIGGER();
    __shared__ float best_v[1024];
    __shared__ int best_i[1024];
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        if (x[i] > bv) {
            bv = x[i];
            bi = i;
        }
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float ov = best_v[threadIdx.x + s];
            const int oi = best_i[threadIdx.x + s];
            if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x])) {
                best_v[threadIdx.x] = ov;
                best_i[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = best_i[0] == 0x7fffffff ? 0 : best_i[0];
}

// ---------------------------------------------------------------------------------------------
// Repetition / frequency / presence penalties, bit for bit the CPU sampler's arithmetic
// (crates/sample/src/lib.rs `apply_penalties`), on the logits in place.
//
// x: [n] logits. pairs: [capacity][2] i32 = (token id, occurrences in the penalty window), the
// distinct tokens of the window (each id at most once: two threads must not update one logit).
// live: [1] i32, the number of valid pairs, read on the device (clamped to 0 ..= capacity) so
// that a recorded graph can be replayed with another window. Ids outside 0 .. n are skipped.
// Per listed token, as the CPU does it (f32, each operation rounded, no fused multiply-add):
//   l = l <= 0 ? l * repeat : l / repeat;   l -= (f32)count * frequency + presence
extern "C" __global__ void apply_penalties_f32(float* x, int n, const i32* pairs, const i32* live,
                                               int capacity, float repeat, float frequency,
                                               float presence) {
    PDL_WAIT();
    PDL_TRIGGER();
    const int count = min(max(live[0], 0), capacity);
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < count; p += gridDim.x * blockDim.x) {
        const int id = pairs[2 * p];
        const int occurrences = pairs[2 * p + 1];
        if (id < 0 || id >= n) continue;
        float l = x[id];
        l = l <= 0.0f ? __fmul_rn(l, repeat) : __fdiv_rn(l, repeat);
        l = __fsub_rn(l, __fadd_rn(__fmul_rn((float)occurrences, frequency), presence));
        x[id] = l;
    }
}

// ---------------------------------------------------------------------------------------------
// Top-k: the k (1 ..= 256) largest logits, sorted as the CPU sampler sorts its candidates
// (`b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))`: value descending in IEEE total order, so
// -0.0 < +0.0 and -inf last; ties to the lowest id), NaN excluded.
//
// Every element is one u64 "composite": high word = the value's total-order key (the f32 bits
// with the sign bit flipped for non-negative values and all bits flipped for negative ones, an
// unsigned integer ordered like `total_cmp`), low word = ~id (a lower id is larger). Composites
// of distinct ids are distinct, so "the top k" is one well-defined set, and the CPU order is
// plain u64 descending order. NaN maps to 0, which is below every valid composite (the smallest
// valid one, -inf, has high word 0x007fffff) and is never a candidate.
//
// Selection inside one block of 1024 threads, each holding E composites in registers:
//  1. Split the threads into NG groups of T = 1024 / NG consecutive threads (NG = the power of
//     two >= 4k, at least 32: 32 ..= 1024 for k <= 256), take each group's maximum, and sort
//     the NG maxima (bitonic). tau = the k-th largest group maximum.
//  2. Candidates = every element >= tau. At least k elements are >= tau (the k group maxima
//     themselves), so the top k are all candidates; and a candidate lies in one of the k groups
//     whose maximum is >= tau, so there are at most k * T * E <= 256 * E candidates (<= 4096 =
//     TK_CAP for E <= 16). Typically only a few more than k: two of the top elements rarely
//     share a group. (If tau is 0, fewer than k groups hold a valid element and the candidates
//     are all valid elements, again at most (k - 1) * T * E.)
//  3. More than 1024 candidates (adversarial layouts only): once more, with the candidates as
//     the input, 4 per thread: at most 256 * 4 = 1024 remain.
//  4. Order the c <= 1024 candidates: up to TK_RANK_MAX by counting, for each, the candidates
//     larger than it (its rank; distinct composites give distinct ranks); more by a bitonic
//     sort. Ranks below k are the output.
// The full top-k: stage 1 (`topk_partial_f32_e*`, ceil(n / (1024 E)) blocks) writes each
// block's sorted top k of its 1024 E logits (0-padded) to partial[block][k]; stage 2
// (`topk_merge_e*`, one block) selects the top k of those G * k composites the same way and
// writes ids, values and their count. Launch shapes depend on n and k only.

#define TK_THREADS 1024
#define TK_CAP 4096
#define TK_RANK_MAX 384

struct TkShared {
    u64 buf[TK_CAP];  // candidates; [0, 2048) also serves as the sort's exchange buffers
    u64 tau;
    int count;
};

__device__ __forceinline__ u64 tk_composite(float v, int id) {
    const u32 b = __float_as_uint(v);
    if ((b & 0x7fffffffu) > 0x7f800000u) return 0;  // NaN: not a candidate
    const u32 key = b ^ ((b >> 31) ? 0xffffffffu : 0x80000000u);
    return ((u64)key << 32) | (u64)(~(u32)id);
}

__device__ __forceinline__ int tk_id(u64 c) { return (int)(~(u32)c); }

__device__ __forceinline__ float tk_value(u64 c) {
    const u32 key = (u32)(c >> 32);
    return __uint_as_float((key & 0x80000000u) ? (key ^ 0x80000000u) : ~key);
}

__device__ __forceinline__ u64 tk_shfl_xor(u64 v, int lane_mask) {
    const u32 lo = __shfl_xor_sync(0xffffffffu, (u32)v, lane_mask);
    const u32 hi = __shfl_xor_sync(0xffffffffu, (u32)(v >> 32), lane_mask);
    return ((u64)hi << 32) | lo;
}

__device__ __forceinline__ u64 tk_max(u64 a, u64 b) { return a > b ? a : b; }
__device__ __forceinline__ u64 tk_min(u64 a, u64 b) { return a < b ? a : b; }

// Bitonic sort, descending, of the values `v` of threads 0 .. p (p a power of two, 32 ..= 1024);
// returns the (threadIdx.x)-th largest to each of those threads. Every thread of the block must
// call it (barriers); threads >= p only take part in the barriers and shuffles (their partners
// are threads >= p too, as partner = t ^ j with j < p). Partners closer than a warp exchange by
// shuffles; farther ones through `xa` / `xb` ([1024] each, alternated so one barrier per
// stage suffices: a buffer is rewritten only after a later stage's barrier, which every reader
// of the earlier stage has passed). Starts with a barrier so that the caller's reads of the
// exchange memory are finished; the caller needs a barrier before writing it again.
__device__ u64 tk_bitonic_desc(u64 v, int p, u64* xa, u64* xb) {
    const int t = threadIdx.x;
    const bool on = t < p;
    bool second = false;
    __syncthreads();
    for (int size = 2; size <= p; size <<= 1) {
        for (int j = size >> 1; j > 0; j >>= 1) {
            u64 o;
            if (j >= WARP) {
                u64* x = second ? xb : xa;
                second = !second;
                if (on) x[t] = v;
                __syncthreads();
                o = on ? x[t ^ j] : 0;
            } else {
                o = tk_shfl_xor(v, j);
            }
            // Runs of `size` alternate direction; the last one (size == p) is descending.
            const bool descending = (t & size) == 0;
            const bool lower = (t & j) == 0;
            v = (lower == descending) ? tk_max(v, o) : tk_min(v, o);
        }
    }
    return v;
}

// Number of groups for k: the power of two >= 4k, at least 32 (so 32 ..= 1024 for k <= 256).
__device__ __forceinline__ int tk_groups(int k) {
    int ng = WARP;
    while (ng < 4 * k && ng < TK_THREADS) ng <<= 1;
    return ng;
}

// Steps 1-2 on the E composites of each thread: leaves the candidates (every valid element >=
// tau) in s.buf[0, c), in no particular order, and returns c (<= 256 * E, see above).
template <int E>
__device__ int tk_round(const u64 (&v)[E], int k, int ng, TkShared& s) {
    const int t = threadIdx.x, lane = t % WARP;
    const int per_group = TK_THREADS / ng;  // 1 ..= 32 threads, inside one warp
    u64 m = 0;
#pragma unroll
    for (int j = 0; j < E; ++j) m = tk_max(m, v[j]);
    for (int o = 1; o < per_group; o <<= 1) m = tk_max(m, tk_shfl_xor(m, o));
    __syncthreads();  // s.buf may still be read by the caller (the previous round's candidates)
    if ((t & (per_group - 1)) == 0) s.buf[t / per_group] = m;
    __syncthreads();
    u64 g = t < ng ? s.buf[t] : 0;
    g = tk_bitonic_desc(g, ng, s.buf, s.buf + TK_THREADS);
    if (t == k - 1) s.tau = g;  // k - 1 < ng (ng >= 4k)
    if (t == 0) s.count = 0;
    __syncthreads();
    const u64 tau = s.tau;
    // Append the candidates, one shared atomic per warp and element slot.
#pragma unroll
    for (int j = 0; j < E; ++j) {
        const bool keep = v[j] != 0 && v[j] >= tau;
        const u32 mask = __ballot_sync(0xffffffffu, keep);
        if (mask == 0) continue;  // uniform across the warp
        const int leader = __ffs(mask) - 1;
        int at = 0;
        if (lane == leader) at = atomicAdd(&s.count, __popc(mask));
        at = __shfl_sync(0xffffffffu, at, leader) + __popc(mask & ((1u << lane) - 1u));
        if (keep && at < TK_CAP) s.buf[at] = v[j];  // at < TK_CAP always holds (bound above)
    }
    __syncthreads();
    return min(s.count, TK_CAP);
}

// Steps 1-3: candidates in s.buf[0, c), c <= 1024, containing the block's top k (all of its
// valid elements when it has fewer than k). Returns c.
template <int E>
__device__ int tk_select(const u64 (&v)[E], int k, TkShared& s) {
    const int ng = tk_groups(k);
    int c = tk_round<E>(v, k, ng, s);
    if (c > TK_THREADS) {
        u64 w[TK_CAP / TK_THREADS];
#pragma unroll
        for (int j = 0; j < TK_CAP / TK_THREADS; ++j) {
            const int at = j * TK_THREADS + threadIdx.x;
            w[j] = at < c ? s.buf[at] : 0;
        }
        c = tk_round<TK_CAP / TK_THREADS>(w, k, ng, s);  // starts with a barrier: reads done
    }
    return min(c, TK_THREADS);  // the bound makes this a no-op
}

// Step 4: this thread's candidate and its rank (position in descending order), when the rank
// is below k. Every thread of the block must call it (the sort path has barriers).
__device__ bool tk_order(int c, int k, TkShared& s, int* rank, u64* value) {
    const int t = threadIdx.x;
    if (c <= TK_RANK_MAX) {
        if (t >= c) return false;
        const u64 me = s.buf[t];
        int r = 0;
#pragma unroll 4
        for (int j = 0; j < c; ++j) r += s.buf[j] > me ? 1 : 0;  // one broadcast read per j
        *rank = r;
        *value = me;
        return r < k;
    }
    int p = WARP;
    while (p < c) p <<= 1;
    u64 w = t < c ? s.buf[t] : 0;
    w = tk_bitonic_desc(w, p, s.buf, s.buf + TK_THREADS);
    *rank = t;
    *value = w;
    return t < k && t < c;
}

// Stage 1: block b takes logits [b * 1024 E, (b + 1) * 1024 E) (thread t: b * 1024 E + j * 1024
// + t for j < E, coalesced) and writes its top k, descending, to partial[b * k, (b + 1) * k),
// 0 past its number of valid logits. Grid: ceil(n / (1024 E)) blocks of 1024 threads.
template <int E>
__device__ void tk_partial(const float* x, int n, int k, u64* partial) {
    __shared__ TkShared s;
    const int t = threadIdx.x;
    const int base = blockIdx.x * (E * TK_THREADS);
    u64 v[E];
#pragma unroll
    for (int j = 0; j < E; ++j) {
        const int i = base + j * TK_THREADS + t;
        v[j] = i < n ? tk_composite(x[i], i) : 0;
    }
    const int c = tk_select<E>(v, k, s);
    int r;
    u64 val;
    u64* out = partial + (size_t)blockIdx.x * k;
    if (tk_order(c, k, s, &r, &val)) out[r] = val;
    if (t >= c && t < k) out[t] = 0;  // ranks cover [0, min(c, k)); pad the rest
}

// Stage 2: the top k of partial[m] (m = blocks * k composites, 0 = none), as ids [k], values
// [k] (the exact logits) and count [1] = how many were written (k unless fewer than k logits
// are not NaN). One block of 1024 threads; E >= m / 1024.
template <int E>
__device__ void tk_merge(const u64* partial, int m, int k, i32* ids, float* vals, i32* count) {
    __shared__ TkShared s;
    const int t = threadIdx.x;
    u64 v[E];
#pragma unroll
    for (int j = 0; j < E; ++j) {
        const int i = j * TK_THREADS + t;
        v[j] = i < m ? partial[i] : 0;
    }
    const int c = tk_select<E>(v, k, s);
    int r;
    u64 val;
    if (tk_order(c, k, s, &r, &val)) {
        ids[r] = tk_id(val);
        vals[r] = tk_value(val);
    }
    if (t == 0) count[0] = min(c, k);
}

#define TK_KERNELS(E)                                                                          \
    extern "C" __global__ void __launch_bounds__(TK_THREADS)                                   \
        topk_partial_f32_e##E(const float* x, int n, int k, u64* partial) {                    \
        PDL_WAIT();                                                                            \
        PDL_TRIGGER();                                                                         \
        tk_partial<E>(x, n, k, partial);                                                       \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(TK_THREADS)                                   \
        topk_merge_e##E(const u64* partial, int m, int k, i32* ids, float* vals, i32* count) { \
        PDL_WAIT();                                                                            \
        PDL_TRIGGER();                                                                         \
        tk_merge<E>(partial, m, k, ids, vals, count);                                          \
    }
TK_KERNELS(1)
TK_KERNELS(4)
TK_KERNELS(8)
TK_KERNELS(16)

// out[0] = index of the largest x (lowest index on ties; NaN never wins; 0 when nothing beats
// -inf), like argmax_f32 but over many blocks: each block reduces a slice (by warp shuffles,
// then its warps' results) into partial_v / partial_i [gridDim.x]; the last block to finish
// (counted by `done`, which atomicInc returns to 0 for the next launch) reduces the partials with
// its first warp. done: one u32, zero before the first launch. At most 32 warps a block. (Shuffles
// instead of a shared-memory tree with a barrier a level: on the H200, 151,936 logits 5.69 →
// 5.54 µs; 0.5B Q8_0 tg128 1,384.6 / 1,384.5 → 1,387.8 / 1,388.7.)
extern "C" __global__ void argmax_blocks_f32(i32* out, const float* x, int n, float* partial_v,
                                             int* partial_i, unsigned int* done) {
    PDL_WAIT();
    PDL_TRIGGER();
    const int per_block = (n + gridDim.x - 1) / gridDim.x;
    const int start = blockIdx.x * per_block, end = min(n, start + per_block);
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = start + threadIdx.x; i < end; i += blockDim.x) {
        const float v = x[i];
        if (v > bv) {  // in increasing i per thread: the first maximum stays
            bv = v;
            bi = i;
        }
    }
    argmax_blocks_end(bv, bi, out, partial_v, partial_i, done);
}
