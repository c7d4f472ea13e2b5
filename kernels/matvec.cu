// y = x · Wᵀ with W: [n_out, n_in] in its stored format, read block by block.
//
// One warp per output row; each lane walks whole blocks of the row and accumulates the
// dequantized weight times the activation. Grid: (ceil(n_out / warps per block), m rows of x).
#include "common.cuh"
#include "quant8.cuh"

template <typename F>
__device__ void matvec(float* y, const u8* w, const float* x, int n_out, int n_in) {
    const int warps = blockDim.x / WARP;
    const int row = blockIdx.x * warps + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    const int m = blockIdx.y;
    if (row >= n_out) return;
    const int n_blocks = n_in / F::BLOCK;
    const u8* wr = w + (i64)row * n_blocks * F::BYTES;
    const float* xr = x + (i64)m * n_in;
    float acc = 0.0f;
    if (F::BLOCK == 1) {
        for (int k = lane; k < n_in; k += WARP) acc += F::get(wr + (i64)k * F::BYTES, 0) * xr[k];
    } else {
        // Lanes split each block's elements so loads of x stay coalesced.
        for (int b = 0; b < n_blocks; ++b) {
            const u8* blk = wr + (i64)b * F::BYTES;
            for (int j = lane; j < F::BLOCK; j += WARP) acc += F::get(blk, j) * xr[b * F::BLOCK + j];
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) y[(i64)m * n_out + row] = acc;
}

#define MATVEC(name, fmt)                                                                        \
    extern "C" __global__ void matvec_##name(float* y, const u8* w, const float* x, int n_out,   \
                                             int n_in) {                                         \
        PDL_WAIT();                                                                              \
        PDL_TRIGGER();                                                                           \
        matvec<fmt>(y, w, x, n_out, n_in);                                                       \
    }
FOR_EACH_FORMAT(MATVEC)

// ---------------------------------------------------------------------------------------------
// Quantized weights × quantized activations, bit for bit as ggml's portable CPU code computes
// them (synaptix-kernels-cpu reproduces `ggml_vec_dot_*_generic`): activation rows are quantized
// once by quantize.cu (Q8_0 for Q4_0 / Q5_0 / Q8_0 weights, Q8_1 for Q4_1 / Q5_1, Q8_K for the
// k-quants), every integer sum is exact (dp4a), and the float work is the CPU's, operation for
// operation and in the CPU's order:
// - legacy types (32-element blocks) and Q2_K: one f32 term per block (ggml's per-type formula),
//   added to one f32 sum in block order;
// - Q3_K .. Q6_K: eight integer "lane" sums per super-block, lane l over the elements e with
//   e % 8 == l (each weighted by its sub-block scale), `sums[l] += (d·d_a) · lane` in eight f32
//   chains over the super-blocks (Q4_K / Q5_K also `sum -= (dmin·d_a) · Σmin·bsum`), and at the
//   end `sum + sums[0] + ... + sums[7]` left to right.
//
// The terms are computed in parallel; only their sums are sequential. A thread block holds
// MV_WARPS / wpr weight rows and wpr warps per row (wpr > 1 when there are too few rows to fill
// the GPU), and walks the rows in block steps: in step s, warp `part` of a row takes chunk
// s · wpr + part (STEP elements) of it. The chunk's weight bytes arrive in the warp's shared
// staging buffer by asynchronous 16-byte copies (coalesced, whatever the block size and
// alignment), issued NBUF - 1 steps ahead into a ring of NBUF buffers so that they fly while
// earlier chunks compute. A step (1) waits for its chunk, (2) computes every block's (or
// super-block lane's) f32 term for the up to MV_COLS activation rows of the pass into `terms`,
// and (3) after a barrier, runs the sequential chains: one thread per (row, activation row
// [, lane]) adds the step's terms in element order to its accumulator, a register for the
// whole row. The chains cost one f32 add per block (32 or 256 elements) and its shared-memory
// read; a second barrier per step keeps `terms` consistent.
//
// Lane sums (Q3_K .. Q6_K) come from "lane-major" words: the 8 threads of a super-block take
// one lane each, and thread t's word i holds the quants of elements 32i + t, + 8, + 16, + 24
// (gathered from the staged weights with byte permutes). The activation quants are transposed
// the same way once per block step into shared memory (`acts_t`, shared by the block's rows), so
// one dp4a adds four products of a single lane.
//
// Activation buffer (quantize.cu): `i8 qs[m * k]` at `acts`, per-block metadata at
// `acts + meta` (Q8_0 / Q8_1: half bits of d and s, then i32 Σq; Q8_K: f32 d), Q8_K sums of
// 16 quants (i16) at `acts + bsums`.

#define MV_FULL 0xffffffffu
#define MV_WARPS 8     // warps per thread block
#define MV_COLS 8      // activation rows per pass over the weights
#define MV_CHUNK 1024  // elements of a row per part of a warp step (32 per lane)
// Thread blocks per SM the quantized kernels are compiled for (register budget 65536 / (256 ×
// this)): 4 keeps 32 warps resident, whose weight loads in flight hide DRAM latency, at the
// price of a few spilled registers in some formats.
#ifndef MV_MIN_BLOCKS
#define MV_MIN_BLOCKS 4
#endif

// How a format's terms are formed (see above).
#define MV_LEGACY 0  // 32-element blocks, one lane per block
#define MV_KSUM 1    // Q2_K: 8 lanes per super-block, one integer sum (shuffle-combined)
#define MV_LANES 2   // Q3_K .. Q6_K: 8 lanes per super-block, one per e % 8 lane

// 16 bytes of read-only global memory (activations: cached in L1, reused by every warp).
__device__ __forceinline__ uint4 mv_ld_nc16(const void* p) {
    uint4 v;
    asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// 1 (the default since the twenty-sixth pass): the weights' copies (bulk copies and 16-byte
// asynchronous copies: each weight is read once a step) carry an L2 evict-first policy, so that
// a step's stream of weights, many times the L2's size, evicts its own lines before anything
// else. Measured on the H200 (tg128): 1.5B Q4_K_M 868 → 888, 7B Q4_K_M 428.5 → 431.2, 7B F16
// 233.1 → 234.2; but the Q8_0 split-copy kernels lost with it (7B Q8_0 368.3 → 366.1, 1.5B
// 815.6 → 810.0), so they keep plain copies (Q8S_EVICT_FIRST). The same bits either way.
#ifndef MV_EVICT_FIRST
#define MV_EVICT_FIRST 1
#endif
#ifndef Q8S_EVICT_FIRST
#define Q8S_EVICT_FIRST 0
#endif
#if MV_EVICT_FIRST || Q8S_EVICT_FIRST
__device__ __forceinline__ unsigned long long mv_stream_policy() {
    unsigned long long policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}
#endif

// Asynchronous copy of 16 bytes of weights (read once: L2 only) to shared memory (sm_80+);
// bytes from `n` on are zero-filled.
__device__ __forceinline__ void mv_cp_async16(void* dst, const void* src, int n) {
    const u32 d = (u32)__cvta_generic_to_shared(dst);
#if MV_EVICT_FIRST
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(d), "l"(src), "r"(n),
                 "l"(mv_stream_policy())
                 : "memory");
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(n)
                 : "memory");
#endif
}
__device__ __forceinline__ void mv_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's latest copy groups are in flight.
template <int N>
__device__ __forceinline__ void mv_cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// N consecutive little-endian words of shared memory starting at any 2-byte-aligned `p`
// (aligned loads and funnel shifts; may read the word after the last).
template <int N>
__device__ __forceinline__ void mv_lds_words(const u8* p, u32 (&w)[N]) {
    const u32 mis = (u32)(unsigned long long)p & 3u;
    // Pointer arithmetic (not an integer round trip) keeps the shared address space visible.
    const u32* a = (const u32*)(p - mis);
    const u32 shift = mis * 8u;
    u32 prev = a[0];
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const u32 next = a[i + 1];
        w[i] = __funnelshift_r(prev, next, shift);
        prev = next;
    }
}

// N consecutive words of shared memory at a 4-byte-aligned `p` (blocks whose size is a
// multiple of 4 keep that alignment in the staging buffer, which preserves it mod 16).
template <int N>
__device__ __forceinline__ void mv_lds_words_a4(const u8* p, u32 (&w)[N]) {
    const u32* a = (const u32*)p;
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = a[i];
}

// Signed bytewise dot product accumulate (the unsigned overload would be wrong here).
__device__ __forceinline__ int mv_dp4a(u32 a, u32 b, int c) { return __dp4a((int)a, (int)b, c); }

// Σ over elements 0..16 (words 0..3) and 16..32 (words 4..7) separately.
__device__ __forceinline__ void mv_dot8_halves(const u32 (&w)[8], const u32 (&a)[8], int& s0,
                                               int& s1) {
    s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) s0 = mv_dp4a(w[i], a[i], s0), s1 = mv_dp4a(w[4 + i], a[4 + i], s1);
}

__device__ __forceinline__ int mv_dot8(const u32 (&w)[8], const u32 (&a)[8]) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) s = mv_dp4a(w[i], a[i], s);
    return s;
}

// Bytewise `x - c` for bytes x in [0, 2c), c <= 128, as signed bytes (no borrow across bytes).
__device__ __forceinline__ u32 mv_sub_bytes(u32 x, u32 c4) {
    return ((x | 0x80808080u) - c4) ^ 0x80808080u;
}

// Bits 0..3 of `n` to bit 4 of bytes 0..3 (the fifth bit of four Q5 quants).
__device__ __forceinline__ u32 mv_spread_bit4(u32 n) {
    return (((n & 15u) * 0x00204081u) & 0x01010101u) << 4;
}

__device__ __forceinline__ float mv_half_lo(u32 v) { return f16_to_f32((u16)(v & 0xffffu)); }
__device__ __forceinline__ float mv_half_hi(u32 v) { return f16_to_f32((u16)(v >> 16)); }

// Byte `k` (0..3) of `v`, sign-extended.
__device__ __forceinline__ int mv_sbyte(u32 v, int k) { return (int)(i8)(u8)(v >> (8 * k)); }

// Lane-major gathers. For the thread of lane t, `a` is the aligned word holding byte t of a
// super-block's staged bytes and `sel` selects that byte's position in it (`mv_gather_at`);
// `mv_gather4(a + off, sel)` (off a multiple of 4) then returns bytes off + t, + 8, + 16, + 24.
struct mv_gather_at {
    const u8* a;
    u32 sel;
    __device__ mv_gather_at(const u8* p) {
        const u32 mis = (u32)(unsigned long long)p & 3u;
        a = p - mis;
        sel = mis | ((mis + 4u) << 4);
    }
    __device__ u32 operator()(int off) const {
        const u32* q = (const u32*)(a + off);
        const u32 lo = __byte_perm(q[0], q[2], sel), hi = __byte_perm(q[4], q[6], sel);
        return __byte_perm(lo, hi, 0x5410);
    }
};

// Legacy blocks (32 elements): `load` unpacks a block into 8 words of 4 byte-sized quants in
// element order; `term` is ggml's float formula for that block and an activation block
// (`am.x`: half bits of d | s << 16, `am.y`: Σ of the activation quants).

// d | qs[16]; value d * (q - 8). ggml: (sumi * d_w) * d_a, sumi = Σ (q - 8) a.
struct mv_q4_0 {
    static constexpr int BLOCK = 32, BYTES = 18, KIND = MV_LEGACY;
    static constexpr int SUBS = 2;  // 1024-element parts per warp step
    static constexpr bool MIN = false, ACTS_K = false;
    u32 w[8];
    float d;
    __device__ void load(const u8* b, int) {
        d = load_f16(b);
        u32 q[4];
        mv_lds_words<4>(b + 2, q);
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = q[i] & 0x0f0f0f0fu, w[4 + i] = (q[i] >> 4) & 0x0f0f0f0fu;
    }
    __device__ float term(const u32 (&a)[8], uint2 am) const {
        const int s = mv_dot8(w, a) - 8 * (int)am.y;
        return __fmul_rn(__fmul_rn((float)s, d), mv_half_lo(am.x));
    }
};

// d | m | qs[16]; value d * q + m. ggml: (d_w * d_a) * sumi + m_w * s_a.
struct mv_q4_1 {
    static constexpr int BLOCK = 32, BYTES = 20, KIND = MV_LEGACY;
    static constexpr int SUBS = 2;
    static constexpr bool MIN = false, ACTS_K = false;
    u32 w[8];
    float d, m;
    __device__ void load(const u8* b, int) {
        u32 q[5];
        mv_lds_words_a4<5>(b, q);  // 20-byte blocks: 4-byte aligned
        d = mv_half_lo(q[0]), m = mv_half_hi(q[0]);
#pragma unroll
        for (int i = 0; i < 4; ++i)
            w[i] = q[1 + i] & 0x0f0f0f0fu, w[4 + i] = (q[1 + i] >> 4) & 0x0f0f0f0fu;
    }
    __device__ float term(const u32 (&a)[8], uint2 am) const {
        const int s = mv_dot8(w, a);
        return __fadd_rn(__fmul_rn(__fmul_rn(d, mv_half_lo(am.x)), (float)s),
                         __fmul_rn(m, mv_half_hi(am.x)));
    }
};

// d | qh | qs[16]; value d * (q - 16). ggml: (d_w * d_a) * sumi.
struct mv_q5_0 {
    static constexpr int BLOCK = 32, BYTES = 22, KIND = MV_LEGACY;
    static constexpr int SUBS = 2;
    static constexpr bool MIN = false, ACTS_K = false;
    u32 w[8];
    float d;
    __device__ void load(const u8* b, int) {
        d = load_f16(b);
        u32 q[5];
        mv_lds_words<5>(b + 2, q);  // qh, qs
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w[i] = (q[1 + i] & 0x0f0f0f0fu) | mv_spread_bit4(q[0] >> (4 * i));
            w[4 + i] = ((q[1 + i] >> 4) & 0x0f0f0f0fu) | mv_spread_bit4(q[0] >> (16 + 4 * i));
        }
    }
    __device__ float term(const u32 (&a)[8], uint2 am) const {
        const int s = mv_dot8(w, a) - 16 * (int)am.y;
        return __fmul_rn(__fmul_rn(d, mv_half_lo(am.x)), (float)s);
    }
};

// d | m | qh | qs[16]; value d * q + m. ggml: (d_w * d_a) * sumi + m_w * s_a.
struct mv_q5_1 {
    static constexpr int BLOCK = 32, BYTES = 24, KIND = MV_LEGACY;
    static constexpr int SUBS = 2;
    static constexpr bool MIN = false, ACTS_K = false;
    u32 w[8];
    float d, m;
    __device__ void load(const u8* b, int) {
        u32 q[6];
        mv_lds_words_a4<6>(b, q);  // d m, qh, qs (24-byte blocks: 8-byte aligned)
        d = mv_half_lo(q[0]), m = mv_half_hi(q[0]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w[i] = (q[2 + i] & 0x0f0f0f0fu) | mv_spread_bit4(q[1] >> (4 * i));
            w[4 + i] = ((q[2 + i] >> 4) & 0x0f0f0f0fu) | mv_spread_bit4(q[1] >> (16 + 4 * i));
        }
    }
    __device__ float term(const u32 (&a)[8], uint2 am) const {
        const int s = mv_dot8(w, a);
        return __fadd_rn(__fmul_rn(__fmul_rn(d, mv_half_lo(am.x)), (float)s),
                         __fmul_rn(m, mv_half_hi(am.x)));
    }
};

// d | qs[32] (int8); value d * q. ggml: sumi * (d_w * d_a).
struct mv_q8_0 {
    static constexpr int BLOCK = 32, BYTES = 34, KIND = MV_LEGACY;
    static constexpr int SUBS = 1;
    static constexpr bool MIN = false, ACTS_K = false;
    u32 w[8];
    float d;
    __device__ void load(const u8* b, int) {
        d = load_f16(b);
        mv_lds_words<8>(b + 2, w);
    }
    __device__ float term(const u32 (&a)[8], uint2 am) const {
        return __fmul_rn((float)mv_dot8(w, a), __fmul_rn(d, mv_half_lo(am.x)));
    }
};

// d | qs[16] as Q4_0's, the codes looked up in ggml's table (`iq4_lookup4`). ggml:
// (d_a * d_w) * sumi, sumi = Σ T[q] a.
struct mv_iq4_nl : mv_q4_0 {
    __device__ void load(const u8* b, int x) {
        mv_q4_0::load(b, x);
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = iq4_lookup4(w[i]);
    }
    __device__ float term(const u32 (&a)[8], uint2 am) const {
        return __fmul_rn(__fmul_rn(d, mv_half_lo(am.x)), (float)mv_dot8(w, a));
    }
};

// IQ4_XS in the GPU's 20-byte blocks (common.cuh's fmt_iq4_xs: d | l - 32 | 0 | qs[16]), against
// Q8_K activations (ACTS_K: am.x holds the bits of the super-block's f32 d). ggml:
// ((d_w * d_a) * (l - 32)) * sumi, sumi = Σ T[q] a, one term a sub-block of 32.
struct mv_iq4_xs {
    static constexpr int BLOCK = 32, BYTES = 20, KIND = MV_LEGACY;
    static constexpr int SUBS = 2;
    static constexpr bool MIN = false, ACTS_K = true;
    u32 w[8];
    float d, l;
    __device__ void load(const u8* b, int) {
        u32 q[5];
        mv_lds_words_a4<5>(b, q);  // 20-byte blocks: 4-byte aligned
        d = mv_half_lo(q[0]), l = (float)mv_sbyte(q[0], 2);
#pragma unroll
        for (int i = 0; i < 4; ++i)
            w[i] = iq4_lookup4(q[1 + i] & 0x0f0f0f0fu), w[4 + i] = iq4_lookup4((q[1 + i] >> 4) & 0x0f0f0f0fu);
    }
    __device__ float term(const u32 (&a)[8], uint2 am) const {
        return __fmul_rn(__fmul_rn(__fmul_rn(d, __uint_as_float(am.x)), l), (float)mv_dot8(w, a));
    }
};

// The metadata of the activation block holding element `ae` (of the whole activation buffer)
// for a legacy format's `term`: Q8_0 / Q8_1's per 32 (half bits of d | s << 16, Σq), or for
// ACTS_K formats Q8_K's f32 d of the super-block.
template <typename F>
__device__ __forceinline__ uint2 mv_meta(const u8* meta, i64 ae) {
    if constexpr (F::ACTS_K) return make_uint2(*(const u32*)(meta + (ae / QK_K) * 4), 0u);
    else return *(const uint2*)(meta + (ae / 32) * 8);
}

// scales[16] (scale | min << 4 per 16 elements) | qs[64] | d | dmin.
// Element 128h + 32s + l: (qs[32h + l] >> 2s) & 3. One integer sum per super-block; lane `j`
// of the 8 serving it unpacks elements 32j .. 32j + 32 and computes that part's scaled Σ q·a and
// Σ min · bsum (`bs`: the two activation sums of 16 of its elements); the 8 lanes' integers are
// added exactly by shuffles. ggml: (d_a·d) isum - (d_a·dmin) summ.
struct mv_q2_k {
    static constexpr int BLOCK = QK_K, BYTES = 84, KIND = MV_KSUM;
    static constexpr int SUBS = 4;
    static constexpr bool MIN = false;
    u32 w[8];
    int sc0, sc1;
    float d, dmin;
    __device__ void load(const u8* b, int j) {
        u32 q[8];
        mv_lds_words_a4<8>(b + 16 + 32 * (j / 4), q);  // 84-byte blocks: 4-byte aligned
        const int shift = 2 * (j % 4);
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = (q[i] >> shift) & 0x03030303u;
        sc0 = b[2 * j], sc1 = b[2 * j + 1];
        d = load_f16(b + 80), dmin = load_f16(b + 82);
    }
    __device__ void ints(const u32 (&a)[8], u32 bs, int& isum, int& summ) const {
        int s0, s1;
        mv_dot8_halves(w, a, s0, s1);
        isum = (sc0 & 15) * s0 + (sc1 & 15) * s1;
        summ = (sc0 >> 4) * (int)(short)(bs & 0xffffu) + (sc1 >> 4) * (int)(short)(bs >> 16);
    }
    __device__ float term(int isum, int summ, float da) const {
        return __fsub_rn(__fmul_rn(__fmul_rn(da, d), (float)isum),
                         __fmul_rn(__fmul_rn(da, dmin), (float)summ));
    }
};

// Lane-major k-quants. `load(b, t)` reads lane t of the super-block at `b` (stage memory);
// `lane_sum(a)` is Σ scale · q · a over lane t with `a` the 8 lane-major activation words;
// `d` (and `dmin`, `min_sum`) feed ggml's float formulas.

// hmask[32] | qs[64] | scales[12] (16 six-bit scales, offset 32) | d. Element 128h + 32s + l:
// (qs[32h + l] >> 2s) & 3, minus 4 unless bit (e / 32) of hmask[l] is set; 16-element scales.
struct mv_q3_k {
    static constexpr int BLOCK = QK_K, BYTES = 110, KIND = MV_LANES;
    static constexpr int SUBS = 1;
    static constexpr bool MIN = false;
    static constexpr bool WHOLE = false;
    u32 lo[8], hi[8];  // lane-major words, elements 32i + t, + 8 (lo) and + 16, + 24 (hi)
    int sc[16];
    float d;
    __device__ void load(const u8* b, int t) {
        const mv_gather_at g(b + t);
        const u32 hm = g(0), q0 = g(32), q1 = g(64);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const u32 q = i < 4 ? q0 : q1;
            const u32 x = ((q >> (2 * (i % 4))) & 0x03030303u) | (((hm >> i) & 0x01010101u) << 2);
            const u32 v = (x + 0x7c7c7c7cu) ^ 0x80808080u;  // x - 4, bytewise
            lo[i] = v & 0x0000ffffu, hi[i] = v & 0xffff0000u;
        }
        u32 s[3];
        mv_lds_words<3>(b + 96, s);
        const u32 parts[4] = {
            (s[0] & 0x0f0f0f0fu) | ((s[2] & 0x03030303u) << 4),
            (s[1] & 0x0f0f0f0fu) | (((s[2] >> 2) & 0x03030303u) << 4),
            ((s[0] >> 4) & 0x0f0f0f0fu) | (((s[2] >> 4) & 0x03030303u) << 4),
            ((s[1] >> 4) & 0x0f0f0f0fu) | (((s[2] >> 6) & 0x03030303u) << 4),
        };
#pragma unroll
        for (int i = 0; i < 16; ++i) sc[i] = (int)((parts[i / 4] >> (8 * (i % 4))) & 0xffu) - 32;
        d = load_f16(b + 108);
    }
    __device__ int lane_sum(const u32 (&a)[8]) const {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i)
            s += sc[2 * i] * mv_dp4a(lo[i], a[i], 0) + sc[2 * i + 1] * mv_dp4a(hi[i], a[i], 0);
        return s;
    }
};

// d | dmin | scales[12] (8 six-bit scales and mins) | qs[128]. Element 64c + 32h + l:
// (qs[32c + l] >> 4h) & 15, 32-element sub-block 2c + h.
struct mv_q4_k {
    static constexpr int BLOCK = QK_K, BYTES = 144, KIND = MV_LANES;
    static constexpr int SUBS = 1;
    static constexpr bool MIN = true;
    // `matvec_q8_rows` computes a whole super-block per thread (`mvr_terms_q45_k`).
    static constexpr bool WHOLE = true;
    u32 w[8];
    int sc[8];
    u32 mins0, mins1;  // the 8 mins as bytes
    float d, dmin;
    // The scales, mins, d and dmin of the 144- or 176-byte super-block at `b` (4-byte aligned).
    __device__ void load_scales(const u8* b) {
        u32 s[4];
        mv_lds_words_a4<4>(b, s);  // d | dmin, scales[12]
        d = mv_half_lo(s[0]), dmin = mv_half_hi(s[0]);
        const u32 s0 = s[1], s1 = s[2], s2 = s[3];
        const u32 sc_lo = s0 & 0x3f3f3f3fu;
        const u32 sc_hi = (s2 & 0x0f0f0f0fu) | (((s0 >> 6) & 0x03030303u) << 4);
        mins0 = s1 & 0x3f3f3f3fu;
        mins1 = ((s2 >> 4) & 0x0f0f0f0fu) | (((s1 >> 6) & 0x03030303u) << 4);
#pragma unroll
        for (int i = 0; i < 4; ++i)
            sc[i] = (int)((sc_lo >> (8 * i)) & 0xffu), sc[4 + i] = (int)((sc_hi >> (8 * i)) & 0xffu);
    }
    __device__ void load(const u8* b, int t) {
        const mv_gather_at g(b + t);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const u32 q = g(16 + 32 * c);
            w[2 * c] = q & 0x0f0f0f0fu, w[2 * c + 1] = (q >> 4) & 0x0f0f0f0fu;
        }
        load_scales(b);
    }
    __device__ int lane_sum(const u32 (&a)[8]) const {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) s += sc[i] * mv_dp4a(w[i], a[i], 0);
        return s;
    }
    // Σ min_j (bsum_2j + bsum_2j+1), `pp`: those 8 pair sums as i16 pairs.
    __device__ int min_sum(uint4 pp) const {
        int s = __dp2a_lo((int)pp.x, (int)mins0, 0);
        s = __dp2a_hi((int)pp.y, (int)mins0, s);
        s = __dp2a_lo((int)pp.z, (int)mins1, s);
        return __dp2a_hi((int)pp.w, (int)mins1, s);
    }
};

// d | dmin | scales[12] | qh[32] | qs[128]: Q4_K plus 16 when bit (e / 32) of qh[e % 32] is set.
struct mv_q5_k : mv_q4_k {
    static constexpr int BYTES = 176;
    __device__ void load(const u8* b, int t) {
        const mv_gather_at g(b + t);
        const u32 h = g(16);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const u32 q = g(48 + 32 * c);
            w[2 * c] = (q & 0x0f0f0f0fu) | (((h >> (2 * c)) & 0x01010101u) << 4);
            w[2 * c + 1] = ((q >> 4) & 0x0f0f0f0fu) | (((h >> (2 * c + 1)) & 0x01010101u) << 4);
        }
        load_scales(b);
    }
};

// ql[128] | qh[64] | scales[16] (int8) | d. Element 128h + 32g + l: low 4 bits from
// ql[64h + 32(g & 1) + l] (high nibble for g >= 2), high 2 bits (qh[32h + l] >> 2g) & 3,
// value minus 32; 16-element scales.
struct mv_q6_k {
    static constexpr int BLOCK = QK_K, BYTES = 210, KIND = MV_LANES;
    static constexpr int SUBS = 1;
    static constexpr bool MIN = false;
    // `matvec_q8_rows` computes a whole super-block per thread (`mvr_terms_q6_k`).
    static constexpr bool WHOLE = true;
    u32 lo[8], hi[8];
    int sc[16];
    float d;
    __device__ void load(const u8* b, int t) {
        const mv_gather_at g(b + t);
        const u32 l00 = g(0), l01 = g(32), l10 = g(64), l11 = g(96), h0 = g(128), h1 = g(160);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int h = i / 4, q = i % 4;
            const u32 l = h == 0 ? ((q & 1) ? l01 : l00) : ((q & 1) ? l11 : l10);
            const u32 hb = h == 0 ? h0 : h1;
            const u32 x = ((l >> (4 * (q >> 1))) & 0x0f0f0f0fu) | (((hb >> (2 * q)) & 0x03030303u) << 4);
            const u32 v = (x + 0x60606060u) ^ 0x80808080u;  // x - 32, bytewise
            lo[i] = v & 0x0000ffffu, hi[i] = v & 0xffff0000u;
        }
        u32 s[4];
        mv_lds_words<4>(b + 192, s);
#pragma unroll
        for (int i = 0; i < 16; ++i) sc[i] = mv_sbyte(s[i / 4], i % 4);
        d = load_f16(b + 208);
    }
    __device__ int lane_sum(const u32 (&a)[8]) const {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i)
            s += sc[2 * i] * mv_dp4a(lo[i], a[i], 0) + sc[2 * i + 1] * mv_dp4a(hi[i], a[i], 0);
        return s;
    }
};

// 32 activation quants (16-byte aligned) as 8 words.
__device__ __forceinline__ void mv_load_acts(const i8* p, u32 (&a)[8]) {
    const uint4 x = mv_ld_nc16(p), z = mv_ld_nc16(p + 16);
    a[0] = x.x, a[1] = x.y, a[2] = x.z, a[3] = x.w;
    a[4] = z.x, a[5] = z.y, a[6] = z.z, a[7] = z.w;
}

// Length of a chain's row of `terms` for n terms per step: n rounded so that consecutive rows
// start 4 banks apart mod 8 (conflict-free 16-byte reads by the chain threads, and conflict-free
// writes by the 8 lanes × 4 super-blocks of a lane-major warp).
constexpr int mv_rowlen(int n) { return (n + 3) / 8 * 8 + 4; }

// Bytes of one super-block of transposed activations in `acts_t`: 256 quants (lane t's 8 words
// at 32t), 4 words of i16 pair sums of bsums (Q4_K / Q5_K mins), f32 d; 288 keeps the rows of
// 32 threads' writes on distinct banks.
#define MV_ACT_T 288

// Floats of `terms` for the largest configuration: MV_WARPS / wpr rows, `cols` activation rows,
// `l` chains each, rows of wpr * units terms (lane-major formats: wpr * cols <= MV_COLS).
constexpr int mv_tfloats(bool lanes, int units, int l) {
    int best = 0;
    for (int wpr = 1; wpr <= MV_WARPS; wpr *= 2) {
        const int cols = lanes ? MV_COLS / wpr : MV_COLS;
        const int v = MV_WARPS / wpr * cols * l * mv_rowlen(wpr * units);
        best = v > best ? v : best;
    }
    return best;
}

template <typename F>
struct mv_shape {
    static constexpr bool LANES = F::KIND == MV_LANES;
    static constexpr int STEP = F::SUBS * MV_CHUNK;  // elements of a warp's chunk
    static constexpr int UNITS = STEP / F::BLOCK;    // blocks (super-blocks) per chunk
    static constexpr int CHUNK_BYTES = UNITS * F::BYTES;
    // 16-byte words a chunk can touch (its start is not aligned).
    static constexpr int WORDS = (CHUNK_BYTES + 30) / 16;
    // Staging buffers per warp: chunks up to NBUF - 1 steps ahead are in flight (two for the
    // lane-major k-quants, whose chunks are small).
    static constexpr int NBUF = LANES ? 3 : 2;
    // Chains per (row, activation row): 8 lanes (+ Q4_K / Q5_K's min sum), else 1.
    static constexpr int L = LANES ? 8 + F::MIN : 1;
    // Chains per thread, at most.
    static constexpr int MAXC = (MV_WARPS * MV_COLS * L + MV_WARPS * WARP - 1) / (MV_WARPS * WARP);
    // `terms` floats for the largest configuration (lane-major: wpr * columns <= MV_COLS).
    static constexpr int T_FLOATS = mv_tfloats(LANES, UNITS, L);
    // Transposed activations of a block step (lane-major: wpr * columns <= MV_COLS).
    static constexpr int A_WORDS = LANES ? MV_COLS * UNITS * MV_ACT_T / 16 : 1;
};

// O_p = [e0.p, e1.p, e2.p, e3.p] for p = 0..3 (a 4 × 4 byte transpose).
__device__ __forceinline__ void mv_transpose4(u32 e0, u32 e1, u32 e2, u32 e3, u32& o0, u32& o1,
                                              u32& o2, u32& o3) {
    const u32 a = __byte_perm(e0, e1, 0x5140), b = __byte_perm(e0, e1, 0x7362);
    const u32 c = __byte_perm(e2, e3, 0x5140), d = __byte_perm(e2, e3, 0x7362);
    o0 = __byte_perm(a, c, 0x5410), o1 = __byte_perm(a, c, 0x7632);
    o2 = __byte_perm(b, d, 0x5410), o3 = __byte_perm(b, d, 0x7632);
}

__device__ __forceinline__ u32 mv_pair_sum(u32 v) {
    return (u32)((int)(short)(v & 0xffffu) + (int)(short)(v >> 16)) & 0xffffu;
}

// The activations of a block step for the lane-major k-quants: the `span` super-blocks from
// `sb0` of activation rows m0 .. m0 + nc, in tasks of 32 quants (g < 8) or the scales (g = 8)
// of super-block sbx of row j, written lane-major to `acts_t` (super-block sbx of row j at
// (j * span + sbx) * MV_ACT_T): thread t's word i holds the quants of elements 32i + t, + 8,
// + 16, + 24; then the i16 pairs of Σ bsums over 32 elements (Q4_K / Q5_K), and the f32
// scale. `load` reads the thread's first task into registers (issued before the previous
// step's chains, so that its latency hides behind them); `store` writes it, and reads and
// writes any further tasks (only when nc * wpr = MV_COLS).
struct mv_acts_step {
    uint4 x, z;  // quants, or bsums
    float d;

    struct task {
        int j, sbx, g;
        i64 ae;  // first element
        __device__ task(int id, int span) {
            j = id / (span * 9);
            const int rem = id - j * span * 9;
            sbx = rem / 9, g = rem - sbx * 9;
        }
    };

    template <typename F>
    __device__ bool read(int id, const u8* acts, long long meta_off, long long bsums_off, int k,
                         int m0, int nc, int sb0, int span, int n_units) {
        const task t(id, span);
        if (t.j >= nc || sb0 + t.sbx >= n_units) return false;
        const i64 ae = (i64)(m0 + t.j) * k + (i64)(sb0 + t.sbx) * QK_K;
        if (t.g < 8) {
            x = mv_ld_nc16(acts + ae + 32 * t.g), z = mv_ld_nc16(acts + ae + 32 * t.g + 16);
        } else {
            if (F::MIN) {
                const u8* bs = acts + bsums_off + (ae / 16) * 2;
                x = mv_ld_nc16(bs), z = mv_ld_nc16(bs + 16);
            }
            d = *(const float*)(acts + meta_off + (ae / QK_K) * 4);
        }
        return true;
    }

    template <typename F>
    __device__ void write(int id, uint4* acts_t, int span) const {
        const task t(id, span);
        u8* dst = (u8*)acts_t + (t.j * span + t.sbx) * MV_ACT_T;
        if (t.g < 8) {
            u32 o[8];  // even words hold lanes 0..3, odd words lanes 4..7
            mv_transpose4(x.x, x.z, z.x, z.z, o[0], o[1], o[2], o[3]);
            mv_transpose4(x.y, x.w, z.y, z.w, o[4], o[5], o[6], o[7]);
#pragma unroll
            for (int l = 0; l < 8; ++l) *(u32*)(dst + 32 * l + 4 * t.g) = o[l];
        } else {
            if (F::MIN)
                *(uint4*)(dst + 256) =
                    make_uint4(mv_pair_sum(x.x) | mv_pair_sum(x.y) << 16,
                               mv_pair_sum(x.z) | mv_pair_sum(x.w) << 16,
                               mv_pair_sum(z.x) | mv_pair_sum(z.y) << 16,
                               mv_pair_sum(z.z) | mv_pair_sum(z.w) << 16);
            *(float*)(dst + 272) = d;
        }
    }

    bool have = false;

    template <typename F>
    __device__ void load(const u8* acts, long long meta_off, long long bsums_off, int k, int m0,
                         int nc, int sb0, int span, int n_units) {
        have = read<F>(threadIdx.x, acts, meta_off, bsums_off, k, m0, nc, sb0, span, n_units);
    }

    template <typename F>
    __device__ void store(uint4* acts_t, const u8* acts, long long meta_off, long long bsums_off,
                          int k, int m0, int nc, int sb0, int span, int n_units) {
        if (have) write<F>(threadIdx.x, acts_t, span);
        for (int id = threadIdx.x + MV_WARPS * WARP; id < nc * span * 9; id += MV_WARPS * WARP)
            if (read<F>(id, acts, meta_off, bsums_off, k, m0, nc, sb0, span, n_units))
                write<F>(id, acts_t, span);
    }
};

// Starts copying the 16-byte words of weight bytes [s, e) (from the word holding s) to `dst`
// (bytes past the end of the `total`-byte weights read as zero).
template <int WORDS>
__device__ __forceinline__ void mv_fetch(uint4* dst, const u8* w, i64 s, i64 e, i64 total,
                                         int lane) {
    const i64 first = s >> 4;
    const int n_words = (int)(((e + 15) >> 4) - first);
#pragma unroll
    for (int i = 0; i < (WORDS + WARP - 1) / WARP; ++i) {
        const int wi = lane + WARP * i;
        if (wi < n_words) {
            const i64 at = (first + wi) * 16;
            mv_cp_async16(dst + wi, w + at, (int)min((i64)16, total - at));
        }
    }
}

// The value stored for output `row` of activation row `col` (at y[col * n_out + row]): the
// matmul's `v`, then `+ bias[row]` and `+ residual[col * n_out + row]` when given (null when
// not), the CPU's separate bias and residual additions in the same order.
__device__ __forceinline__ float mv_epilogue(float v, const float* bias, const float* residual,
                                             i64 at, int row) {
    if (bias) v = __fadd_rn(v, bias[row]);
    if (residual) v = __fadd_rn(residual[at], v);
    return v;
}

// Up to three matrices of one format and row length against the same activation row in one
// launch (Q, K and V; gate and up): global rows [0, r1) are matrix 0 (the kernel's w, y and
// bias), [r1, r2) matrix 1 and [r2, n_out) matrix 2, each with its own weights, outputs and
// bias. One matrix: r1 = r2 = n_out (then any number of activation rows and a residual are
// allowed; several matrices take one activation row and no residual, which the host checks).
struct mv_segs {
    const u8 *w0, *w1, *w2;
    float *y0, *y1, *y2;
    const float *b0, *b1, *b2;
    int r1, r2, n_out;
    __device__ int seg(int row) const { return (row >= r1) + (row >= r2); }
    __device__ int first(int s) const { return s == 0 ? 0 : (s == 1 ? r1 : r2); }
    __device__ int rows(int s) const { return s == 0 ? r1 : (s == 1 ? r2 - r1 : n_out - r2); }
    __device__ const u8* w(int s) const { return s == 0 ? w0 : (s == 1 ? w1 : w2); }
    __device__ float* y(int s) const { return s == 0 ? y0 : (s == 1 ? y1 : y2); }
    __device__ const float* bias(int s) const { return s == 0 ? b0 : (s == 1 ? b1 : b2); }
};
// The kernel parameters of matrices 1 and 2, after the epilogue's, and the mv_segs they make.
#define MV_SEG_PARAMS                                                                            \
    const u8 *w1, const u8 *w2, float *y1, float *y2, const float *b1, const float *b2, int r1,  \
        int r2
#define MV_SEGS(y, w, bias, n_out) mv_segs{w, w1, w2, y, y1, y2, bias, b1, b2, r1, r2, n_out}

// y[m0 + j][row] for the rows of this block and the activation rows m0 .. m0 + MV_COLS.
template <typename F>
__device__ void matvec_q8(float* __restrict__ y, const u8* __restrict__ w,
                          const u8* __restrict__ acts, long long meta_off, long long bsums_off,
                          int n_out, int k, int m, int wpr, const float* __restrict__ bias,
                          const float* __restrict__ residual) {
    using S = mv_shape<F>;
    // A warp's chunks, in turn; + 1: mv_lds_words may read one word past.
    __shared__ uint4 stage[S::NBUF][MV_WARPS][S::WORDS + 1];
    // f32 terms of a block step: chain c (row c / (nc L), activation row (c / L) % nc, lane
    // c % L) at c * rowlen, in element order; at the end, the lane chains' sums.
    __shared__ float4 terms_v[(S::T_FLOATS + 3) / 4];
    float* terms = (float*)terms_v;
    __shared__ uint4 acts_t[S::A_WORDS];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int rows = MV_WARPS / wpr;  // weight rows of this block
    const int r = warp / wpr, part = warp % wpr;
    const int row = blockIdx.x * rows + r;
    const int m0 = blockIdx.y * MV_COLS;
    const int nc = min(MV_COLS, m - m0);
    const i64 row_bytes = (i64)(k / F::BLOCK) * F::BYTES;
    const i64 total = (i64)n_out * row_bytes;
    const int n_units = k / F::BLOCK;  // blocks (super-blocks) per row
    const int n_chunks = (k + S::STEP - 1) / S::STEP;
    const int n_steps = (n_chunks + wpr - 1) / wpr;
    const int span = wpr * S::UNITS;  // terms per chain and block step
    const int rowlen = mv_rowlen(span);
    const int n_chains = rows * nc * S::L;
    const bool active = row < n_out;
    const i8* qs = (const i8*)acts;
    const u8* meta = acts + meta_off;
    const u8* bsums = acts + bsums_off;
    const i64 row0 = (i64)row * row_bytes, row_end = row0 + row_bytes;

    float acc[S::MAXC];
#pragma unroll
    for (int i = 0; i < S::MAXC; ++i) acc[i] = 0.0f;

    // Starts copying the warp's chunk of block step s into its staging buffer; one copy group
    // per step and thread, empty or not.
    auto fetch = [&](int s) {
        const int c = s * wpr + part;
        if (active && c < n_chunks) {
            const i64 cs = row0 + (i64)c * S::CHUNK_BYTES;
            mv_fetch<S::WORDS>(stage[s % S::NBUF][warp], w, cs, min(cs + S::CHUNK_BYTES, row_end),
                               total, lane);
        }
        mv_cp_commit();
    };
#pragma unroll
    for (int s = 0; s < S::NBUF - 1; ++s) fetch(s);
    PDL_WAIT();  // the first chunks of weights are on their way
    PDL_TRIGGER();
    mv_acts_step next_acts;
    if constexpr (S::LANES) {
        next_acts.load<F>(acts, meta_off, bsums_off, k, m0, nc, 0, span, n_units);
        next_acts.store<F>(acts_t, acts, meta_off, bsums_off, k, m0, nc, 0, span, n_units);
    }
    for (int s = 0; s < n_steps; ++s) {
        const int c = s * wpr + part;  // this warp's chunk of its row
        const bool have = active && c < n_chunks;
        const i64 cs = row0 + (i64)c * S::CHUNK_BYTES;
        mv_cp_wait<S::NBUF - 2>();  // this step's chunk has landed (the barrier shows it to all)
        __syncthreads();
        // Chunks NBUF - 1 steps ahead fly while this one computes (into the buffer of step s - 1,
        // which every lane of this warp has finished reading).
        fetch(s + S::NBUF - 1);
        if (have) {
            const u8* base = (const u8*)stage[s % S::NBUF][warp] + (cs & 15);
            // Chain rows of (r, activation row 0), and this chunk's first position in them.
            float* tr = terms + r * nc * S::L * rowlen + part * S::UNITS;
#pragma unroll
            for (int sub = 0; sub < F::SUBS; ++sub) {
                if constexpr (F::KIND == MV_LEGACY) {
                    const int u = sub * WARP + lane;  // block of the chunk
                    const int e0 = c * S::STEP + 32 * u;
                    if (e0 >= k) break;
                    F f;
                    f.load(base + u * F::BYTES, 0);
#pragma unroll
                    for (int j = 0; j < MV_COLS; ++j) {
                        if (j >= nc) break;
                        const i64 ae = (i64)(m0 + j) * k + e0;  // activation element index
                        u32 a[8];
                        mv_load_acts(qs + ae, a);
                        const uint2 am = mv_meta<F>(meta, ae);
                        tr[j * rowlen + u] = f.term(a, am);
                    }
                } else if constexpr (F::KIND == MV_KSUM) {
                    const int e_sub = c * S::STEP + sub * MV_CHUNK;
                    if (e_sub >= k) break;                // warp-uniform
                    const int u = sub * 4 + lane / 8;    // super-block of the chunk
                    const int e0 = e_sub + 32 * lane;    // this lane's first element
                    const bool valid = e0 < k;
                    F f;
                    if (valid) f.load(base + u * F::BYTES, lane % 8);
#pragma unroll
                    for (int j = 0; j < MV_COLS; ++j) {
                        if (j >= nc) break;
                        const i64 ae = (i64)(m0 + j) * k + e0;
                        int isum = 0, summ = 0;
                        float da = 0.0f;
                        if (valid) {
                            u32 a[8];
                            mv_load_acts(qs + ae, a);
                            const u32 bs = *(const u32*)(bsums + (ae / 16) * 2);
                            da = *(const float*)(meta + (ae / QK_K) * 4);
                            f.ints(a, bs, isum, summ);
                        }
#pragma unroll
                        for (int o = 1; o < 8; o <<= 1) {
                            isum += __shfl_xor_sync(MV_FULL, isum, o);
                            summ += __shfl_xor_sync(MV_FULL, summ, o);
                        }
                        if (valid && lane % 8 == 0) tr[j * rowlen + u] = f.term(isum, summ, da);
                    }
                } else {
                    const int u = sub * 4 + lane / 8, t = lane % 8;  // super-block, lane
                    if (c * S::UNITS + u >= n_units) break;
                    F f;
                    f.load(base + u * F::BYTES, t);
                    const int sbx = part * S::UNITS + u;  // super-block of the block step
#pragma unroll
                    for (int j = 0; j < MV_COLS; ++j) {
                        if (j >= nc) break;
                        const u8* at = (const u8*)acts_t + (j * span + sbx) * MV_ACT_T;
                        const uint4 x = *(const uint4*)(at + 32 * t), z = *(const uint4*)(at + 32 * t + 16);
                        const u32 a[8] = {x.x, x.y, x.z, x.w, z.x, z.y, z.z, z.w};
                        const float da = *(const float*)(at + 272);
                        float* tj = tr + j * S::L * rowlen + u;
                        tj[t * rowlen] = __fmul_rn(__fmul_rn(f.d, da), (float)f.lane_sum(a));
                        if constexpr (F::MIN) {
                            if (t == 0) {
                                const int summ = f.min_sum(*(const uint4*)(at + 256));
                                tj[8 * rowlen] = __fmul_rn(__fmul_rn(f.dmin, da), (float)summ);
                            }
                        }
                    }
                }
            }
        }
        // The next step's activations (lane-major formats) are read during the barrier and the
        // chains, and written to acts_t (free once every warp has computed) after them.
        if constexpr (S::LANES)
            if (s + 1 < n_steps)
                next_acts.load<F>(acts, meta_off, bsums_off, k, m0, nc, (s + 1) * span, span,
                                  n_units);
        __syncthreads();
        // The chains: this step's terms, in element order.
        const int n_terms = min(span, n_units - s * span);
#pragma unroll
        for (int i = 0; i < S::MAXC; ++i) {
            const int ch = threadIdx.x + i * MV_WARPS * WARP;
            if (ch >= n_chains || blockIdx.x * rows + ch / (nc * S::L) >= n_out) continue;
            const float* t = terms + ch * rowlen;
            float v = acc[i];
            if (F::MIN && ch % S::L == 8) {  // ggml: sum -= (dmin·d_a) Σ min·bsum
                for (int u = 0; u < n_terms; ++u) v = __fsub_rn(v, t[u]);
            } else {
                for (int u = 0; u < n_terms; ++u) v = __fadd_rn(v, t[u]);
            }
            acc[i] = v;
        }
        if constexpr (S::LANES)
            if (s + 1 < n_steps)
                next_acts.store<F>(acts_t, acts, meta_off, bsums_off, k, m0, nc, (s + 1) * span,
                                   span, n_units);
    }

    if constexpr (!S::LANES) {
#pragma unroll
        for (int i = 0; i < S::MAXC; ++i) {
            const int ch = threadIdx.x + i * MV_WARPS * WARP;
            const int out = blockIdx.x * rows + ch / nc;
            if (ch < n_chains && out < n_out) {
                const i64 at = (i64)(m0 + ch % nc) * n_out + out;
                y[at] = mv_epilogue(acc[i], bias, residual, at, out);
            }
        }
    } else {
        __syncthreads();  // every chain has read its last terms
#pragma unroll
        for (int i = 0; i < S::MAXC; ++i) {
            const int ch = threadIdx.x + i * MV_WARPS * WARP;
            if (ch < n_chains) terms[ch] = acc[i];
        }
        __syncthreads();
        const int o = threadIdx.x;  // output (row o / nc, activation row o % nc)
        const int out = blockIdx.x * rows + o / nc;
        if (o < rows * nc && out < n_out) {
            // ggml: sum (Q4_K / Q5_K's min chain, else 0) + sums[0] + ... + sums[7]
            const float* f = terms + o * S::L;
            float v = F::MIN ? f[S::L - 1] : 0.0f;
#pragma unroll
            for (int l = 0; l < 8; ++l) v = __fadd_rn(v, f[l]);
            const i64 at = (i64)(m0 + o % nc) * n_out + out;
            y[at] = mv_epilogue(v, bias, residual, at, out);
        }
    }
}

// Legacy formats with short rows (k <= 1024: at most one block per lane) and few activation
// rows: one warp per weight row, lane b computes block b's term for each activation row, and
// lane 0 adds the terms in block order (by shuffles): the CPU's chain, with one memory round
// trip and no barrier. Weight buffers are padded (ops::WEIGHT_PAD), so `load`'s aligned word
// reads may pass the last block. Grid: (ceil(n_out / MV_WARPS), ceil(m / MV_COLS)).
template <typename F>
__device__ void matvec_q8_short(const mv_segs sg, const u8* __restrict__ acts, long long meta_off,
                                int k, int m, const float* __restrict__ residual) {
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int row = blockIdx.x * MV_WARPS + warp;
    const int m0 = blockIdx.y * MV_COLS;
    if (row >= sg.n_out) return;  // the whole warp
    const int sgi = sg.seg(row), lr = row - sg.first(sgi), rows = sg.rows(sgi);
    const int nc = min(MV_COLS, m - m0);
    const int nb = k / 32;
    const i8* qs = (const i8*)acts;
    const u8* meta = acts + meta_off;
    float t[MV_COLS];
#pragma unroll
    for (int j = 0; j < MV_COLS; ++j) t[j] = 0.0f;
    F f;
    if (lane < nb) f.load(sg.w(sgi) + ((i64)lr * nb + lane) * F::BYTES, 0);  // before the wait
    PDL_WAIT();
    PDL_TRIGGER();
    if (lane < nb) {
#pragma unroll
        for (int j = 0; j < MV_COLS; ++j) {
            if (j >= nc) break;
            const i64 ae = (i64)(m0 + j) * k + 32 * lane;
            u32 a[8];
            mv_load_acts(qs + ae, a);
            t[j] = f.term(a, mv_meta<F>(meta, ae));
        }
    }
    float* y = sg.y(sgi);
    const float* bias = sg.bias(sgi);
#pragma unroll
    for (int j = 0; j < MV_COLS; ++j) {
        if (j >= nc) break;
        float acc = 0.0f;
        for (int b = 0; b < nb; ++b) acc = __fadd_rn(acc, __shfl_sync(MV_FULL, t[j], b));
        if (lane == 0) {
            const i64 at = (i64)(m0 + j) * rows + lr;
            y[at] = mv_epilogue(acc, bias, residual, at, lr);
        }
    }
}

#define MATVEC_Q8_SHORT(name, fmt)                                                               \
    extern "C" __global__ void matvec_q8_short_##name(                                          \
        float* y, const u8* w, const u8* acts, long long meta_off, int n_out, int k, int m,      \
        const float* bias, const float* residual, MV_SEG_PARAMS) {                               \
        PDL_WAITS_INSIDE();                                                                      \
        matvec_q8_short<fmt>(MV_SEGS(y, w, bias, n_out), acts, meta_off, k, m, residual);        \
    }
MATVEC_Q8_SHORT(q4_0, mv_q4_0)
MATVEC_Q8_SHORT(q4_1, mv_q4_1)
MATVEC_Q8_SHORT(q5_0, mv_q5_0)
MATVEC_Q8_SHORT(q5_1, mv_q5_1)
MATVEC_Q8_SHORT(q8_0, mv_q8_0)
MATVEC_Q8_SHORT(iq4_nl, mv_iq4_nl)
MATVEC_Q8_SHORT(iq4_xs, mv_iq4_xs)

// The short kernel for one activation row with the RMSNorm and the activation quantization
// inside: each block normalises the row (rms_norm_row4's operations: f32 squares summed in f64,
// whose grouping does not change the sum) and quantizes it to Q8_0 (Q8_1 when `Q81`) into
// shared memory, eight threads a 32-value block (quantize_q8_32_lane's operations element for
// element: C's MAX in element order for amax, recomputed serially where a block holds a NaN),
// then its warps take rows r0 + warp + MV_WARPS·j as `matvec_q8_short` does (lane b the terms of
// blocks b and, for NBL = 2, b + 32; lane 0 adding the terms in block order). Bit for bit
// `rms_norm_q8_0` / `_q8_1` then the products on the quantized row, with no norm launch and no
// quantized row in memory. Each warp's first SN_ROWS / NBL rows of weights are requested
// before the PDL wait; the host gives a block at most MV_WARPS · SN_ROWS / NBL rows
// (`rows_per_block`). k <= 1024 · NBL, k % 32 == 0. Grid: ceil(n_out / rows_per_block).
#define SN_ROWS 4
template <typename F, bool Q81, int NBL>
__device__ void matvec_q8_short_norm(const mv_segs sg, const float* __restrict__ x,
                                     const float* __restrict__ nw, float eps, int k,
                                     int rows_per_block) {
    constexpr int ROWS = SN_ROWS / NBL;  // rows per warp
    __shared__ __align__(16) u32 aq[256 * NBL];       // the row's quants, four a word
    __shared__ uint2 am[32 * NBL];                    // per block: half bits of d (| s << 16), Σq
    __shared__ __align__(16) float vals[1024 * NBL];  // the normalised row, for blocks with a NaN
    const int t = threadIdx.x, warp = t / WARP, lane = t % WARP;
    const int nb = k / 32;
    const int r0 = blockIdx.x * rows_per_block, r1 = min(sg.n_out, r0 + rows_per_block);
    F f[ROWS][NBL];
#pragma unroll
    for (int j = 0; j < ROWS; ++j) {
        const int row = r0 + warp + MV_WARPS * j;
        if (row < r1) {
            const int s = sg.seg(row);
            const u8* wr = sg.w(s) + (i64)(row - sg.first(s)) * nb * F::BYTES;
#pragma unroll
            for (int h = 0; h < NBL; ++h)
                if (lane + 32 * h < nb) f[j][h].load(wr + (i64)(lane + 32 * h) * F::BYTES, 0);
        }
    }
    // Thread t holds float4 t + 256 h of the row (values 4t .. 4t + 3 of that part: block
    // t / 8 + 32 h), where that is inside the row.
    float4 g[NBL];
#pragma unroll
    for (int h = 0; h < NBL; ++h) {
        g[h] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (t + 256 * h < k / 4) g[h] = ((const float4*)nw)[t + 256 * h];
    }
    PDL_WAIT();
    PDL_TRIGGER();
    float4 v[NBL];
    double ss = 0.0;
#pragma unroll
    for (int h = 0; h < NBL; ++h) {
        v[h] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (t + 256 * h < k / 4) {
            v[h] = ((const float4*)x)[t + 256 * h];
            ss += (double)__fmul_rn(v[h].x, v[h].x) + (double)__fmul_rn(v[h].y, v[h].y) +
                  (double)__fmul_rn(v[h].z, v[h].z) + (double)__fmul_rn(v[h].w, v[h].w);
        }
    }
    ss = block_sum_f64(ss);
    const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)(ss / (double)k), eps)));
#pragma unroll
    for (int h = 0; h < NBL; ++h) {
        const int i = t + 256 * h;  // float4 index
        float4 u = v[h];
        u = make_float4(__fmul_rn(__fmul_rn(u.x, scale), g[h].x), __fmul_rn(__fmul_rn(u.y, scale), g[h].y),
                        __fmul_rn(__fmul_rn(u.z, scale), g[h].z), __fmul_rn(__fmul_rn(u.w, scale), g[h].w));
        float amax = fmaxf(fmaxf(fabsf(u.x), fabsf(u.y)), fmaxf(fabsf(u.z), fabsf(u.w)));
#pragma unroll
        for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(MV_FULL, amax, o));
        const bool nan_here = u.x != u.x || u.y != u.y || u.z != u.z || u.w != u.w;
        const u32 nan_lanes = __ballot_sync(MV_FULL, nan_here);
        if (nan_lanes) {  // warp-uniform
            // A NaN replaces C's running maximum and is replaced by the next value: the block's
            // amax is then that of its values after the last NaN, so walk them in order.
            ((float4*)vals)[i] = u;
            __syncwarp();
            if (nan_lanes & (0xffu << (lane & ~7))) {
                const float* bv = vals + 4 * (i & ~7);
                amax = 0.0f;
                for (int e = 0; e < 32; ++e) {
                    const float av = fabsf(bv[e]);
                    amax = amax > av ? amax : av;
                }
            }
        }
        const float d = __fdiv_rn(amax, 127.0f);
        const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
        const float e4[4] = {u.x, u.y, u.z, u.w};
        u32 word = 0;
        int sum = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float r = round_half_away(__fmul_rn(e4[j], id));
            // C's float to int8_t as x86 compilers emit it (see quantize_q8_32_lane).
            const int qi = (r != r || fabsf(r) >= 2147483648.0f) ? 0 : (int)r;
            sum += (int)(i8)(qi & 0xff);
            word |= (u32)(qi & 0xff) << (8 * j);
        }
#pragma unroll
        for (int o = 4; o > 0; o >>= 1) sum += __shfl_xor_sync(MV_FULL, sum, o);
        if (i < k / 4) {
            aq[i] = word;
            if ((i & 7) == 0) {
                u32 packed = q8_f32_to_f16(d);
                if (Q81) packed |= (u32)q8_f32_to_f16(q8_mul_like_x86((float)sum, d)) << 16;
                am[i / 8] = make_uint2(packed, (u32)sum);
            }
        }
    }
    __syncthreads();
    u32 a[NBL][8];
    uint2 meta[NBL];
#pragma unroll
    for (int h = 0; h < NBL; ++h) {
        const int b = lane + 32 * h;
        meta[h] = make_uint2(0, 0);
        if (b < nb) {
            const uint4 lo = ((const uint4*)aq)[2 * b], hi = ((const uint4*)aq)[2 * b + 1];
            a[h][0] = lo.x, a[h][1] = lo.y, a[h][2] = lo.z, a[h][3] = lo.w;
            a[h][4] = hi.x, a[h][5] = hi.y, a[h][6] = hi.z, a[h][7] = hi.w;
            meta[h] = am[b];
        }
    }
#pragma unroll
    for (int j = 0; j < ROWS; ++j) {
        const int row = r0 + warp + MV_WARPS * j;
        if (row >= r1) break;  // warp-uniform
        const int s = sg.seg(row), lr = row - sg.first(s);
        float acc = 0.0f;
#pragma unroll
        for (int h = 0; h < NBL; ++h) {
            const float term = lane + 32 * h < nb ? f[j][h].term(a[h], meta[h]) : 0.0f;
            for (int b = 32 * h; b < min(nb, 32 * h + 32); ++b)
                acc = __fadd_rn(acc, __shfl_sync(MV_FULL, term, b - 32 * h));
        }
        if (lane == 0) sg.y(s)[lr] = mv_epilogue(acc, sg.bias(s), nullptr, lr, lr);
    }
}

#define MATVEC_Q8_SHORT_NORM(name, fmt, q81)                                                     \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP)                                \
        matvec_q8_short_norm_##name(float* y, const u8* w, const float* x, const float* nw,      \
                                    float eps, int n_out, int k, int rows_per_block,             \
                                    const float* bias, MV_SEG_PARAMS) {                          \
        PDL_WAITS_INSIDE();                                                                      \
        matvec_q8_short_norm<fmt, q81, 1>(MV_SEGS(y, w, bias, n_out), x, nw, eps, k,             \
                                          rows_per_block);                                       \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP)                                \
        matvec_q8_short_norm2_##name(float* y, const u8* w, const float* x, const float* nw,     \
                                     float eps, int n_out, int k, int rows_per_block,            \
                                     const float* bias, MV_SEG_PARAMS) {                         \
        PDL_WAITS_INSIDE();                                                                      \
        matvec_q8_short_norm<fmt, q81, 2>(MV_SEGS(y, w, bias, n_out), x, nw, eps, k,             \
                                          rows_per_block);                                       \
    }
MATVEC_Q8_SHORT_NORM(q4_0, mv_q4_0, false)
MATVEC_Q8_SHORT_NORM(q4_1, mv_q4_1, true)
MATVEC_Q8_SHORT_NORM(q5_0, mv_q5_0, false)
MATVEC_Q8_SHORT_NORM(q5_1, mv_q5_1, true)
MATVEC_Q8_SHORT_NORM(q8_0, mv_q8_0, false)
MATVEC_Q8_SHORT_NORM(iq4_nl, mv_iq4_nl, false)

// Legacy formats, one activation row, rows longer than the short kernel's. Each weight row is
// shared by G lanes of a warp (32 / G rows per warp; G = 8 when there are many rows, 32 when
// there are few): in round q, lane g of the row's group computes block q·G + g's term, and
// every lane of the group then adds the round's G terms in block order (shuffles): the CPU's
// chain, kept by all rows of the warp at once. Each lane has the next MVT_AHEAD - 1 rounds'
// weight blocks on their way (a ring of registers) while it computes, and the first ones are
// requested before the PDL wait. Compared with the block-step kernel (its chains run by one
// thread per row through shared memory, two barriers a step), this spends far fewer
// instructions per weight byte. Grid: ceil(n_out / (MVT_WARPS · 32 / G)).
#define MVT_WARPS 4  // warps per thread block
#define MVT_AHEAD 4  // rounds of weight blocks in registers per lane

template <typename F, int G>
__device__ void matvec_q8_tile(const mv_segs sg, const u8* __restrict__ acts, long long meta_off,
                               int k, const float* __restrict__ residual) {
    constexpr int R = WARP / G;  // rows per warp
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int g = lane % G, group = lane - g;
    const int row = (blockIdx.x * MVT_WARPS + warp) * R + lane / G;
    const bool live = row < sg.n_out;  // the same for the lanes of a group
    const int sgi = sg.seg(live ? row : 0), lr = (live ? row : 0) - sg.first(sgi);
    const int nb = k / 32;
    const int n_rounds = (nb + G - 1) / G;  // the same for every lane
    const u8* wr = sg.w(sgi) + (i64)lr * nb * F::BYTES;
    F ring[MVT_AHEAD];
#pragma unroll
    for (int i = 0; i < MVT_AHEAD; ++i) {
        const int b = i * G + g;
        if (live && b < nb) ring[i].load(wr + (i64)b * F::BYTES, 0);
    }
    PDL_WAIT();  // weights are on their way
    PDL_TRIGGER();
    const i8* qs = (const i8*)acts;
    const u8* meta = acts + meta_off;
    float acc = 0.0f;
    for (int q0 = 0; q0 < n_rounds; q0 += MVT_AHEAD) {
#pragma unroll
        for (int i = 0; i < MVT_AHEAD; ++i) {
            const int q = q0 + i;
            if (q >= n_rounds) break;  // warp-uniform
            const int b = q * G + g;
            float t = 0.0f;
            if (live && b < nb) {
                u32 a[8];
                mv_load_acts(qs + 32 * (i64)b, a);
                t = ring[i].term(a, mv_meta<F>(meta, 32 * (i64)b));
            }
            const int bn = b + MVT_AHEAD * G;  // this slot's next block
            if (live && bn < nb) ring[i].load(wr + (i64)bn * F::BYTES, 0);
            const int cnt = min(G, nb - q * G);
            for (int j = 0; j < cnt; ++j) acc = __fadd_rn(acc, __shfl_sync(MV_FULL, t, group + j));
        }
    }
    if (live && g == 0) sg.y(sgi)[lr] = mv_epilogue(acc, sg.bias(sgi), residual, lr, lr);
}

// The same rounds, chains and terms as `matvec_q8_tile` (bit for bit), with the weights staged:
// a warp's round (its R = 32 / G rows × G blocks, one contiguous run of G · BYTES bytes per row)
// arrives in shared memory by 16-byte asynchronous copies, coalesced, MVT_STAGES - 1 rounds
// ahead, and each lane reads its block from there. The register ring's loads were 4-byte reads
// 34 bytes apart (Q8_0): every warp load touched a dozen cache lines, and L1 throughput, not
// DRAM, capped the kernel near 2.5 TB/s. Needs 16-byte aligned row runs: k % 256 == 0 (the host
// checks). Grid as `matvec_q8_tile`. Taken with G = 8 (many rows) and G = 16 (two rows per
// warp, for fewer rows): with G = 32 (one row per warp) it was slower than the register ring
// (see ops.rs).
#ifndef MVT_STAGES
#define MVT_STAGES 4  // rounds of weights in a warp's shared ring
#endif

template <typename F, int G>
__device__ void matvec_q8_tile_staged(const mv_segs sg, const u8* __restrict__ acts,
                                      long long meta_off, int k,
                                      const float* __restrict__ residual) {
    constexpr int R = WARP / G;                     // rows per warp
    constexpr int RUN = G * F::BYTES;               // bytes of one row in a round
    constexpr int CR = RUN / 16;                    // 16-byte pieces of a row's run
    constexpr int PIECES = R * CR;                  // per round
    constexpr int PER_LANE = (PIECES + WARP - 1) / WARP;
    static_assert(RUN % 16 == 0, "a row's run must be whole 16-byte pieces");
    // + 1: mv_lds_words may read one word past the last block.
    constexpr int STAGES = MVT_STAGES;
    __shared__ uint4 stage[MVT_WARPS][STAGES][PIECES + 1];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int g = lane % G, group = lane - g;
    const int first_row = (blockIdx.x * MVT_WARPS + warp) * R;
    const int row = first_row + lane / G;
    const bool live = row < sg.n_out;  // the same for the lanes of a group
    const int sgi = sg.seg(live ? row : 0), lr = (live ? row : 0) - sg.first(sgi);
    const int nb = k / 32;
    const i64 row_bytes = (i64)nb * F::BYTES;
    const int n_rounds = (nb + G - 1) / G;
    // The pieces this lane copies: piece c = lane + 32 j is piece c % CR of row c / CR's run.
    const u8* src[PER_LANE];
    int at[PER_LANE];  // the piece's byte offset in the run; -1: no such piece or row
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) {
        const int c = lane + WARP * j, rr = first_row + c / CR;
        src[j] = sg.w(0);
        at[j] = -1;
        if (c < PIECES && rr < sg.n_out) {
            const int s = sg.seg(rr);
            src[j] = sg.w(s) + (i64)(rr - sg.first(s)) * row_bytes + (c % CR) * 16;
            at[j] = (c % CR) * 16;
        }
    }
    auto issue = [&](int q) {
        uint4* dst = stage[warp][q % STAGES];
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            const int c = lane + WARP * j;
            if (c < PIECES) {
                const i64 off = (i64)q * RUN;
                const i64 left = at[j] < 0 ? 0 : row_bytes - off - at[j];
                const int n = (int)max((i64)0, min((i64)16, left));
                mv_cp_async16(dst + c, n > 0 ? src[j] + off : src[j], n);
            }
        }
    };
#pragma unroll
    for (int q = 0; q < STAGES - 1; ++q) {
        if (q < n_rounds) issue(q);
        mv_cp_commit();
    }
    PDL_WAIT();  // weights are on their way
    PDL_TRIGGER();
    const i8* qs = (const i8*)acts;
    const u8* meta = acts + meta_off;
    float acc = 0.0f;
    for (int q = 0; q < n_rounds; ++q) {
        __syncwarp();  // every lane is done with the slot the next copies overwrite
        if (q + STAGES - 1 < n_rounds) issue(q + STAGES - 1);
        mv_cp_commit();
        mv_cp_wait<STAGES - 1>();
        __syncwarp();  // round q's pieces, copied by every lane, are visible to all
        const int b = q * G + g;
        float t = 0.0f;
        if (live && b < nb) {
            F f;
            f.load((const u8*)stage[warp][q % STAGES] + (lane / G) * RUN + g * F::BYTES, 0);
            u32 a[8];
            mv_load_acts(qs + 32 * (i64)b, a);
            t = f.term(a, mv_meta<F>(meta, 32 * (i64)b));
        }
        const int cnt = min(G, nb - q * G);
        for (int j = 0; j < cnt; ++j) acc = __fadd_rn(acc, __shfl_sync(MV_FULL, t, group + j));
    }
    if (live && g == 0) sg.y(sgi)[lr] = mv_epilogue(acc, sg.bias(sgi), residual, lr, lr);
}

#define MATVEC_Q8_TILE(name, fmt)                                                                \
    extern "C" __global__ void __launch_bounds__(MVT_WARPS * WARP)                               \
        matvec_q8_tile_##name(float* y, const u8* w, const u8* acts, long long meta_off,         \
                              int n_out, int k, const float* bias, const float* residual,        \
                              MV_SEG_PARAMS) {                                                   \
        PDL_WAITS_INSIDE();                                                                      \
        matvec_q8_tile<fmt, 8>(MV_SEGS(y, w, bias, n_out), acts, meta_off, k, residual);         \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(MVT_WARPS * WARP)                               \
        matvec_q8_row_##name(float* y, const u8* w, const u8* acts, long long meta_off,          \
                             int n_out, int k, const float* bias, const float* residual,         \
                             MV_SEG_PARAMS) {                                                    \
        PDL_WAITS_INSIDE();                                                                      \
        matvec_q8_tile<fmt, 32>(MV_SEGS(y, w, bias, n_out), acts, meta_off, k, residual);        \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(MVT_WARPS * WARP)                               \
        matvec_q8_stile_##name(float* y, const u8* w, const u8* acts, long long meta_off,        \
                               int n_out, int k, const float* bias, const float* residual,       \
                               MV_SEG_PARAMS) {                                                  \
        PDL_WAITS_INSIDE();                                                                      \
        matvec_q8_tile_staged<fmt, 8>(MV_SEGS(y, w, bias, n_out), acts, meta_off, k, residual);  \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(MVT_WARPS * WARP)                               \
        matvec_q8_stile16_##name(float* y, const u8* w, const u8* acts, long long meta_off,      \
                                 int n_out, int k, const float* bias, const float* residual,     \
                                 MV_SEG_PARAMS) {                                                \
        PDL_WAITS_INSIDE();                                                                      \
        matvec_q8_tile_staged<fmt, 16>(MV_SEGS(y, w, bias, n_out), acts, meta_off, k, residual); \
    }
MATVEC_Q8_TILE(q4_0, mv_q4_0)
MATVEC_Q8_TILE(q4_1, mv_q4_1)
MATVEC_Q8_TILE(q5_0, mv_q5_0)
MATVEC_Q8_TILE(q5_1, mv_q5_1)
MATVEC_Q8_TILE(q8_0, mv_q8_0)
MATVEC_Q8_TILE(iq4_nl, mv_iq4_nl)
MATVEC_Q8_TILE(iq4_xs, mv_iq4_xs)

#define MATVEC_Q8(name, fmt)                                                                     \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP, MV_MIN_BLOCKS)                 \
        matvec_q8_##name(float* y, const u8* w, const u8* acts, long long meta_off,              \
                         long long bsums_off, int n_out, int k, int m, int wpr, const float* bias, \
                         const float* residual) {                                                \
        PDL_WAITS_INSIDE();                                                                      \
        matvec_q8<fmt>(y, w, acts, meta_off, bsums_off, n_out, k, m, wpr, bias, residual);       \
    }
MATVEC_Q8(q4_0, mv_q4_0)
MATVEC_Q8(q4_1, mv_q4_1)
MATVEC_Q8(q5_0, mv_q5_0)
MATVEC_Q8(q5_1, mv_q5_1)
MATVEC_Q8(q8_0, mv_q8_0)
MATVEC_Q8(iq4_nl, mv_iq4_nl)
MATVEC_Q8(iq4_xs, mv_iq4_xs)
MATVEC_Q8(q2_k, mv_q2_k)
MATVEC_Q8(q3_k, mv_q3_k)
MATVEC_Q8(q4_k, mv_q4_k)
MATVEC_Q8(q5_k, mv_q5_k)
MATVEC_Q8(q6_k, mv_q6_k)

// ---------------------------------------------------------------------------------------------
// Decode (one activation row) for the lane-major k-quants (Q3_K .. Q6_K): the same terms and
// the same f32 chains as `matvec_q8`, bit for bit, without its block steps. The block first
// transposes the whole activation row into shared memory (lane-major, as `mv_acts_step` does,
// super-block sbx at sbx * MV_ACT_R), then each warp walks its own contiguous range of weight
// rows, i.e. of super-blocks (rows are stored back to back), in rounds: rows of up to 32
// super-blocks go WARP / n_sb whole rows per round (the chains of a round's rows end in it),
// longer rows 32 super-blocks per round (a round spans at most two rows):
// - the round's weights arrive in the warp's staging buffer by asynchronous copies (coalesced;
//   the next round flies while this one computes): Q4_K, Q5_K and Q6_K by 16-byte copies of the
//   round's bytes from the 16-byte word holding the first one (super-block i at its offset in
//   that word + i * BYTES: 0 for the 144- and 176-byte formats, 0 or 2 mod 4 for Q6_K's 210),
//   Q3_K by 4-byte copies, super-block i in slot i of MVR_SW words (odd: thread i reading slot
//   i is free of bank conflicts), from the word holding its first byte;
// - thread i computes super-block i's 8 lane terms (and Q4_K / Q5_K's min term) and stores
//   them to shared memory: Q4_K / Q5_K / Q6_K all at once (`mvr_terms_q45_k`, `mvr_terms_q6_k`:
//   each quant byte read once, transposed to lane-major words with byte permutes), Q3_K lane by
//   lane with the format's `load`, `lane_sum` as `matvec_q8` does; the same integers and float
//   operations either way;
// - the chains: whole-row rounds give each (row, chain) to one thread, which adds the row's
//   terms in super-block order from 0.0f (the min term is stored negated, so the chain's
//   subtraction is this addition), then one thread per row adds the chains like `matvec_q8`
//   (min chain or 0, then sums[0..8] left to right) and stores the output; with long rows,
//   lanes 0..7 own the lane chains and lane 8 the min chain of the current row across rounds,
//   and lane 0 ends each row the same way.
// Grid: a few blocks per SM of W warps each (4, 6 or 8: the host picks the one that leaves the
// fewest rows per warp, given how many blocks fit); dynamic shared memory mvr_smem_bytes.

// Bytes per super-block of transposed activations: MV_ACT_T's layout, with a stride whose 16-byte
// words are odd, so that the 8 threads of a quarter warp reading 16 bytes of 8 consecutive
// super-blocks hit distinct banks.
#define MV_ACT_R 304

template <typename F>
struct mvr_shape {
    // 4-byte words copied per super-block by 4-byte copies (from the word holding its first
    // byte: 110-byte super-blocks start at 0 or 2 mod 4), and the slot stride in words (odd).
    static constexpr int WPS = (F::BYTES + (F::BYTES % 4 ? 2 : 0) + 3) / 4;
    static constexpr int SW = WPS | 1;
    // Whole-super-block formats (Q4_K, Q5_K, Q6_K) are copied 16 bytes at a time: a round's
    // super-blocks are contiguous in global memory and in the buffer; 16-byte reads of 8
    // threads at a stride of 144 or 176 bytes hit distinct banks.
    static constexpr bool COPY16 = F::WHOLE;
    // A staging buffer: 32 super-blocks, plus (when they are not whole 16-byte words) the
    // leading offset, the last word's rest and the word `mv_lds_words` may read past the end
    // (a multiple of 16 bytes, so that the second buffer stays 16-byte aligned); or 32 slots and
    // 4 words that `load` may read past the last slot.
    static constexpr int BUF_WORDS =
        COPY16 ? WARP * F::BYTES / 4 + (F::BYTES % 16 ? 8 : 0) : WARP * SW + 4;
    // Per warp: two staging buffers, then 32 × 9 f32 terms (stride 9: conflict-free).
    static constexpr int WARP_BYTES = 2 * BUF_WORDS * 4 + WARP * 9 * 4;
};

// Bulk copies (sm_90+: the copy engine, `cp.async.bulk`) into shared memory, their completion
// counted on an mbarrier: init (one arrival: the issuing thread's), arrive with the bytes to
// expect and copy, wait for a phase. Below sm_90 they compile to nothing: the host never asks
// for them there.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
// One bulk copy of `bytes` weight bytes into shared memory, counted on `bar`; HINT: with the
// evict-first policy.
template <bool HINT>
__device__ __forceinline__ void mvb_bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
#if MV_EVICT_FIRST || Q8S_EVICT_FIRST
    if constexpr (HINT) {
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], "
            "%4;" ::"r"(dst),
            "l"(src), "r"(bytes), "r"(bar), "l"(mv_stream_policy())
            : "memory");
        return;
    }
#endif
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void mvb_bar_init(u32 bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}
template <bool HINT = MV_EVICT_FIRST>
__device__ __forceinline__ void mvb_issue(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
    mvb_bulk_copy<HINT>(dst, src, bytes, bar);
}
__device__ __forceinline__ void mvb_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n .reg .pred p;\n MVB_WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra MVB_WAIT_%=;\n}" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// What the block does to x before rounding it (`pro`): 0 nothing; 1 RMSNorm with weight `nw` and
// `eps` (as rms_norm_f32: f32 squares summed in f64, here grouped by thread, then 1/sqrtf(mean +
// eps), the scale, then the weight); 2 SwiGLU, x the gate and x2 the up projection (swiglu_f32's
// arithmetic); 3 GeGLU through ggml's f16 table (geglu_f32's).
#define MVB_PRO_NONE 0
// 1: the bulk kernel's RMSNorm prologue reads each value and norm weight once, before the sum of
// squares (rows of at most 8 values a thread); 0: the values twice, the weights after the sum.
#ifndef MVB_ONE_LOAD
#define MVB_ONE_LOAD 1
#endif
#define MVB_PRO_NORM 1
#define MVB_PRO_SWIGLU 2
#define MVB_PRO_GEGLU 3
__device__ __forceinline__ float mvb_pro(int pro, float v, int i, int k, const float* x2, const float* nw,
                                         float scale, const u16* table) {
    if (pro == MVB_PRO_NORM) return __fmul_rn(__fmul_rn(v, scale), nw[i]);
    if (pro == MVB_PRO_SWIGLU) return swiglu_one(v, x2[i], i, k);
    if (pro == MVB_PRO_GEGLU) return geglu_one(v, x2[i], table);
    return v;
}
__device__ __forceinline__ void mvb_expect(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
template <bool HINT = MV_EVICT_FIRST>
__device__ __forceinline__ void mvb_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
    mvb_bulk_copy<HINT>(dst, src, bytes, bar);
}
__device__ __forceinline__ void mvb_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// Before a copy into a buffer this thread's warp has read (generic reads, then async writes).
__device__ __forceinline__ void mvb_fence_reuse() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
#else
__device__ __forceinline__ void mvb_bar_init(u32) {}
template <bool HINT = MV_EVICT_FIRST>
__device__ __forceinline__ void mvb_issue(u32, const void*, u32, u32) {}
__device__ __forceinline__ void mvb_wait(u32, u32) {}
__device__ __forceinline__ void mvb_expect(u32, u32) {}
template <bool HINT = MV_EVICT_FIRST>
__device__ __forceinline__ void mvb_copy(u32, const void*, u32, u32) {}
__device__ __forceinline__ void mvb_fence_init() {}
__device__ __forceinline__ void mvb_fence_reuse() {}
#endif

// Dynamic shared memory of `matvec_q8_rows_*` for rows of n_sb super-blocks (mirrored by ops.rs).
template <typename F, int W>
constexpr int mvr_smem_bytes(int n_sb) {
    return n_sb * MV_ACT_R + W * mvr_shape<F>::WARP_BYTES;
}

// Asynchronous copy of 4 bytes of global memory to shared memory (both 4-byte aligned).
__device__ __forceinline__ void mv_cp_async4(void* dst, const void* src) {
    const u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src) : "memory");
}

// Starts copying super-blocks u .. u + cnt of the weights (flattened over rows) into the slots
// of `dst`; one copy group per call, empty or not. Word wi of super-block j: lane j * WPS + wi
// mod 32 (consecutive lanes read consecutive words). Reads at most 2 bytes past a super-block
// (inside WEIGHT_PAD after the last one).
template <typename F>
__device__ __forceinline__ void mvr_fetch(u32* dst, const u8* w, i64 u, int cnt, int lane) {
    using R = mvr_shape<F>;
    const i64 g0 = u * F::BYTES;
    const int n = cnt * R::WPS;
    int j = lane / R::WPS, wi = lane % R::WPS;
    for (int f = lane; f < n; f += WARP) {
        const i64 g = g0 + j * F::BYTES;
        mv_cp_async4(dst + j * R::SW + wi, w + (g & ~(i64)3) + 4 * wi);
        wi += WARP;
        while (wi >= R::WPS) wi -= R::WPS, ++j;
    }
    mv_cp_commit();
}

// `mvr_fetch` for the whole-super-block formats: the round's `cnt` super-blocks from u on (u
// counts over the launch's rows; rows ra .. rb of the launch) are, within one matrix, contiguous
// (rows are stored back to back), so lane f copies 16-byte pieces f, f + 32, ... of their bytes
// from the 16-byte word holding the first (coalesced, a quarter of the copy instructions of
// 4-byte copies; pieces past the last super-block stay inside WEIGHT_PAD). A round that crosses
// from one matrix of the launch into the next (16-byte super-blocks only: the host sends
// several matrices per launch for Q4_K and Q5_K alone) finds each piece's matrix, through the
// row of the piece's super-block (li: u's index in the warp's range, which starts at row r0).
template <typename F, bool MULTI>
__device__ __forceinline__ void mvr_fetch16(u32* dst, const mv_segs& sg, int n_sb, i64 u,
                                            int cnt, int lane, int ra, int rb, int r0, int li) {
    const int s0 = MULTI ? sg.seg(ra) : 0, s1 = MULTI ? sg.seg(rb) : 0;
    if (!MULTI || s0 == s1) {
        const i64 g0 = (u - (i64)sg.first(s0) * n_sb) * F::BYTES;
        const u8* src = sg.w(s0) + (g0 & ~(i64)15);
        const int n = cnt ? (int)(((g0 + (i64)cnt * F::BYTES + 15) >> 4) - (g0 >> 4)) : 0;
        for (int f = lane; f < n; f += WARP) mv_cp_async16(dst + 4 * f, src + 16 * f, 16);
    } else if constexpr (F::BYTES % 16 == 0) {
        constexpr int P = F::BYTES / 16;  // pieces per super-block
        for (int f = lane; f < cnt * P; f += WARP) {
            const int j = f / P;
            const int s = sg.seg(r0 + (li + j) / n_sb);
            const u8* src =
                sg.w(s) + (u + j - (i64)sg.first(s) * n_sb) * F::BYTES + 16 * (f - j * P);
            mv_cp_async16(dst + 4 * f, src, 16);
        }
    }
    mv_cp_commit();
}

// `mvr_fetch16` by bulk copies, issued by one thread (`lane` 0) and counted on `bar`: the same
// bytes at the same places (16-byte words from the one holding the round's first byte; a round
// crossing into the next matrix in one copy per matrix, whole super-blocks of 16-byte multiples).
// Nothing is issued (and `bar` not armed) for an empty round.
template <typename F, bool MULTI>
__device__ __forceinline__ void mvr_fetch_bulk(u32* dst, const mv_segs& sg, int n_sb, i64 u, int cnt,
                                               int ra, int rb, int r0, int li, u32 bar) {
    if (cnt == 0) return;
    const u32 d = (u32)__cvta_generic_to_shared(dst);
    const int s0 = MULTI ? sg.seg(ra) : 0, s1 = MULTI ? sg.seg(rb) : 0;
    if (!MULTI || s0 == s1) {
        const i64 g0 = (u - (i64)sg.first(s0) * n_sb) * F::BYTES;
        const u32 n = (u32)(((g0 + (i64)cnt * F::BYTES + 15) >> 4) - (g0 >> 4)) * 16u;
        mvb_expect(bar, n);
        mvb_copy(d, sg.w(s0) + (g0 & ~(i64)15), n, bar);
    } else if constexpr (F::BYTES % 16 == 0) {
        mvb_expect(bar, (u32)cnt * F::BYTES);
        int j = 0;
        while (j < cnt) {  // runs of super-blocks within one matrix
            const int s = sg.seg(r0 + (li + j) / n_sb);
            int e = j + 1;
            while (e < cnt && sg.seg(r0 + (li + e) / n_sb) == s) ++e;
            const u8* src = sg.w(s) + (u + j - (i64)sg.first(s) * n_sb) * F::BYTES;
            mvb_copy(d + (u32)j * F::BYTES, src, (u32)(e - j) * F::BYTES, bar);
            j = e;
        }
    }
}

// The nine terms of one Q4_K (Q5 = false) or Q5_K super-block, staged at `b` (16-byte aligned),
// against its transposed activations `at` (MV_ACT_R layout): out[l] = (d·d_a)·lane_l for the
// eight e % 8 lanes, out[8] = -(dmin·d_a)·Σ min·bsum (negated: the min chain subtracts it, and
// x - y == x + (-y) exactly). The same integers and float operations as `mv_q4_k` / `mv_q5_k`'s
// `load`, `lane_sum` and `min_sum` for each lane, computed once per super-block: 32 bytes of
// quants are transposed to lane-major words with byte permutes (lane l takes bytes l, l + 8,
// l + 16, l + 24, whose low nibbles are sub-block 2c and high nibbles sub-block 2c + 1).
template <bool Q5>
__device__ __forceinline__ void mvr_terms_q45_k(const u8* b, const u8* at, float (&out)[9]) {
    const uint4 head = *(const uint4*)b;  // d | dmin, scales[12]
    const float d = mv_half_lo(head.x), dmin = mv_half_hi(head.x);
    const u32 s0 = head.y, s1 = head.z, s2 = head.w;
    const u32 sc_lo = s0 & 0x3f3f3f3fu;
    const u32 sc_hi = (s2 & 0x0f0f0f0fu) | (((s0 >> 6) & 0x03030303u) << 4);
    const u32 mins0 = s1 & 0x3f3f3f3fu;
    const u32 mins1 = ((s2 >> 4) & 0x0f0f0f0fu) | (((s1 >> 6) & 0x03030303u) << 4);
    int sc[8];
#pragma unroll
    for (int i = 0; i < 4; ++i)
        sc[i] = (int)((sc_lo >> (8 * i)) & 0xffu), sc[4 + i] = (int)((sc_hi >> (8 * i)) & 0xffu);
    u32 qh[8];  // Q5_K: the fifth bits, lane-major (bit j of byte i: sub-block j)
    if constexpr (Q5) {
        const uint4 u = *(const uint4*)(b + 16), v = *(const uint4*)(b + 32);
        mv_transpose4(u.x, u.z, v.x, v.z, qh[0], qh[1], qh[2], qh[3]);
        mv_transpose4(u.y, u.w, v.y, v.w, qh[4], qh[5], qh[6], qh[7]);
    }
    constexpr int QS = Q5 ? 48 : 16;
    int acc[8];
#pragma unroll
    for (int l = 0; l < 8; ++l) acc[l] = 0;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const uint4 u = *(const uint4*)(b + QS + 32 * c), v = *(const uint4*)(b + QS + 32 * c + 16);
        u32 p[8];
        mv_transpose4(u.x, u.z, v.x, v.z, p[0], p[1], p[2], p[3]);
        mv_transpose4(u.y, u.w, v.y, v.w, p[4], p[5], p[6], p[7]);
#pragma unroll
        for (int l = 0; l < 8; ++l) {
            // Lane l's activation words 2c and 2c + 1 (sub-blocks 2c, 2c + 1).
            const uint2 a = *(const uint2*)(at + 32 * l + 8 * c);
            u32 lo = p[l] & 0x0f0f0f0fu, hi = (p[l] >> 4) & 0x0f0f0f0fu;
            if constexpr (Q5) {
                lo |= ((qh[l] >> (2 * c)) & 0x01010101u) << 4;
                hi |= ((qh[l] >> (2 * c + 1)) & 0x01010101u) << 4;
            }
            acc[l] += sc[2 * c] * mv_dp4a(lo, a.x, 0) + sc[2 * c + 1] * mv_dp4a(hi, a.y, 0);
        }
    }
    const float da = *(const float*)(at + 272);
    const float dd = __fmul_rn(d, da);
#pragma unroll
    for (int l = 0; l < 8; ++l) out[l] = __fmul_rn(dd, (float)acc[l]);
    const uint4 pp = *(const uint4*)(at + 256);  // pair sums of bsums
    int summ = __dp2a_lo((int)pp.x, (int)mins0, 0);
    summ = __dp2a_hi((int)pp.y, (int)mins0, summ);
    summ = __dp2a_lo((int)pp.z, (int)mins1, summ);
    summ = __dp2a_hi((int)pp.w, (int)mins1, summ);
    out[8] = -__fmul_rn(__fmul_rn(dmin, da), (float)summ);
}

// The eight lane terms of one Q6_K super-block staged at `b` (2-byte aligned) against its
// transposed activations `at` (MV_ACT_R layout): out[l] = (d·d_a)·lane_l, the integers and float
// operations of `mv_q6_k`'s `load` and `lane_sum`, computed once per super-block. Per half h,
// the three 32-byte rows of quants (low nibbles of elements 128h + 32g + l: row 2h + (g & 1),
// high nibble for g >= 2; high bits: row 4 + h, bits 2g) are transposed to lane-major words
// (lane l: bytes l, l + 8, l + 16, l + 24). A lane word's first two bytes (elements < 16 of the
// group) take scale sc0 and its last two sc1: sc0·Σlo + sc1·Σhi = sc1·Σ + (sc0 - sc1)·Σlo,
// exact in integers.
__device__ __forceinline__ void mvr_terms_q6_k(const u8* b, const u8* at, float (&out)[9]) {
    u32 sw[5];  // scales[16] (int8), then d in the low half of sw[4]
    mv_lds_words<5>(b + 192, sw);
    int acc[8];
#pragma unroll
    for (int l = 0; l < 8; ++l) acc[l] = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        u32 lo[16], hb[8];
        mv_lds_words<16>(b + 64 * h, lo);
        mv_lds_words<8>(b + 128 + 32 * h, hb);
        u32 l0[8], l1[8], hh[8];
        mv_transpose4(lo[0], lo[2], lo[4], lo[6], l0[0], l0[1], l0[2], l0[3]);
        mv_transpose4(lo[1], lo[3], lo[5], lo[7], l0[4], l0[5], l0[6], l0[7]);
        mv_transpose4(lo[8], lo[10], lo[12], lo[14], l1[0], l1[1], l1[2], l1[3]);
        mv_transpose4(lo[9], lo[11], lo[13], lo[15], l1[4], l1[5], l1[6], l1[7]);
        mv_transpose4(hb[0], hb[2], hb[4], hb[6], hh[0], hh[1], hh[2], hh[3]);
        mv_transpose4(hb[1], hb[3], hb[5], hb[7], hh[4], hh[5], hh[6], hh[7]);
        int sc1[4], dsc[4];
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            const int i = 8 * h + 2 * g;
            const int s0 = mv_sbyte(sw[i / 4], i % 4), s1 = mv_sbyte(sw[i / 4], i % 4 + 1);
            sc1[g] = s1, dsc[g] = s0 - s1;
        }
#pragma unroll
        for (int l = 0; l < 8; ++l) {
            const uint4 av = *(const uint4*)(at + 32 * l + 16 * h);  // groups 4h .. 4h + 3
            const u32 a[4] = {av.x, av.y, av.z, av.w};
#pragma unroll
            for (int g = 0; g < 4; ++g) {
                const u32 src = (g & 1) ? l1[l] : l0[l];
                const u32 x = ((src >> (4 * (g >> 1))) & 0x0f0f0f0fu) |
                              (((hh[l] >> (2 * g)) & 0x03030303u) << 4);
                const u32 v = (x + 0x60606060u) ^ 0x80808080u;  // x - 32, bytewise
                acc[l] += sc1[g] * mv_dp4a(v, a[g], 0) + dsc[g] * mv_dp4a(v, a[g] & 0xffffu, 0);
            }
        }
    }
    const float dd = __fmul_rn(mv_half_lo(sw[4]), *(const float*)(at + 272));
#pragma unroll
    for (int l = 0; l < 8; ++l) out[l] = __fmul_rn(dd, (float)acc[l]);
}

// Writes task `id` (super-block id / 9, part id % 9) read by `s.read` for one activation row
// (nc = 1, span = super-blocks per row): `mv_acts_step::write` with the stride MV_ACT_R.
template <typename F>
__device__ __forceinline__ void mvr_write_acts(const mv_acts_step& s, int id, u8* acts_t) {
    const int sbx = id / 9, g = id - sbx * 9;
    u8* dst = acts_t + sbx * MV_ACT_R;
    if (g < 8) {
        u32 o[8];  // even words hold lanes 0..3, odd words lanes 4..7
        mv_transpose4(s.x.x, s.x.z, s.z.x, s.z.z, o[0], o[1], o[2], o[3]);
        mv_transpose4(s.x.y, s.x.w, s.z.y, s.z.w, o[4], o[5], o[6], o[7]);
#pragma unroll
        for (int l = 0; l < 8; ++l) *(u32*)(dst + 32 * l + 4 * g) = o[l];
    } else {
        if (F::MIN)
            *(uint4*)(dst + 256) = make_uint4(mv_pair_sum(s.x.x) | mv_pair_sum(s.x.y) << 16,
                                              mv_pair_sum(s.x.z) | mv_pair_sum(s.x.w) << 16,
                                              mv_pair_sum(s.z.x) | mv_pair_sum(s.z.y) << 16,
                                              mv_pair_sum(s.z.z) | mv_pair_sum(s.z.w) << 16);
        *(float*)(dst + 272) = s.d;
    }
}

// Super-block `sb` of the activation row, lane i holding its values 8i .. 8i + 7 in `v` (the
// calling warp): quantized to Q8_K into the transposed form `matvec_q8_rows` reads.
__device__ __forceinline__ void mvr_store_sb(u8* acts_t, int sb, int lane, const float (&v)[8]) {
    u32 q[2];
    int sum;
    float d;
    quantize_q8_k_lane(v, q, sum, d);
    u8* dst = acts_t + sb * MV_ACT_R;
#pragma unroll
    for (int j = 0; j < 8; ++j) dst[32 * j + 4 * (lane / 4) + lane % 4] = (u8)(q[j / 4] >> (8 * (j % 4)));
    // Σ of the 32 quants of sub-block lane / 4 (lanes 4s .. 4s + 3), as the i16 pair sums.
    int s32 = sum + __shfl_xor_sync(MV_FULL, sum, 1);
    s32 += __shfl_xor_sync(MV_FULL, s32, 2);
    if (lane % 4 == 0) *(short*)(dst + 256 + 2 * (lane / 4)) = (short)s32;
    if (lane == 0) *(float*)(dst + 272) = d;
}

// The activation row of `matvec_q8_rows` from f32 values, quantized to Q8_K by this block
// straight into its transposed form (MV_ACT_R layout), after RMSNorm when `norm_w` is given: the
// operations of rms_norm_q8_k (quantize.cu) then `mv_acts_step`, so the same bits. Warp w takes
// super-blocks w, w + (warps of the block), ...; lane i holds values 8i .. 8i + 7, whose quant j is byte i % 4
// of lane j's word i / 4.
// CG: x read through L2 only (a launch that reads it without its own PDL wait).
// MVR_ONE_LOAD 1: with the norm and at most one super-block a warp, each warp reads its
// super-block's values and norm weights once, before the block's sum of squares, and quantizes
// them from registers (0: the values are read again after the sum, the weights then too).
#ifndef MVR_ONE_LOAD
#define MVR_ONE_LOAD 1
#endif
template <bool CG = false>
__device__ void mvr_quantize_row(u8* acts_t, const float* __restrict__ xf,
                                 const float* __restrict__ norm_w, float eps, int k) {
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    float scale = 1.0f;
#if MVR_ONE_LOAD
    if (norm_w && k / QK_K <= (int)(blockDim.x / WARP)) {
        const int sb = warp, e = sb * QK_K + 8 * lane;
        const bool mine = sb < k / QK_K;
        float v[8], g[8];
        double ss = 0.0;
        if (mine) {
            const float4 a = CG ? __ldcg((const float4*)(xf + e)) : *(const float4*)(xf + e),
                         b = CG ? __ldcg((const float4*)(xf + e + 4)) : *(const float4*)(xf + e + 4);
            const float4 ga = *(const float4*)(norm_w + e), gb = *(const float4*)(norm_w + e + 4);
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
            g[0] = ga.x, g[1] = ga.y, g[2] = ga.z, g[3] = ga.w, g[4] = gb.x, g[5] = gb.y, g[6] = gb.z, g[7] = gb.w;
#pragma unroll
            for (int i = 0; i < 8; ++i) ss += (double)__fmul_rn(v[i], v[i]);
        }
        ss = block_sum_f64(ss);
        if (!mine) return;  // the caller synchronises the block next
        const float mean = (float)(ss / (double)k);
        scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(__fmul_rn(v[i], scale), g[i]);
        mvr_store_sb(acts_t, sb, lane, v);
        return;
    }
#endif
    if (norm_w) {
        // As the fused RMSNorm: f32 squares summed in f64, 1/sqrtf(mean + eps), scale, weight.
        double ss = 0.0;
        for (int i = threadIdx.x; i < k / 4; i += blockDim.x) {
            const float4 v = CG ? __ldcg((const float4*)xf + i) : ((const float4*)xf)[i];
            ss += (double)__fmul_rn(v.x, v.x) + (double)__fmul_rn(v.y, v.y) +
                  (double)__fmul_rn(v.z, v.z) + (double)__fmul_rn(v.w, v.w);
        }
        ss = block_sum_f64(ss);
        const float mean = (float)(ss / (double)k);
        scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
    }
    for (int sb = warp; sb < k / QK_K; sb += blockDim.x / WARP) {
        const int e = sb * QK_K + 8 * lane;
        const float4 a = CG ? __ldcg((const float4*)(xf + e)) : *(const float4*)(xf + e),
                     b = CG ? __ldcg((const float4*)(xf + e + 4)) : *(const float4*)(xf + e + 4);
        float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        if (norm_w) {
            const float4 ga = *(const float4*)(norm_w + e), gb = *(const float4*)(norm_w + e + 4);
            const float g[8] = {ga.x, ga.y, ga.z, ga.w, gb.x, gb.y, gb.z, gb.w};
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(__fmul_rn(v[i], scale), g[i]);
        }
        mvr_store_sb(acts_t, sb, lane, v);
    }
}

// MODE: which rounds the launch's rows take, known at compile time so that each kernel holds
// only its own path (smaller code, fewer instruction-fetch stalls): MVR_ANY either (decided per
// launch), MVR_WHOLE whole-row rounds only (rows of at most 32 super-blocks), MVR_LONG rounds
// that cross rows only (longer rows, one matrix).
#define MVR_ANY 0
#define MVR_WHOLE 1
#define MVR_LONG 2
// LATE: the launch reads only what was complete before the launch before it (V after Q and K
// of another format, the same row): it waits for that launch at its end instead of its start,
// so the two run side by side while the next launch still finds both done.
template <typename F, int W, int MODE, bool LATE = false>
__device__ void matvec_q8_rows(const mv_segs sg, const u8* __restrict__ acts, long long meta_off,
                               long long bsums_off, int k, const float* __restrict__ residual,
                               const float* __restrict__ xf, const float* __restrict__ norm_w,
                               float eps, int bulk, int block0 = 0, int n_blocks = 0) {
    static_assert(F::KIND == MV_LANES, "lane-major k-quants only");
    using R = mvr_shape<F>;
    constexpr int T9 = 9;               // terms per super-block in `tt`: 8 lanes, the min term
    constexpr int L = F::MIN ? 9 : 8;   // chains per row
    extern __shared__ uint4 mvr_smem[];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int n_sb = k / QK_K;
    u8* acts_t = (u8*)mvr_smem;
    u8* mine = (u8*)mvr_smem + n_sb * MV_ACT_R + warp * R::WARP_BYTES;
    u32* stage = (u32*)mine;                              // two buffers of BUF_WORDS
    float* tt = (float*)(mine + 2 * R::BUF_WORDS * 4);   // term l of slot i at i * 9 + l
    // With `bulk` (sm_90+, 16-byte-copied formats), lane 0 fetches each round by bulk copies
    // counted on the buffer's mbarrier instead of every lane by 16-byte `cp.async`.
    __shared__ __align__(8) u64 mvr_bars[W][2];
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    // sm_90+: always (the host passes bulk = 1 there), so the 16-byte-copy path is not compiled in.
    constexpr bool use_bulk = R::COPY16;
    (void)bulk;
#else
    const bool use_bulk = R::COPY16 && bulk;
#endif
    const u32 bars = (u32)__cvta_generic_to_shared(&mvr_bars[warp][0]);
    if (use_bulk) {
        if (lane == 0) {
            mvb_bar_init(bars);
            mvb_bar_init(bars + 8);
            mvb_fence_init();
        }
        __syncwarp();
    }

    // This warp's rows [r0, r1): super-blocks [u0, u0 + n_u) of the weights.
    const int n_out = sg.n_out;
    // The launch's blocks [block0, block0 + n_blocks) take these rows (all of them: n_blocks 0).
    const i64 n_warps = (i64)(n_blocks ? n_blocks : (int)gridDim.x) * W;
    const i64 gw = (i64)((int)blockIdx.x - block0) * W + warp;
    const int r0 = (int)(gw * n_out / n_warps), r1 = (int)((gw + 1) * n_out / n_warps);
    const i64 u0 = (i64)r0 * n_sb;
    const int n_u = (r1 - r0) * n_sb;
    // Rows per round when whole rows fit in one (else 0), and super-blocks per round.
    const int rpr = MODE == MVR_LONG ? 0 : (MODE == MVR_WHOLE || n_sb <= WARP ? WARP / n_sb : 0);
    const int rs = rpr ? rpr * n_sb : WARP;
    const int n_rounds = (n_u + rs - 1) / rs;
    // Long rows: the row of the next round to fetch and its first super-block's position.
    int f_row = r0, f_pos = 0;
    // Rounds are fetched in order (0, 1, then q + 2 while computing round q).
    auto fetch = [&](int q) {
        const int li = q * rs;
        const int cnt = max(0, min(rs, n_u - li));
        u32* dst = stage + (q & 1) * R::BUF_WORDS;
        if constexpr (R::COPY16) {
            int ra = f_row, rb = f_row;
            if (MODE == MVR_WHOLE || (MODE == MVR_ANY && rpr)) {
                ra = r0 + q * rpr;
                rb = ra + max(1, min(rpr, r1 - ra)) - 1;
            } else {
                if (cnt > 0 && f_pos + cnt > n_sb) rb = f_row + 1;
                f_pos += WARP;
                if (f_pos >= n_sb) f_pos -= n_sb, ++f_row;
            }
            if (use_bulk) {
                if (lane == 0) {
                    mvb_fence_reuse();
                    mvr_fetch_bulk<F, MODE != MVR_LONG>(dst, sg, n_sb, u0 + li, cnt, ra, rb, r0, li, bars + 8u * (q & 1));
                }
            } else {
                mvr_fetch16<F, MODE != MVR_LONG>(dst, sg, n_sb, u0 + li, cnt, lane, ra, rb, r0, li);
            }
        } else {  // one matrix per launch (the host checks)
            mvr_fetch<F>(dst, sg.w0, u0 + li, cnt, lane);
        }
    };
    fetch(0);
    fetch(1);
    if (!LATE) PDL_WAIT();  // two rounds of weights are on their way
    PDL_TRIGGER();

    // The activation row, lane-major: quantized here from f32 (after RMSNorm), or transposed
    // from the quantized row, with loads of up to 4 tasks in flight per thread.
    if (xf) {
        mvr_quantize_row<LATE>(acts_t, xf, norm_w, eps, k);
    } else {
        constexpr int NT = 4;
        const int n_tasks = n_sb * 9;
        for (int id0 = threadIdx.x; id0 < n_tasks; id0 += NT * W * WARP) {
            mv_acts_step s[NT];
            bool ok[NT];
#pragma unroll
            for (int i = 0; i < NT; ++i)
                ok[i] = s[i].read<F>(id0 + i * W * WARP, acts, meta_off, bsums_off, k, 0, 1,
                                     0, n_sb, n_sb);
#pragma unroll
            for (int i = 0; i < NT; ++i)
                if (ok[i]) mvr_write_acts<F>(s[i], id0 + i * W * WARP, acts_t);
        }
    }
    __syncthreads();

    const int my_pos = rpr ? lane % n_sb : 0;  // whole-row rounds: this lane's position in its row
    float v = 0.0f;  // long rows: lane l < 8's chain of the current row; lane 8: its min chain
    int c_row = r0, c_pos = 0;  // long rows: the row and position of round q's first super-block
    const int own = min(lane, 8);
    for (int q = 0; q < n_rounds; ++q) {
        if (use_bulk) {
            mvb_wait(bars + 8u * (q & 1), (u32)(q >> 1) & 1u);  // round q has landed
        } else {
            mv_cp_wait<1>();  // this thread's copies of round q have landed
        }
        // Every lane's copies have landed, and every lane is done reading the last round's terms
        // (the chains) before any lane writes this round's.
        __syncwarp();
        const int cnt = min(rs, n_u - q * rs);
        if (lane < cnt) {
            int sbx = my_pos;  // of the super-block's row
            if (MODE == MVR_LONG || (MODE == MVR_ANY && !rpr)) sbx = c_pos + lane < n_sb ? c_pos + lane : c_pos + lane - n_sb;
            const u8* at = acts_t + sbx * MV_ACT_R;
            const u8* buf = (const u8*)(stage + (q & 1) * R::BUF_WORDS);
            if constexpr (R::COPY16) {
                const int off = F::BYTES % 16 ? (int)(((u0 + q * rs) * F::BYTES) & 15) : 0;
                const u8* b = buf + off + lane * F::BYTES;
                float t9[9];
                if constexpr (F::BYTES == 210)
                    mvr_terms_q6_k(b, at, t9);
                else
                    mvr_terms_q45_k<F::BYTES == 176>(b, at, t9);
#pragma unroll
                for (int l = 0; l < L; ++l) tt[lane * T9 + l] = t9[l];
            } else {
                const i64 g = (u0 + q * rs + lane) * F::BYTES;
                const u8* b = buf + lane * R::SW * 4 + (F::BYTES % 4 ? (int)(g & 3) : 0);
                const float da = *(const float*)(at + 272);
                F f;
#pragma unroll
                for (int t = 0; t < 8; ++t) {
                    f.load(b, t);
                    const uint4 x = *(const uint4*)(at + 32 * t), z = *(const uint4*)(at + 32 * t + 16);
                    const u32 a[8] = {x.x, x.y, x.z, x.w, z.x, z.y, z.z, z.w};
                    tt[lane * T9 + t] = __fmul_rn(__fmul_rn(f.d, da), (float)f.lane_sum(a));
                }
                if constexpr (F::MIN) {
                    // Negated: the min chain subtracts (x - y == x + (-y) exactly).
                    const int summ = f.min_sum(*(const uint4*)(at + 256));
                    tt[lane * T9 + 8] = -__fmul_rn(__fmul_rn(f.dmin, da), (float)summ);
                }
            }
        }
        __syncwarp();  // terms visible; this round's buffer free
        fetch(q + 2);
        // The chains, in super-block order (ggml: sums[l] += (d·d_a) · lane_l; sum -= (dmin·d_a)
        // Σ min·bsum), then the row's output: sum (Q4_K / Q5_K's min chain, else 0) + sums[0]
        // + ... + sums[7].
        if (MODE == MVR_WHOLE || (MODE == MVR_ANY && rpr)) {
            const int rows_here = cnt / n_sb;
            for (int c = lane; c < rows_here * L; c += WARP) {
                const int j = c / L, l = c - j * L;
                float* t = tt + j * n_sb * T9 + l;  // the chain's first term; its sum goes there
                float x = 0.0f;
#pragma unroll 4
                for (int s = 0; s < n_sb; ++s) x = __fadd_rn(x, t[s * T9]);
                t[0] = x;
            }
            __syncwarp();
            if (lane < rows_here) {
                const float* t = tt + lane * n_sb * T9;
                float o = F::MIN ? t[8] : 0.0f;
#pragma unroll
                for (int l = 0; l < 8; ++l) o = __fadd_rn(o, t[l]);
                const int row = r0 + q * rpr + lane;
                const int sgi = sg.seg(row), lr = row - sg.first(sgi);
                sg.y(sgi)[lr] = mv_epilogue(o, sg.bias(sgi), residual, lr, lr);
            }
        } else {
            int s = 0;
            while (s < cnt) {  // warp-uniform; at most two segments (n_sb > 32)
                const int seg = min(cnt - s, n_sb - c_pos);
                if (c_pos == 0) v = 0.0f;
                const float* t = tt + s * T9 + own;
                int j = 0;
                for (; j + 4 <= seg; j += 4, t += 4 * T9) {
                    const float x0 = t[0], x1 = t[T9], x2 = t[2 * T9], x3 = t[3 * T9];
                    v = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(v, x0), x1), x2), x3);
                }
                for (; j < seg; ++j, t += T9) v = __fadd_rn(v, *t);
                s += seg;
                c_pos += seg;
                if (c_pos == n_sb) {  // the row's last super-block
                    c_pos = 0;
                    float sums[9];
#pragma unroll
                    for (int l = 0; l < 9; ++l) sums[l] = __shfl_sync(MV_FULL, v, l);
                    if (lane == 0) {
                        float o = F::MIN ? sums[8] : 0.0f;
#pragma unroll
                        for (int l = 0; l < 8; ++l) o = __fadd_rn(o, sums[l]);
                        const int sgi = sg.seg(c_row), lr = c_row - sg.first(sgi);
                        sg.y(sgi)[lr] = mv_epilogue(o, sg.bias(sgi), residual, lr, lr);
                    }
                    ++c_row;
                }
            }
        }
    }
    mv_cp_wait<0>();  // no copy outlives the block
    if (LATE) PDL_WAIT();  // the launch before ends before this one
}

#define MATVEC_Q8_ROWS(name, fmt, W, MODE)                                                       \
    extern "C" __global__ void __launch_bounds__(W * WARP, 16 / W)                               \
        matvec_q8_rows_##name(float* y, const u8* w, const u8* acts, long long meta_off,         \
                              long long bsums_off, int n_out, int k, const float* bias,          \
                              const float* residual, MV_SEG_PARAMS, const float* xf,             \
                              const float* norm_w, float eps, int bulk) {                        \
        PDL_WAITS_INSIDE();                                                                      \
        matvec_q8_rows<fmt, W, MODE>(MV_SEGS(y, w, bias, n_out), acts, meta_off, bsums_off, k,   \
                                     residual, xf, norm_w, eps, bulk);                           \
    }
MATVEC_Q8_ROWS(q3_k, mv_q3_k, 4, MVR_ANY)
MATVEC_Q8_ROWS(q4_k, mv_q4_k, 4, MVR_WHOLE)
MATVEC_Q8_ROWS(q5_k, mv_q5_k, 4, MVR_WHOLE)
MATVEC_Q8_ROWS(q6_k, mv_q6_k, 4, MVR_WHOLE)
MATVEC_Q8_ROWS(q4_k_w6, mv_q4_k, 6, MVR_WHOLE)
MATVEC_Q8_ROWS(q5_k_w6, mv_q5_k, 6, MVR_WHOLE)
MATVEC_Q8_ROWS(q6_k_w6, mv_q6_k, 6, MVR_WHOLE)
MATVEC_Q8_ROWS(q4_k_w8, mv_q4_k, 8, MVR_WHOLE)
MATVEC_Q8_ROWS(q5_k_w8, mv_q5_k, 8, MVR_WHOLE)
MATVEC_Q8_ROWS(q6_k_w8, mv_q6_k, 8, MVR_WHOLE)
// Long rows (7B's down projection: 74 super-blocks; one matrix a launch). Blocks of 6 or 8
// warps: more warps share one transposed activation row, so more fit on an SM.
MATVEC_Q8_ROWS(q4_k_long, mv_q4_k, 4, MVR_LONG)
MATVEC_Q8_ROWS(q5_k_long, mv_q5_k, 4, MVR_LONG)
MATVEC_Q8_ROWS(q6_k_long, mv_q6_k, 4, MVR_LONG)
MATVEC_Q8_ROWS(q4_k_w6_long, mv_q4_k, 6, MVR_LONG)
MATVEC_Q8_ROWS(q5_k_w6_long, mv_q5_k, 6, MVR_LONG)
MATVEC_Q8_ROWS(q6_k_w6_long, mv_q6_k, 6, MVR_LONG)
MATVEC_Q8_ROWS(q4_k_w8_long, mv_q4_k, 8, MVR_LONG)
MATVEC_Q8_ROWS(q5_k_w8_long, mv_q5_k, 8, MVR_LONG)
MATVEC_Q8_ROWS(q6_k_w8_long, mv_q6_k, 8, MVR_LONG)
// The LATE form (four warps, whole-row rounds, the raw row): a second format's matrices after
// the first's launch on the same normalised row (1.5B Q4_K_M: V in Q6_K after Q and K in Q4_K).
#define MATVEC_Q8_ROWS_LATE(name, fmt)                                                           \
    extern "C" __global__ void __launch_bounds__(4 * WARP, 4)                                    \
        matvec_q8_rows_##name##_late(float* y, const u8* w, const u8* acts, long long meta_off,  \
                                     long long bsums_off, int n_out, int k, const float* bias,   \
                                     const float* residual, MV_SEG_PARAMS, const float* xf,      \
                                     const float* norm_w, float eps, int bulk) {                 \
        PDL_WAITS_INSIDE();                                                                      \
        matvec_q8_rows<fmt, 4, MVR_WHOLE, true>(MV_SEGS(y, w, bias, n_out), acts, meta_off,      \
                                                bsums_off, k, residual, xf, norm_w, eps, bulk);  \
    }
MATVEC_Q8_ROWS_LATE(q4_k, mv_q4_k)
MATVEC_Q8_ROWS_LATE(q5_k, mv_q5_k)
MATVEC_Q8_ROWS_LATE(q6_k, mv_q6_k)
// Two formats in one launch (whole-row rounds): the matrices before row r2 (matrices 0 and 1:
// Q and K) in format A on blocks [0, blocks_a), matrix 2 (rows r2 .. n_out: V) in format B on
// the others, each part as its own launch would compute it (1.5B Q4_K_M: V in Q6_K beside Q
// and K in Q4_K, one launch and one link of the step's chain instead of two). Dynamic shared
// memory: the larger of the two parts' layouts.
#define MATVEC_Q8_ROWS_MIXED(name, fa, fb, W)                                                    \
    extern "C" __global__ void __launch_bounds__(W * WARP, 16 / W)                               \
        matvec_q8_rows_mixed_##name(float* y, const u8* w, const u8* acts, long long meta_off,   \
                                    long long bsums_off, int n_out, int k, const float* bias,    \
                                    const float* residual, MV_SEG_PARAMS, const float* xf,       \
                                    const float* norm_w, float eps, int bulk, int blocks_a) {    \
        PDL_WAITS_INSIDE();                                                                      \
        if ((int)blockIdx.x < blocks_a) {                                                        \
            const mv_segs sa{w, w1, nullptr, y, y1, nullptr, bias, b1, nullptr, r1, r2, r2};     \
            matvec_q8_rows<fa, W, MVR_WHOLE>(sa, acts, meta_off, bsums_off, k, residual, xf,     \
                                             norm_w, eps, bulk, 0, blocks_a);                    \
        } else {                                                                                 \
            const int nb = n_out - r2;                                                           \
            const mv_segs sb{w2, nullptr, nullptr, y2, nullptr, nullptr, b2, nullptr, nullptr,   \
                             nb, nb, nb};                                                        \
            matvec_q8_rows<fb, W, MVR_WHOLE>(sb, acts, meta_off, bsums_off, k,                   \
                                             residual ? residual + r2 : nullptr, xf, norm_w,     \
                                             eps, bulk, blocks_a, (int)gridDim.x - blocks_a);    \
        }                                                                                        \
    }
MATVEC_Q8_ROWS_MIXED(q4_k_q6_k, mv_q4_k, mv_q6_k, 6)
MATVEC_Q8_ROWS_MIXED(q5_k_q6_k, mv_q5_k, mv_q6_k, 6)

// ---------------------------------------------------------------------------------------------
// Float weights the way ggml's CPU computes them: the activation rounded to the weight's type
// (F16: half, BF16: bfloat16, F32: as is), each product w·x rounded to f32 and summed in f64.
// The CPU adds the products to one f64 sum in element order; here each lane sums its own
// elements and the warp adds the lane sums. For F16 and BF16 every product is exact in f32 (two
// 11- or 8-bit significands), and an f64 sum of such products is itself exact, so independent
// of order, unless its terms span more than 53 binary orders of magnitude; even then the f64
// results differ in the last bit and the f32 rounding of the final sum hides that except on
// about one output in 2^29. (An order-exact version that evaluated the CPU's chain
// speculatively ran at a tenth of the memory bandwidth.)
//
// One warp per weight row and group of up to MV_COLS activation rows: the row is read once
// with 16-byte loads (when rows are 16-byte aligned) for all of them.

// bfloat16 rounding like ggml's FP32_TO_BF16 (nearest even; NaN stays NaN).
__device__ __forceinline__ float mv_round_bf16(float f) {
    const u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __uint_as_float(((u >> 16) | 0x40u) << 16);
    return __uint_as_float(((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) << 16);
}

template <int T>  // 0: f32, 1: f16, 2: bf16
__device__ __forceinline__ float mv_round_act(float x) {
    if (T == 1) return f16_to_f32(f32_to_f16(x));
    if (T == 2) return mv_round_bf16(x);
    return x;
}

template <int T>
__device__ __forceinline__ float mv_weight_at(const u8* w, i64 i) {
    if (T == 0) return ((const float*)w)[i];
    if (T == 1) return load_f16(w + 2 * i);
    return bf16_to_f32(load_u16(w + 2 * i));
}

// Weight `e` of a 16-byte word.
template <int T>
__device__ __forceinline__ float mv_weight_in(uint4 v, int e) {
    const u32 words[4] = {v.x, v.y, v.z, v.w};
    if (T == 0) return __uint_as_float(words[e]);
    const u16 h = (u16)(words[e / 2] >> (16 * (e % 2)));
    return T == 1 ? f16_to_f32(h) : bf16_to_f32(h);
}

// COLS: activation rows per warp; AHEAD: 16-byte weight loads each lane keeps in flight (the
// general kernels: MV_COLS rows, one ahead; `matvec_float1_f32`, for one row: MVF1_AHEAD).
#ifndef MVF1_AHEAD
#define MVF1_AHEAD 4
#endif
// Thread blocks per SM the staged kernels are compiled for: 5 (at most 51 registers) puts the 576
// blocks of a 4608-row projection (Qwen2.5 7B's Q, K and V) in one wave on 132 SMs.
#ifndef MVF1_MIN_BLOCKS
#define MVF1_MIN_BLOCKS 5
#endif

template <int T, int COLS, int AHEAD>
__device__ void matvec_float(const mv_segs sg, const float* __restrict__ x, int k, int m,
                             const float* __restrict__ residual) {
    constexpr int EB = T == 0 ? 4 : 2;  // bytes per weight
    constexpr int EPW = 16 / EB;        // weights per 16-byte word
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int row = blockIdx.x * MV_WARPS + warp;
    const int m0 = blockIdx.y * COLS;
    if (row >= sg.n_out) return;  // the whole warp
    const int sgi = sg.seg(row), lr = row - sg.first(sgi), rows = sg.rows(sgi);
    const int nc = min(COLS, m - m0);
    const u8* wr = sg.w(sgi) + (i64)lr * k * EB;
    const float* xr = x + (i64)m0 * k;
    double acc[COLS];
#pragma unroll
    for (int j = 0; j < COLS; ++j) acc[j] = 0.0;
    // 16-byte loads of weights and activations need rows aligned to 16 bytes.
    const bool wide = k % EPW == 0 && k % 4 == 0;
    // Each lane keeps AHEAD 16-byte loads of weights in flight, the first ones issued before
    // the wait.
    constexpr int STRIDE = WARP * EPW;  // elements between a lane's consecutive loads
    uint4 ahead[AHEAD];
#pragma unroll
    for (int d = 0; d < AHEAD; ++d) {
        const int e = lane * EPW + d * STRIDE;
        ahead[d] = wide && e < k ? mv_ld_nc16(wr + (i64)e * EB) : make_uint4(0, 0, 0, 0);
    }
    PDL_WAIT();
    PDL_TRIGGER();
    if (wide) {
        for (int base = lane * EPW; base < k; base += AHEAD * STRIDE) {
#pragma unroll
          for (int d = 0; d < AHEAD; ++d) {
            const int e0 = base + d * STRIDE;
            if (e0 >= k) break;
            const uint4 wv = ahead[d];
            if (e0 + AHEAD * STRIDE < k) ahead[d] = mv_ld_nc16(wr + (i64)(e0 + AHEAD * STRIDE) * EB);
            float wf[EPW];
#pragma unroll
            for (int e = 0; e < EPW; ++e) wf[e] = mv_weight_in<T>(wv, e);
#pragma unroll
            for (int j = 0; j < COLS; ++j) {
                if (j >= nc) break;
                const float* xj = xr + (i64)j * k + e0;
#pragma unroll
                for (int v = 0; v < EPW / 4; ++v) {
                    const float4 xv = *(const float4*)(xj + 4 * v);
                    const float xs[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        acc[j] += (double)__fmul_rn(wf[4 * v + e], mv_round_act<T>(xs[e]));
                }
            }
          }
        }
    } else {
        for (int e = lane; e < k; e += WARP) {
            const float we = mv_weight_at<T>(wr, e);
#pragma unroll
            for (int j = 0; j < COLS; ++j) {
                if (j >= nc) break;
                acc[j] += (double)__fmul_rn(we, mv_round_act<T>(xr[(i64)j * k + e]));
            }
        }
    }
#pragma unroll
    for (int j = 0; j < COLS; ++j) {
        if (j >= nc) break;
        const double s = warp_sum_f64(acc[j]);
        if (lane == 0) {
            const i64 at = (i64)(m0 + j) * rows + lr;
            sg.y(sgi)[at] = mv_epilogue(__double2float_rn(s), sg.bias(sgi), residual, at, lr);
        }
    }
}

// The 16-bit value x rounds to for weights of type T (1: F16, 2: BF16), as mv_round_act rounds
// it; `mv_weight_in<T>` reads it back as that float.
template <int T>
__device__ __forceinline__ u32 mvf_round16(float x) {
    if (T == 1) return f32_to_f16(x);
    return __float_as_uint(mv_round_bf16(x)) >> 16;
}

// `matvec_float` for one activation row against F16 / BF16 weights (k % 8 == 0): the block rounds
// the row to the weights' type into shared memory, so the inner loop widens each activation from
// 16 bits instead of rounding it again for every weight row (two conversions per weight, and the
// conversion pipe, which also widens each product to f64, was what held the F16 kernel near
// 3.2 TB/s). The row is staged in pages of MVF_PAGE values, double-buffered: the block stages
// page p + 1 while its warps multiply page p, then meets at a barrier, so no warp waits for the
// whole row before its first product. The same products and the same f64 sums in the same
// order as `matvec_float`. Each lane keeps MVF1_AHEAD 16-byte loads of weights in flight.
#define MVF_PAGE 2048  // activations per page: one 16-byte word (8 values) per thread
template <int T>
__device__ void matvec_float_staged(const mv_segs sg, const float* __restrict__ x, int k,
                                    const float* __restrict__ residual) {
    constexpr int STRIDE = WARP * 8;             // elements between a lane's consecutive loads
    constexpr int PER_PAGE = MVF_PAGE / STRIDE;  // a lane's weight words per page
    static_assert(MVF_PAGE == MV_WARPS * WARP * 8, "one staged word per thread and page");
    static_assert(PER_PAGE % MVF1_AHEAD == 0, "ring slots repeat every page");
    __shared__ uint4 staged[2][MVF_PAGE / 8];  // word i of page p: the rounded x[2048p + 8i ..]
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int row = blockIdx.x * MV_WARPS + warp;
    const bool active = row < sg.n_out;
    const int sgi = active ? sg.seg(row) : 0;
    const int lr = row - sg.first(sgi);
    const u8* wr = sg.w(sgi) + (i64)lr * k * 2;
    uint4 ahead[MVF1_AHEAD];
#pragma unroll
    for (int d = 0; d < MVF1_AHEAD; ++d) {
        const int e = lane * 8 + d * STRIDE;
        ahead[d] = active && e < k ? mv_ld_nc16(wr + (i64)e * 2) : make_uint4(0, 0, 0, 0);
    }
    PDL_WAIT();
    PDL_TRIGGER();
    const int n_pages = (k + MVF_PAGE - 1) / MVF_PAGE;
    auto stage = [&](int p) {
        const int w = p * (MVF_PAGE / 8) + threadIdx.x;  // word of x
        if (w < k / 8) {
            const float4 a = ((const float4*)x)[2 * w], b = ((const float4*)x)[2 * w + 1];
            staged[p & 1][threadIdx.x] =
                make_uint4(mvf_round16<T>(a.x) | mvf_round16<T>(a.y) << 16,
                           mvf_round16<T>(a.z) | mvf_round16<T>(a.w) << 16,
                           mvf_round16<T>(b.x) | mvf_round16<T>(b.y) << 16,
                           mvf_round16<T>(b.z) | mvf_round16<T>(b.w) << 16);
        }
    };
    stage(0);
    __syncthreads();
    double acc = 0.0;
    for (int p = 0; p < n_pages; ++p) {
        // Page p + 1 goes to the buffer page p - 1 used, which every warp has left (barrier).
        if (p + 1 < n_pages) stage(p + 1);
        if (active) {
#pragma unroll
            for (int d = 0; d < PER_PAGE; ++d) {
                const int e0 = p * MVF_PAGE + lane * 8 + d * STRIDE;
                if (e0 >= k) break;
                const uint4 wv = ahead[d % MVF1_AHEAD];
                const int next = e0 + MVF1_AHEAD * STRIDE;
                if (next < k) ahead[d % MVF1_AHEAD] = mv_ld_nc16(wr + (i64)next * 2);
                const uint4 xv = staged[p & 1][lane + d * WARP];
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    acc += (double)__fmul_rn(mv_weight_in<T>(wv, e), mv_weight_in<T>(xv, e));
            }
        }
        __syncthreads();
    }
    if (!active) return;  // the whole warp
    const double sum = warp_sum_f64(acc);
    if (lane == 0) sg.y(sgi)[lr] = mv_epilogue(__double2float_rn(sum), sg.bias(sgi), residual, lr, lr);
}

#define MATVEC_FLOAT(name, t)                                                                    \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP, MV_MIN_BLOCKS)                 \
        matvec_float_##name(float* y, const u8* w, const float* x, int n_out, int k, int m,      \
                            const float* bias, const float* residual, MV_SEG_PARAMS) {           \
        PDL_WAITS_INSIDE();                                                                      \
        matvec_float<t, MV_COLS, 1>(MV_SEGS(y, w, bias, n_out), x, k, m, residual);              \
    }
MATVEC_FLOAT(f32, 0)
MATVEC_FLOAT(f16, 1)
MATVEC_FLOAT(bf16, 2)

// One activation row (m == 1): F32 weights through `matvec_float` with loads ahead, F16 / BF16
// through `matvec_float_staged` (k % 8 == 0).
extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP, MV_MIN_BLOCKS)
    matvec_float1_f32(float* y, const u8* w, const float* x, int n_out, int k, int m,
                      const float* bias, const float* residual, MV_SEG_PARAMS) {
    PDL_WAITS_INSIDE();
    matvec_float<0, 1, MVF1_AHEAD>(MV_SEGS(y, w, bias, n_out), x, k, m, residual);
}
#define MATVEC_FLOAT1(name, t)                                                                   \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP, MVF1_MIN_BLOCKS)               \
        matvec_float1_##name(float* y, const u8* w, const float* x, int n_out, int k, int m,     \
                             const float* bias, const float* residual, MV_SEG_PARAMS) {          \
        PDL_WAITS_INSIDE();                                                                      \
        matvec_float_staged<t>(MV_SEGS(y, w, bias, n_out), x, k, residual);                      \
    }
MATVEC_FLOAT1(f16, 1)
MATVEC_FLOAT1(bf16, 2)

// ---------------------------------------------------------------------------------------------
// One activation row against F16 / BF16 weights on Hopper (sm_90+), the weights streamed into
// shared memory by the copy engine (`cp.async.bulk`, completion counted on an mbarrier) instead
// of by loads into registers. Each warp keeps `stages` copies of `chunk` bytes in flight, so the
// bytes in flight per SM are set by shared memory (16 warps × stages × chunk), not by registers,
// and a warp's copies run on from one of its rows to the next without a pause: a block per SM,
// rows dealt to blocks in even runs and to a block's warps in turn.
//
// The products are `matvec_float_staged`'s (lane l multiplies elements 8l + 256j of its row:
// chunks are whole multiples of 512 bytes except a row's last), summed in f64 in four sums per
// lane, then across the warp: exact sums of exact products, so the same bits (see above).
//
// Dynamic shared memory: the ring (warps × stages × chunk bytes), then x rounded to the weights'
// type (k halves), then warps × stages mbarriers, then (with `balance`) a double per chunk of
// the block's rows.
#define MVB_MAX_WARPS 32  // warps per block: the host picks up to this many
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
// 1: the bulk kernel walks its chunks with cursors instead of dividing by the ring's and the
// row's sizes per chunk (an A/B switch for SYNAPTIX_KERNEL_DEFINES; the same bits).
#ifndef MVB_CURSORS
#define MVB_CURSORS 1
#endif
template <int T>
__device__ void matvec_bulk(const mv_segs sg, const float* __restrict__ x, int k,
                            const float* __restrict__ residual, int stages, int chunk, int pro,
                            const float* __restrict__ x2, const float* __restrict__ nw, float eps,
                            const u16* __restrict__ table, int balance, int f32_sums) {
    extern __shared__ uint4 mvb_smem[];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, n_warps = blockDim.x / WARP;
    const int row_bytes = k * 2;
    u8* ring = (u8*)mvb_smem + (size_t)warp * stages * chunk;
    uint4* x16 = (uint4*)((u8*)mvb_smem + (size_t)n_warps * stages * chunk);
    const u32 bars = (u32)__cvta_generic_to_shared((u8*)x16 + ((k / 8) * 16)) + 8u * warp * stages;
    const u32 ring_s = (u32)__cvta_generic_to_shared(ring);
    // This block's rows [r0, r1). Without `balance`, this warp's rows are r0 + warp, r0 + warp
    // + n_warps, ...; with it, the block's (r1 - r0) per_row chunks are split evenly between its
    // warps in order ([C w / n_warps, C (w + 1) / n_warps)), so a row may span several warps:
    // each warp leaves the sum of its part of a row in shared memory (`parts`, at the part's
    // first chunk) and the block adds a row's parts in order at the end.
    const int G = gridDim.x, n = sg.n_out;
    const int r0 = (int)((i64)blockIdx.x * n / G), r1 = (int)((i64)(blockIdx.x + 1) * n / G);
    const int per_row = (row_bytes + chunk - 1) / chunk;
    const int block_chunks = (r1 - r0) * per_row;
    const int first = balance ? (int)((i64)block_chunks * warp / n_warps) : 0;
    const int my_rows = r1 - r0 > warp ? (r1 - r0 - warp + n_warps - 1) / n_warps : 0;
    const int n_chunks = balance ? (int)((i64)block_chunks * (warp + 1) / n_warps) - first : my_rows * per_row;
    double* parts = (double*)((u8*)x16 + ((k / 8) * 16) + 8 * n_warps * stages);
    // This warp's chunk c: local chunk (row - r0) per_row + (chunk index in the row).
    auto local = [&](int c) { return balance ? first + c : (warp + (c / per_row) * n_warps) * per_row + c % per_row; };
#if MVB_CURSORS
    // Cursors over this warp's chunks (local row from r0, chunk within the row), advanced one
    // chunk at a time: no divisions per chunk. The issuing cursor (lane 0's) runs `stages`
    // chunks ahead of the computing one.
    const int row_step = balance ? 1 : n_warps;
    int issue_row = balance ? first / per_row : warp, issue_in = balance ? first % per_row : 0;
    int issue_slot = 0;
    auto issue_next = [&]() {
        const int row = r0 + issue_row, off = issue_in * chunk;
        const int s = sg.seg(row);
        const u8* src = sg.w(s) + (i64)(row - sg.first(s)) * row_bytes + off;
        mvb_issue(ring_s + issue_slot * chunk, src, (u32)min(chunk, row_bytes - off), bars + 8u * issue_slot);
        if (++issue_in == per_row) issue_in = 0, issue_row += row_step;
        if (++issue_slot == stages) issue_slot = 0;
    };
    if (lane == 0) {
        for (int s = 0; s < stages; ++s) mvb_bar_init(bars + 8u * s);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int c = 0; c < min(stages, n_chunks); ++c) issue_next();
    }
#else
    auto issue = [&](int c) {
        const int lc = local(c);
        const int row = r0 + lc / per_row, off = (lc % per_row) * chunk;
        const int s = sg.seg(row);
        const u8* src = sg.w(s) + (i64)(row - sg.first(s)) * row_bytes + off;
        const int slot = c % stages;
        mvb_issue(ring_s + slot * chunk, src, (u32)min(chunk, row_bytes - off), bars + 8u * slot);
    };
    if (lane == 0) {
        for (int s = 0; s < stages; ++s) mvb_bar_init(bars + 8u * s);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int c = 0; c < min(stages, n_chunks); ++c) issue(c);
    }
#endif
    PDL_WAIT();
    PDL_TRIGGER();
    float scale = 1.0f;
    bool staged = false;  // x16 written already
#if MVB_ONE_LOAD
    // The RMSNorm with one read of each value and of its norm weight, both before the block's
    // sum of squares (thread i: values 8i .. 8i + 7), where every thread has at most one word.
    if (pro == MVB_PRO_NORM && k / 8 <= (int)blockDim.x) {
        const int i = threadIdx.x;
        const bool mine = i < k / 8;
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a, ga = a, gb = a;
        if (mine) {
            a = ((const float4*)x)[2 * i];
            b = ((const float4*)x)[2 * i + 1];
            ga = ((const float4*)nw)[2 * i];
            gb = ((const float4*)nw)[2 * i + 1];
        }
        double ss = (double)__fmul_rn(a.x, a.x) + (double)__fmul_rn(a.y, a.y) + (double)__fmul_rn(a.z, a.z) +
                    (double)__fmul_rn(a.w, a.w);
        ss += (double)__fmul_rn(b.x, b.x) + (double)__fmul_rn(b.y, b.y) + (double)__fmul_rn(b.z, b.z) +
              (double)__fmul_rn(b.w, b.w);
        ss = block_sum_f64(ss);
        scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)(ss / (double)k), eps)));
        if (mine) {
            a = make_float4(__fmul_rn(__fmul_rn(a.x, scale), ga.x), __fmul_rn(__fmul_rn(a.y, scale), ga.y),
                            __fmul_rn(__fmul_rn(a.z, scale), ga.z), __fmul_rn(__fmul_rn(a.w, scale), ga.w));
            b = make_float4(__fmul_rn(__fmul_rn(b.x, scale), gb.x), __fmul_rn(__fmul_rn(b.y, scale), gb.y),
                            __fmul_rn(__fmul_rn(b.z, scale), gb.z), __fmul_rn(__fmul_rn(b.w, scale), gb.w));
            x16[i] = make_uint4(mvf_round16<T>(a.x) | mvf_round16<T>(a.y) << 16,
                                mvf_round16<T>(a.z) | mvf_round16<T>(a.w) << 16,
                                mvf_round16<T>(b.x) | mvf_round16<T>(b.y) << 16,
                                mvf_round16<T>(b.z) | mvf_round16<T>(b.w) << 16);
        }
        staged = true;
    }
#endif
    if (!staged && pro == MVB_PRO_NORM) {
        double ss = 0.0;
        for (int i = threadIdx.x; i < k / 4; i += blockDim.x) {
            const float4 v = ((const float4*)x)[i];
            ss += (double)__fmul_rn(v.x, v.x) + (double)__fmul_rn(v.y, v.y) + (double)__fmul_rn(v.z, v.z) +
                  (double)__fmul_rn(v.w, v.w);
        }
        ss = block_sum_f64(ss);
        scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)(ss / (double)k), eps)));
    }
    for (int i = staged ? k : threadIdx.x; i < k / 8; i += blockDim.x) {
        float4 a = ((const float4*)x)[2 * i], b = ((const float4*)x)[2 * i + 1];
        if (pro != MVB_PRO_NONE) {
            const int e = 8 * i;
            a = make_float4(mvb_pro(pro, a.x, e, k, x2, nw, scale, table), mvb_pro(pro, a.y, e + 1, k, x2, nw, scale, table),
                            mvb_pro(pro, a.z, e + 2, k, x2, nw, scale, table), mvb_pro(pro, a.w, e + 3, k, x2, nw, scale, table));
            b = make_float4(mvb_pro(pro, b.x, e + 4, k, x2, nw, scale, table), mvb_pro(pro, b.y, e + 5, k, x2, nw, scale, table),
                            mvb_pro(pro, b.z, e + 6, k, x2, nw, scale, table), mvb_pro(pro, b.w, e + 7, k, x2, nw, scale, table));
        }
        x16[i] = make_uint4(mvf_round16<T>(a.x) | mvf_round16<T>(a.y) << 16, mvf_round16<T>(a.z) | mvf_round16<T>(a.w) << 16,
                            mvf_round16<T>(b.x) | mvf_round16<T>(b.y) << 16, mvf_round16<T>(b.z) | mvf_round16<T>(b.w) << 16);
    }
    __syncthreads();
    // Four sums per lane (products e, e + 4 of each word into sum e % 4), so that consecutive
    // products do not wait on one another's f64 additions; added pairwise at the row's end.
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    int part_start = local(0);  // the local chunk this warp's current part of a row began at
#if MVB_CURSORS
    int cur_row = balance ? first / per_row : warp, cur_in = balance ? first % per_row : 0;
    int slot = 0;
    u32 parity = 0;
#endif
    for (int c = 0; c < n_chunks; ++c) {
#if MVB_CURSORS
        const int in_row = cur_in, lc = cur_row * per_row + cur_in;
#else
        const int slot = c % stages;
        const int lc = local(c), in_row = lc % per_row;
        const u32 parity = (u32)(c / stages) & 1u;
#endif
        const int off = in_row * chunk, bytes = min(chunk, row_bytes - off);
        if (in_row == 0) part_start = lc;
        mvb_wait(bars + 8u * slot, parity);
        const uint4* words = (const uint4*)(ring + slot * chunk);
        if (f32_sums) {
            // f32 fused multiply-adds, eight sums a lane per chunk, each then added to the f64
            // sums (`SYNAPTIX_BULK_SUMS=f32`: fewer instructions per product, not the CPU's bits).
            float fa[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll 2
            for (int wi = lane; wi < bytes / 16; wi += WARP) {
                const uint4 wv = words[wi], xv = x16[off / 16 + wi];
#pragma unroll
                for (int e = 0; e < 8; ++e) fa[e] = __fmaf_rn(mv_weight_in<T>(wv, e), mv_weight_in<T>(xv, e), fa[e]);
            }
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[e % 4] += (double)fa[e];
        } else {
            // Every product (exact in f32) added in f64, as the CPU adds them (the default): the
            // tests' outputs are the CPU's bits.
#pragma unroll 2
            for (int wi = lane; wi < bytes / 16; wi += WARP) {
                const uint4 wv = words[wi], xv = x16[off / 16 + wi];
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[e % 4] += (double)__fmul_rn(mv_weight_in<T>(wv, e), mv_weight_in<T>(xv, e));
            }
        }
        __syncwarp();
        if (lane == 0 && c + stages < n_chunks) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // our reads, then the copy's writes
#if MVB_CURSORS
            issue_next();
#else
            issue(c + stages);
#endif
        }
        if (in_row == per_row - 1 || (balance && c == n_chunks - 1)) {
#if MVB_CURSORS
            const int row = r0 + cur_row;
#else
            const int row = r0 + lc / per_row;
#endif
            const int s = sg.seg(row), lr = row - sg.first(s);
            const double sum = warp_sum_f64((acc[0] + acc[1]) + (acc[2] + acc[3]));
            if (lane == 0) {
                if (balance)
                    parts[part_start] = sum;
                else
                    sg.y(s)[lr] = mv_epilogue(__double2float_rn(sum), sg.bias(s), residual, lr, lr);
            }
#pragma unroll
            for (int a = 0; a < 4; ++a) acc[a] = 0.0;
        }
#if MVB_CURSORS
        if (++cur_in == per_row) cur_in = 0, cur_row += row_step;
        if (++slot == stages) slot = 0, parity ^= 1u;
#endif
    }
    if (!balance) return;
    __syncthreads();  // every part is in `parts`
    // Row r's parts begin at its first chunk and at every warp boundary inside it: local chunk
    // j > 0 is a boundary when C w / n_warps == j for w = ceil(j n_warps / C).
    for (int i = threadIdx.x; i < r1 - r0; i += blockDim.x) {
        double sum = parts[i * per_row];
        for (int j = i * per_row + 1; j < (i + 1) * per_row; ++j) {
            const int w = (int)(((i64)j * n_warps + block_chunks - 1) / block_chunks);
            if ((int)((i64)block_chunks * w / n_warps) == j) sum += parts[j];
        }
        const int row = r0 + i, s = sg.seg(row), lr = row - sg.first(s);
        sg.y(s)[lr] = mv_epilogue(__double2float_rn(sum), sg.bias(s), residual, lr, lr);
    }
}
#endif

#define MATVEC_BULK(name, t)                                                                     \
    extern "C" __global__ void __launch_bounds__(MVB_MAX_WARPS * WARP, 1)                        \
        matvec_bulk_##name(float* y, const u8* w, const float* x, int n_out, int k, int stages,  \
                           int chunk, const float* bias, const float* residual, MV_SEG_PARAMS,   \
                           int pro, const float* x2, const float* nw, float eps,                 \
                           const u16* table, int balance, int f32_sums) {                        \
        PDL_WAITS_INSIDE();                                                                      \
        MVB_BODY(t)                                                                              \
    }
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define MVB_BODY(t)                                                                              \
    matvec_bulk<t>(MV_SEGS(y, w, bias, n_out), x, k, residual, stages, chunk, pro, x2, nw, eps,  \
                   table, balance, f32_sums);
#else
#define MVB_BODY(t) PDL_WAIT(); // sm_80: never launched (the host takes matvec_float1)
#endif
MATVEC_BULK(f16, 1)
MATVEC_BULK(bf16, 2)

// ---------------------------------------------------------------------------------------------
// One activation row against Q8_0 weights on Hopper (sm_90+), from a copy of the matrix in a
// split layout made when it is uploaded (`q8_0_split`). Each row is cut into groups of 16
// blocks; a group of n blocks holds their first 16 quants (int8, 16 bytes a block, in block
// order), then their last 16 quants, then their scales (f16 bits) padded to 16 bytes: 544
// bytes for a whole group, the same as 16 stored blocks; a row's last group holds the r < 16
// blocks left over. The same numbers as the stored blocks, arranged so that the weights stream
// into shared memory by bulk copies (as `matvec_bulk` streams F16 rows: rings of `stages`
// copies of `chunk` bytes per warp, `chunk` a multiple of 544) and a block's two halves are
// 16-byte words that 16 lanes read without bank conflicts. The activation row goes to shared
// memory in the same arrangement.
//
// The arithmetic is `matvec_q8`'s for Q8_0: the activation row quantized to Q8_0 (quantize.cu;
// with `x`, the block normalises the raw row x with weight `nw` and quantizes it itself),
// exact integer sums per block (dp4a), the term sumi * (d_w * d_a), and one f32 sum per row
// adding the terms in block order: the CPU's bits. A warp computes all the terms of a chunk at
// once (lane l takes block l % 16 of group 2i + l / 16; a group's 16 slots, zeros past a
// partial group's blocks: adding +0 to a sum that started at +0 never changes it, as it cannot
// become -0), then lane 0 adds them to the row's sum with 16-byte reads.
//
// Rows are dealt to the block's warps in turn. (Splitting a block's copies evenly between its
// warps, rows spanning warps and their sums continued at the block's end, measured slower on
// 3584×18944: 2,631 against 3,100 GB/s.)
//
// Dynamic shared memory: the ring (warps × stages × chunk bytes), the activation quants (k
// bytes), their scales as f32 (k / 32, padded to 16 bytes), warps × stages mbarriers, a chunk's
// terms per warp (chunk / 544 rounded up to even, × 16).
#define Q8S_GROUP_BLOCKS 16
// 1: copies of whole groups only take a loop without the partial groups' bounds (an A/B switch
// for SYNAPTIX_KERNEL_DEFINES; the same terms).
#ifndef Q8S_WHOLE_PAIRS
#define Q8S_WHOLE_PAIRS 1
#endif
// 1: launches with one copy a warp (the default ring) take a form of the kernel compiled for
// it; 0: every launch takes the general form (an A/B switch for SYNAPTIX_KERNEL_DEFINES).
#ifndef Q8S_FIXED
#define Q8S_FIXED 1
#endif
// Launches with the default ring and rows of at most this many values take `matvec_q8p`
// (several rows' sums in flight a warp), longer rows `matvec_q8s`; 0: never `matvec_q8p` (an
// A/B switch for SYNAPTIX_KERNEL_DEFINES; the same bits either way). On the H200 (cold GB/s,
// `matvec_q8s` → `matvec_q8p`): 151936×896 2,873 → 3,689 and 17920×1536 2,657 → 2,728, but
// 37888×3584 3,839 → 3,757 and 152064×3584 4,147 → 4,075; tg128 0.5B Q8_0 (its head)
// 1,362.5 → 1,385.3, 1.5B Q8_0 807.6 / 808.7 → 806.6 / 806.7, 7B 347.6 / 347.3 → 341.7 / 341.6.
#ifndef Q8S_PIECES
#define Q8S_PIECES 1024
#endif
// 1: the split-copy kernels' RMSNorm prologue reads each value once (up to this many rounds of
// 32-value blocks a warp); 0: twice, the second time after the sum of squares.
#ifndef Q8S_ONE_LOAD
#define Q8S_ONE_LOAD 1
#endif
#define Q8S_ONE_LOAD_ROUNDS 8
// 1: `matvec_q8s_quad` (the host's pick for raw rows of 2049 to 4096 values: 7B's Q/K/V and
// gate/up) normalises and quantizes the row in one round, eight threads a block
// (`quantize_q8_32_quad`); 0: that kernel takes Q8S_ONE_LOAD's rounds too. The one-round code
// lives in a kernel of its own because its presence in `matvec_q8s_bulk` slowed launches that
// never take it (1.5B Q8_0 817 → 771 t/s, its down projection); the host also sends the
// quantized rows that ran faster in it (7B's O and down) to this kernel (ops.rs).
#ifndef Q8S_QUAD
#define Q8S_QUAD 1
#endif
#define Q8S_GROUP_BYTES 544
__device__ __forceinline__ int q8s_row_bytes(int k) {
    const int nb = k / 32, r = nb % Q8S_GROUP_BLOCKS;
    return nb / Q8S_GROUP_BLOCKS * Q8S_GROUP_BYTES + (r ? 32 * r + ((2 * r + 15) & ~15) : 0);
}

// Stored Q8_0 rows [rows, k] (34-byte blocks) to the split layout above, one thread per block.
// `out` is zeroed by the host (the scales' padding stays zero).
extern "C" __global__ void q8_0_split(u8* __restrict__ out, const u8* __restrict__ in, int rows, int k) {
    PDL_WAIT();
    PDL_TRIGGER();
    const int nb = k / 32;
    const i64 b = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= (i64)rows * nb) return;
    const int row = (int)(b / nb), j = (int)(b % nb);
    const int g = j / Q8S_GROUP_BLOCKS, jj = j % Q8S_GROUP_BLOCKS;
    const int nbg = min(Q8S_GROUP_BLOCKS, nb - g * Q8S_GROUP_BLOCKS);
    const u8* src = in + b * 34;  // 2-byte aligned
    u8* grp = out + (i64)row * q8s_row_bytes(k) + (i64)g * Q8S_GROUP_BYTES;
    u16* lo = (u16*)(grp + 16 * jj);
    u16* hi = (u16*)(grp + 16 * nbg + 16 * jj);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        lo[i] = load_u16(src + 2 + 2 * i);
        hi[i] = load_u16(src + 18 + 2 * i);
    }
    *(u16*)(grp + 32 * nbg + 2 * jj) = load_u16(src);
}

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
// The activation row of `matvec_q8s` / `matvec_q8p` into shared memory in the split layout:
// quants at `aq` (k bytes: each group of 16 blocks as its blocks' first halves, then their second
// halves), scales at `ad` as f32. With `x`, the block normalises the raw row x with weight `nw`
// (`matvec_bulk`'s RMSNorm prologue: rms_norm_f32's operations) and quantizes it to Q8_0 a block
// at a time (quantize.cu's arithmetic), d as the f16 the CPU stores; otherwise it rearranges the
// quantized row `acts` (Q8_0 metadata at `meta`: half bits of d first). Every thread of the block
// calls it; the caller synchronises the block before reading.
template <bool QUAD>
__device__ __forceinline__ void q8s_acts_to_shared(u8* aq, float* ad, const u8* __restrict__ acts, i64 meta, int k,
                                                   const float* __restrict__ x, const float* __restrict__ nw,
                                                   float eps) {
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, n_warps = blockDim.x / WARP;
    const int nb = k / 32;
    // QUAD (`matvec_q8s_quad`), rows of at most four values a thread: thread t normalises values
    // 4t .. 4t + 3 and quantizes them with the seven other threads of their block (one round
    // instead of a block a warp in up to four rounds, each a chain of shuffles and divisions).
    if (QUAD && x && k / 4 <= (int)blockDim.x) {
        const int t = threadIdx.x;
        const bool in = t < k / 4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f), g = v;
        if (in) {
            v = ((const float4*)x)[t];
            g = ((const float4*)nw)[t];
        }
        double ss = (double)__fmul_rn(v.x, v.x) + (double)__fmul_rn(v.y, v.y) + (double)__fmul_rn(v.z, v.z) +
                    (double)__fmul_rn(v.w, v.w);
        ss = block_sum_f64(ss);
        const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)(ss / (double)k), eps)));
        const float4 u = make_float4(__fmul_rn(__fmul_rn(v.x, scale), g.x), __fmul_rn(__fmul_rn(v.y, scale), g.y),
                                     __fmul_rn(__fmul_rn(v.z, scale), g.z), __fmul_rn(__fmul_rn(v.w, scale), g.w));
        // Warps wholly past the row skip the quantization (its divisions of zeros would take the
        // slow path and hold the block's barrier); a warp partly inside runs it on every lane.
        if (warp * WARP < k / 4) {
            float d;
            const u32 word = quantize_q8_32_quad(u, d);  // every lane: shuffles
            if (in) {
                const int bb = t / 8, part = t % 8;
                const int gi = bb / Q8S_GROUP_BLOCKS, nbg = min(Q8S_GROUP_BLOCKS, nb - gi * Q8S_GROUP_BLOCKS);
                *(u32*)(aq + gi * 512 + (part / 4) * nbg * 16 + (bb % Q8S_GROUP_BLOCKS) * 16 + (part % 4) * 4) =
                    word;
                if (part == 0) ad[bb] = f16_to_f32(q8_f32_to_f16(d));
            }
        }
        return;
    }
#if Q8S_ONE_LOAD
    // Each lane reads the values it quantizes (block warp + r·n_warps, value `lane`) and their
    // norm weights once, before the block's sum of squares, instead of again after it (one L2
    // round trip a round on the path).
    if (x && nb <= Q8S_ONE_LOAD_ROUNDS * n_warps) {
        float xv[Q8S_ONE_LOAD_ROUNDS], wv[Q8S_ONE_LOAD_ROUNDS];
        double ss = 0.0;
#pragma unroll
        for (int r = 0; r < Q8S_ONE_LOAD_ROUNDS; ++r) {
            const int bb = warp + r * n_warps;
            xv[r] = bb < nb ? x[bb * 32 + lane] : 0.0f;
            wv[r] = bb < nb ? nw[bb * 32 + lane] : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < Q8S_ONE_LOAD_ROUNDS; ++r) ss += (double)__fmul_rn(xv[r], xv[r]);
        ss = block_sum_f64(ss);
        const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)(ss / (double)k), eps)));
#pragma unroll
        for (int r = 0; r < Q8S_ONE_LOAD_ROUNDS; ++r) {
            const int bb = warp + r * n_warps;
            if (bb >= nb) break;  // warp-uniform
            float d;
            const i8 q = quantize_q8_32_lane(__fmul_rn(__fmul_rn(xv[r], scale), wv[r]), d);
            const int gi = bb / Q8S_GROUP_BLOCKS, nbg = min(Q8S_GROUP_BLOCKS, nb - gi * Q8S_GROUP_BLOCKS);
            aq[gi * 512 + (lane / 16) * nbg * 16 + (bb % Q8S_GROUP_BLOCKS) * 16 + lane % 16] = (u8)q;
            if (lane == 0) ad[bb] = f16_to_f32(q8_f32_to_f16(d));
        }
        return;
    }
#endif
    if (x) {
        double ss = 0.0;
        for (int i = threadIdx.x; i < k / 4; i += blockDim.x) {
            const float4 v = ((const float4*)x)[i];
            ss += (double)__fmul_rn(v.x, v.x) + (double)__fmul_rn(v.y, v.y) + (double)__fmul_rn(v.z, v.z) +
                  (double)__fmul_rn(v.w, v.w);
        }
        ss = block_sum_f64(ss);
        const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)(ss / (double)k), eps)));
        for (int bb = warp; bb < nb; bb += n_warps) {
            const int e = bb * 32 + lane;
            float d;
            const i8 q = quantize_q8_32_lane(__fmul_rn(__fmul_rn(x[e], scale), nw[e]), d);
            const int gi = bb / Q8S_GROUP_BLOCKS, nbg = min(Q8S_GROUP_BLOCKS, nb - gi * Q8S_GROUP_BLOCKS);
            aq[gi * 512 + (lane / 16) * nbg * 16 + (bb % Q8S_GROUP_BLOCKS) * 16 + lane % 16] = (u8)q;
            if (lane == 0) ad[bb] = f16_to_f32(q8_f32_to_f16(d));
        }
    } else {
        for (int u = threadIdx.x; u < k / 16; u += blockDim.x) {
            const int gi = u / 32, b = (u % 32) / 2, h = u % 2;
            const int nbg = min(Q8S_GROUP_BLOCKS, nb - gi * Q8S_GROUP_BLOCKS);
            ((uint4*)aq)[gi * 32 + h * nbg + b] = ((const uint4*)acts)[u];
        }
        for (int i = threadIdx.x; i < nb; i += blockDim.x) ad[i] = f16_to_f32(load_u16(acts + meta + 8 * (i64)i));
    }
}

// ST > 0: the ring's copies a warp (`stages`) fixed at compile time (no divisions by it per
// copy); 0: read from `stages_arg`.
// PICK: also the index of the largest output (lowest on ties, NaN never: `argmax_blocks_f32`'s
// pick) into pick[0], as `matvec_q8p` does.
// QUAD: the activation row's one-round prologue (`q8s_acts_to_shared`).
template <int ST, bool PICK = false, bool QUAD = false>
__device__ void matvec_q8s(const mv_segs sg, const u8* __restrict__ acts, i64 meta, int k,
                           const float* __restrict__ residual, int stages_arg, int chunk,
                           const float* __restrict__ x, const float* __restrict__ nw, float eps,
                           i32* pick = nullptr, float* partial_v = nullptr, int* partial_i = nullptr,
                           unsigned int* done = nullptr) {
    extern __shared__ uint4 mvb_smem[];
#if defined(KTRACE)
    const unsigned long long kt0 = ktrace_now();
    unsigned long long kt1 = 0, kt2 = 0;
#endif
    const int stages = ST > 0 ? ST : stages_arg;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, n_warps = blockDim.x / WARP;
    const int nb = k / 32, row_bytes = q8s_row_bytes(k);
    u8* ring = (u8*)mvb_smem + (size_t)warp * stages * chunk;
    u8* aq = (u8*)mvb_smem + (size_t)n_warps * stages * chunk;
    float* ad = (float*)(aq + k);
    u8* tail = aq + k + ((nb * 4 + 15) & ~15);
    const u32 bars = (u32)__cvta_generic_to_shared(tail) + 8u * warp * stages;
    // Term slots: groups are taken in pairs, so an odd count writes one group of zeros more.
    const int chunk_groups = chunk / Q8S_GROUP_BYTES;
    const int chunk_terms = (chunk_groups + 1) / 2 * 2 * Q8S_GROUP_BLOCKS;
    float* terms = (float*)(tail + 8 * n_warps * stages);
    float* my_terms = terms + warp * chunk_terms;
    const u32 ring_s = (u32)__cvta_generic_to_shared(ring);
    const int G = gridDim.x, n = sg.n_out;
    const int r0 = (int)((i64)blockIdx.x * n / G), r1 = (int)((i64)(blockIdx.x + 1) * n / G);
    const int per_row = (row_bytes + chunk - 1) / chunk;
    const int my_rows = r1 - r0 > warp ? (r1 - r0 - warp + n_warps - 1) / n_warps : 0;
    const int n_chunks = my_rows * per_row;
    // A cursor over this warp's chunks: local row (from r0) and chunk within the row.
    int issue_row = warp, issue_in = 0;
    auto issue_next = [&](int c) {
        const int row = r0 + issue_row, off = issue_in * chunk;
        const int s = sg.seg(row);
        const u8* src = sg.w(s) + (i64)(row - sg.first(s)) * row_bytes + off;
        const int slot = c % stages;
        mvb_issue<Q8S_EVICT_FIRST>(ring_s + slot * chunk, src, (u32)min(chunk, row_bytes - off), bars + 8u * slot);
        if (++issue_in == per_row) {
            issue_in = 0;
            issue_row += n_warps;
        }
    };
    if (lane == 0) {
        for (int s = 0; s < stages; ++s) mvb_bar_init(bars + 8u * s);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int c = 0; c < min(stages, n_chunks); ++c) issue_next(c);
    }
    PDL_WAIT();
    PDL_TRIGGER();
#if defined(KTRACE)
    kt1 = ktrace_now();
#endif
    q8s_acts_to_shared<QUAD>(aq, ad, acts, meta, k, x, nw, eps);
    __syncthreads();
#if defined(KTRACE)
    kt2 = ktrace_now();
#endif
    float acc = 0.0f;  // lane 0: the current row's sum
    float best_v = -INFINITY;  // PICK: lane 0's first largest output and its row
    int best_i = 0x7fffffff;
    int row = warp, in_row = 0;
    const int half = lane >> 4, b = lane & 15;
    for (int c = 0; c < n_chunks; ++c) {
        const int slot = c % stages;
        const int off = in_row * chunk, bytes = min(chunk, row_bytes - off);
        if (in_row == 0) acc = 0.0f;
        mvb_wait(bars + 8u * slot, (u32)(c / stages) & 1u);
        const u8* buf = ring + slot * chunk;
        const int n_groups = (bytes + Q8S_GROUP_BYTES - 1) / Q8S_GROUP_BYTES;
        const int g_first = in_row * chunk_groups;  // the chunk's first group in the row
#if Q8S_WHOLE_PAIRS
        if ((g_first + n_groups) * Q8S_GROUP_BLOCKS <= nb) {
            // Whole groups only (all but a row's partial last group): lane b of half h takes block
            // b of group j + h. Of an odd count, the second half recomputes group j's term for
            // the missing group's slot, which the sum never reads.
#pragma unroll 2
            for (int j = 0; j < n_groups; j += 2) {
                const int g = j + (j + half < n_groups ? half : 0);
                const u8* grp = buf + g * Q8S_GROUP_BYTES;
                const u8* ag = aq + (g_first + g) * 512 + 16 * b;
                const uint4 w0 = *(const uint4*)(grp + 16 * b), w1 = *(const uint4*)(grp + 256 + 16 * b);
                const uint4 a0 = *(const uint4*)ag, a1 = *(const uint4*)(ag + 256);
                int s0 = mv_dp4a(w0.x, a0.x, 0), s1 = mv_dp4a(w1.x, a1.x, 0);
                s0 = mv_dp4a(w0.y, a0.y, s0);
                s1 = mv_dp4a(w1.y, a1.y, s1);
                s0 = mv_dp4a(w0.z, a0.z, s0);
                s1 = mv_dp4a(w1.z, a1.z, s1);
                s0 = mv_dp4a(w0.w, a0.w, s0);
                s1 = mv_dp4a(w1.w, a1.w, s1);
                const float dw = f16_to_f32(load_u16(grp + 512 + 2 * b));
                my_terms[j * Q8S_GROUP_BLOCKS + lane] =
                    __fmul_rn((float)(s0 + s1), __fmul_rn(dw, ad[(g_first + g) * Q8S_GROUP_BLOCKS + b]));
            }
        } else
#endif
#pragma unroll 2
        for (int j = 0; j < n_groups; j += 2) {
            const int jj = j + half, gi = g_first + jj;
            const int nbg = min(Q8S_GROUP_BLOCKS, nb - gi * Q8S_GROUP_BLOCKS);
            const bool valid = jj < n_groups && b < nbg;
            // Invalid lanes read block 0 of group j (inside the chunk) and store a zero.
            const int vj = valid ? jj : j, vb = valid ? b : 0, vn = valid ? nbg : min(Q8S_GROUP_BLOCKS, nb - (g_first + j) * Q8S_GROUP_BLOCKS);
            const u8* grp = buf + vj * Q8S_GROUP_BYTES;
            const uint4 w0 = *(const uint4*)(grp + 16 * vb), w1 = *(const uint4*)(grp + 16 * (vn + vb));
            const u8* ag = aq + (g_first + vj) * 512;
            const uint4 a0 = *(const uint4*)(ag + 16 * vb), a1 = *(const uint4*)(ag + 16 * (vn + vb));
            int s0 = mv_dp4a(w0.x, a0.x, 0), s1 = mv_dp4a(w1.x, a1.x, 0);
            s0 = mv_dp4a(w0.y, a0.y, s0);
            s1 = mv_dp4a(w1.y, a1.y, s1);
            s0 = mv_dp4a(w0.z, a0.z, s0);
            s1 = mv_dp4a(w1.z, a1.z, s1);
            s0 = mv_dp4a(w0.w, a0.w, s0);
            s1 = mv_dp4a(w1.w, a1.w, s1);
            const float dw = f16_to_f32(load_u16(grp + 32 * vn + 2 * vb));
            const float t = __fmul_rn((float)(s0 + s1), __fmul_rn(dw, ad[(g_first + vj) * Q8S_GROUP_BLOCKS + vb]));
            my_terms[j * Q8S_GROUP_BLOCKS + lane] = valid ? t : 0.0f;
        }
        const int n_terms = n_groups * Q8S_GROUP_BLOCKS;
        __syncwarp();
        if (lane == 0 && c + stages < n_chunks) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // our reads, then the copy's writes
            issue_next(c + stages);
        }
        if (lane == 0) {
            const float4* t4 = (const float4*)my_terms;
#pragma unroll 4
            for (int i = 0; i < n_terms / 4; ++i) {
                const float4 t = t4[i];
                acc = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(acc, t.x), t.y), t.z), t.w);
            }
        }
        if (lane == 0 && in_row == per_row - 1) {
            const int grow = r0 + row, sgi = sg.seg(grow), lr = grow - sg.first(sgi);
            const float out = mv_epilogue(acc, sg.bias(sgi), residual, lr, lr);
            sg.y(sgi)[lr] = out;
            if constexpr (PICK) argmax_take(best_v, best_i, out, grow);
        }
        __syncwarp();  // lane 0 has read the terms before they are rewritten
        if (++in_row == per_row) {
            in_row = 0;
            row += n_warps;
        }
    }
    if constexpr (PICK) argmax_blocks_end(best_v, best_i, pick, partial_v, partial_i, done);
#if defined(KTRACE)
    const unsigned long long kt_warp = ktrace_now();
    __shared__ unsigned long long kt_first, kt_last;
    if (threadIdx.x == 0) kt_first = ~0ull, kt_last = 0;
    __syncthreads();
    if (lane == 0) atomicMin(&kt_first, kt_warp), atomicMax(&kt_last, kt_warp);
    __syncthreads();
    if (threadIdx.x == 0)
        printf("KT q8s %d %d %d %d %llu %llu %llu %llu %llu\n", n, k, (int)blockIdx.x, (int)PICK, kt0, kt1, kt2,
               kt_first, kt_last);
#endif
}

// The split-copy kernel for its default ring (one copy of four 544-byte slots a warp), with
// several rows' sums in flight: a warp takes its rows (as `matvec_q8s` deals them) in sets of up
// to Q8P_PIECES, and streams a set of m rows as m × n_groups pieces, piece p being group p / m
// of the set's row p % m (so each row's groups come in order), Q8P_PIECES pieces a copy (lanes 0
// .. 3 each copy one piece into its slot; a copy never crosses sets). The terms are
// `matvec_q8s`'s; then lane s < m adds the copy's pieces of row s to that row's sum, in group
// order: the CPU's bits, with the serial sum of a copy's 64 terms shared by up to four lanes
// instead of one (the kernel is issue-bound: eighteenth pass).
#define Q8P_PIECES 4
// floor(p / m) for m in 1 .. 4 and 0 <= p < 65536.
__device__ __forceinline__ int q8p_div(int p, int m) { return m == 3 ? (p * 43691) >> 17 : p >> (m >> 1); }

// PICK: also the index of the largest output (lowest on ties, NaN never: `argmax_blocks_f32`'s
// pick) into pick[0], through partial_v / partial_i [gridDim.x] and the counter `done`.
template <bool PICK>
__device__ void matvec_q8p(const mv_segs sg, const u8* __restrict__ acts, i64 meta, int k,
                           const float* __restrict__ residual, const float* __restrict__ x,
                           const float* __restrict__ nw, float eps, i32* pick = nullptr,
                           float* partial_v = nullptr, int* partial_i = nullptr,
                           unsigned int* done = nullptr) {
    extern __shared__ uint4 mvb_smem[];
    constexpr int P = Q8P_PIECES, CHUNK = P * Q8S_GROUP_BYTES;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, n_warps = blockDim.x / WARP;
    const int nb = k / 32, row_bytes = q8s_row_bytes(k);
    const int n_groups = (nb + Q8S_GROUP_BLOCKS - 1) / Q8S_GROUP_BLOCKS;
    const int last_nbg = nb - (n_groups - 1) * Q8S_GROUP_BLOCKS;  // blocks of a row's last group
    const u32 last_bytes = (u32)(row_bytes - (n_groups - 1) * Q8S_GROUP_BYTES);
    // `matvec_q8s`'s shared memory with one copy of four groups a warp.
    u8* ring = (u8*)mvb_smem + (size_t)warp * CHUNK;
    u8* aq = (u8*)mvb_smem + (size_t)n_warps * CHUNK;
    float* ad = (float*)(aq + k);
    u8* tail = aq + k + ((nb * 4 + 15) & ~15);
    const u32 bar = (u32)__cvta_generic_to_shared(tail) + 8u * warp;
    float* my_terms = (float*)(tail + 8 * n_warps) + warp * P * Q8S_GROUP_BLOCKS;
    const u32 ring_s = (u32)__cvta_generic_to_shared(ring);
    const int G = gridDim.x, n = sg.n_out;
    const int r0 = (int)((i64)blockIdx.x * n / G), r1 = (int)((i64)(blockIdx.x + 1) * n / G);
    const int my_rows = r1 - r0 > warp ? (r1 - r0 - warp + n_warps - 1) / n_warps : 0;
    // The next copy to issue: its set's first row (of the warp's) and its index in the set.
    int next_first = 0, next_in = 0;
    // Every lane calls it: lane q < P copies piece q of the next copy, lane 0 arms the barrier
    // with the copy's bytes.
    auto issue_next = [&]() {
        const int m = min(P, my_rows - next_first), p = next_in * P + lane;
        u32 bytes = 0;
        const u8* src = nullptr;
        if (lane < P && p < m * n_groups) {
            const int g = q8p_div(p, m), row = r0 + warp + (next_first + p - g * m) * n_warps;
            const int s = sg.seg(row);
            src = sg.w(s) + (i64)(row - sg.first(s)) * row_bytes + (i64)g * Q8S_GROUP_BYTES;
            bytes = g == n_groups - 1 ? last_bytes : (u32)Q8S_GROUP_BYTES;
        }
        const u32 total = __reduce_add_sync(0xffffffffu, bytes);
        if (lane == 0) mvb_expect(bar, total);
        __syncwarp();
        if (bytes) mvb_copy<Q8S_EVICT_FIRST>(ring_s + lane * Q8S_GROUP_BYTES, src, bytes, bar);
        if (++next_in == (m * n_groups + P - 1) / P) {
            next_in = 0;
            next_first += P;
        }
    };
    if (lane == 0) {
        mvb_bar_init(bar);
        mvb_fence_init();
    }
    __syncwarp();
    if (my_rows > 0) issue_next();
    PDL_WAIT();
    PDL_TRIGGER();
    q8s_acts_to_shared<false>(aq, ad, acts, meta, k, x, nw, eps);
    __syncthreads();
    float acc = 0.0f;  // lane s < m: the sum of the set's row s
    float best_v = -INFINITY;  // PICK: this lane's first largest output and its row
    int best_i = 0x7fffffff;
    const int half = lane >> 4, b = lane & 15;
    u32 phase = 0;
    for (int first = 0; first < my_rows; first += P) {
        const int m = min(P, my_rows - first), n_pieces = m * n_groups;
        acc = 0.0f;
        for (int p0 = 0; p0 < n_pieces; p0 += P) {
            mvb_wait(bar, phase);
            phase ^= 1u;
            // Lane b of half h: block b of piece 2t + h. A slot past the set's pieces, or a
            // block past its group's, recomputes block 0 of piece 0 and stores a zero.
#pragma unroll
            for (int t = 0; t < P / 2; ++t) {
                const int q = 2 * t + half, p = p0 + q;
                const int g = q8p_div(p, m), nbg = g == n_groups - 1 ? last_nbg : Q8S_GROUP_BLOCKS;
                const bool valid = p < n_pieces && b < nbg;
                const int vq = valid ? q : 0, vb = valid ? b : 0;
                const int vg = valid ? g : q8p_div(p0, m);
                const int vn = vg == n_groups - 1 ? last_nbg : Q8S_GROUP_BLOCKS;
                const u8* grp = ring + vq * Q8S_GROUP_BYTES;
                const u8* ag = aq + vg * 512 + 16 * vb;
                const uint4 w0 = *(const uint4*)(grp + 16 * vb), w1 = *(const uint4*)(grp + 16 * (vn + vb));
                const uint4 a0 = *(const uint4*)ag, a1 = *(const uint4*)(ag + 16 * vn);
                int s0 = mv_dp4a(w0.x, a0.x, 0), s1 = mv_dp4a(w1.x, a1.x, 0);
                s0 = mv_dp4a(w0.y, a0.y, s0);
                s1 = mv_dp4a(w1.y, a1.y, s1);
                s0 = mv_dp4a(w0.z, a0.z, s0);
                s1 = mv_dp4a(w1.z, a1.z, s1);
                s0 = mv_dp4a(w0.w, a0.w, s0);
                s1 = mv_dp4a(w1.w, a1.w, s1);
                const float dw = f16_to_f32(load_u16(grp + 32 * vn + 2 * vb));
                const float term = __fmul_rn((float)(s0 + s1), __fmul_rn(dw, ad[vg * Q8S_GROUP_BLOCKS + vb]));
                my_terms[q * Q8S_GROUP_BLOCKS + b] = valid ? term : 0.0f;
            }
            __syncwarp();
            if (next_first < my_rows) {
                if (lane < P) mvb_fence_reuse();  // our reads, then the copy's writes
                issue_next();
            }
            // Lane s adds its row's pieces of this copy: slots q with (p0 + q) % m == s.
            if (lane < m) {
                const int s0 = p0 - q8p_div(p0, m) * m;
                const int n_here = min(P, n_pieces - p0);
                for (int q = lane >= s0 ? lane - s0 : lane - s0 + m; q < n_here; q += m) {
                    const float4* t4 = (const float4*)(my_terms + q * Q8S_GROUP_BLOCKS);
#pragma unroll
                    for (int i = 0; i < Q8S_GROUP_BLOCKS / 4; ++i) {
                        const float4 tv = t4[i];
                        acc = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(acc, tv.x), tv.y), tv.z), tv.w);
                    }
                    if (q8p_div(p0 + q, m) == n_groups - 1) {
                        const int grow = r0 + warp + (first + lane) * n_warps, sgi = sg.seg(grow);
                        const int lr = grow - sg.first(sgi);
                        const float out = mv_epilogue(acc, sg.bias(sgi), residual, lr, lr);
                        sg.y(sgi)[lr] = out;
                        if constexpr (PICK) argmax_take(best_v, best_i, out, grow);
                    }
                }
            }
            __syncwarp();  // the terms are read before they are rewritten
        }
    }
    if constexpr (PICK) argmax_blocks_end(best_v, best_i, pick, partial_v, partial_i, done);
}
#endif

extern "C" __global__ void __launch_bounds__(MVB_MAX_WARPS * WARP, 1)
    matvec_q8s_bulk(float* y, const u8* w, const u8* acts, long long meta, int n_out, int k, int stages,
                    int chunk, const float* bias, const float* residual, MV_SEG_PARAMS,
                    const float* x, const float* nw, float eps) {
    PDL_WAITS_INSIDE();
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    if (k <= Q8S_PIECES && stages == 1 && chunk == Q8P_PIECES * Q8S_GROUP_BYTES)
        matvec_q8p<false>(MV_SEGS(y, w, bias, n_out), acts, meta, k, residual, x, nw, eps);
    else if (Q8S_FIXED && stages == 1)
        matvec_q8s<1>(MV_SEGS(y, w, bias, n_out), acts, meta, k, residual, stages, chunk, x, nw, eps);
    else
        matvec_q8s<0>(MV_SEGS(y, w, bias, n_out), acts, meta, k, residual, stages, chunk, x, nw, eps);
#else
    PDL_WAIT();  // sm_80: never launched (the host takes the other Q8_0 kernels)
#endif
}

// `matvec_q8s_bulk` for raw rows the one-round prologue takes (see Q8S_QUAD): the same bits.
extern "C" __global__ void __launch_bounds__(MVB_MAX_WARPS * WARP, 1)
    matvec_q8s_quad(float* y, const u8* w, const u8* acts, long long meta, int n_out, int k, int stages,
                    int chunk, const float* bias, const float* residual, MV_SEG_PARAMS,
                    const float* x, const float* nw, float eps) {
    PDL_WAITS_INSIDE();
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    if (Q8S_FIXED && stages == 1)
        matvec_q8s<1, false, Q8S_QUAD>(MV_SEGS(y, w, bias, n_out), acts, meta, k, residual, stages, chunk, x, nw,
                                       eps);
    else
        matvec_q8s<0, false, Q8S_QUAD>(MV_SEGS(y, w, bias, n_out), acts, meta, k, residual, stages, chunk, x, nw,
                                       eps);
#else
    PDL_WAIT();  // sm_80: never launched
#endif
}

// One activation row against one Q8_0 matrix with a split copy (an output head), `matvec_q8p`
// with the default ring (rows of more than Q8S_PIECES values: `matvec_q8s`, as
// `matvec_q8s_bulk` takes them), and the index of the largest output into pick[0] (the greedy pick
// without an argmax launch): y[n_out] bit for bit `matvec_q8s_bulk`'s, pick[0] `argmax_blocks_f32`
// 's on y. partial_v / partial_i: gridDim.x each; done: zero before the first launch, left at
// zero. With x, the blocks normalise (weight nw, eps) and quantize the row themselves.
extern "C" __global__ void __launch_bounds__(MVB_MAX_WARPS * WARP, 1)
    matvec_q8p_pick(float* y, const u8* w, const u8* acts, long long meta, int n_out, int k, const float* x,
                    const float* nw, float eps, i32* pick, float* partial_v, int* partial_i,
                    unsigned int* done) {
    PDL_WAITS_INSIDE();
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    const mv_segs sg{w, nullptr, nullptr, y, nullptr, nullptr, nullptr, nullptr, nullptr, n_out, n_out, n_out};
    if (k <= Q8S_PIECES)
        matvec_q8p<true>(sg, acts, meta, k, nullptr, x, nw, eps, pick, partial_v, partial_i, done);
    else
        matvec_q8s<1, true>(sg, acts, meta, k, nullptr, 1, Q8P_PIECES * Q8S_GROUP_BYTES, x, nw, eps, pick,
                            partial_v, partial_i, done);
#else
    PDL_WAIT();  // sm_80: never launched (the host needs split copies, sm_90+)
#endif
}

// `matvec_q8p_pick` for raw rows the one-round prologue takes (see Q8S_QUAD): the same bits.
extern "C" __global__ void __launch_bounds__(MVB_MAX_WARPS * WARP, 1)
    matvec_q8s_pick_quad(float* y, const u8* w, const u8* acts, long long meta, int n_out, int k, const float* x,
                         const float* nw, float eps, i32* pick, float* partial_v, int* partial_i,
                         unsigned int* done) {
    PDL_WAITS_INSIDE();
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    const mv_segs sg{w, nullptr, nullptr, y, nullptr, nullptr, nullptr, nullptr, nullptr, n_out, n_out, n_out};
    matvec_q8s<1, true, Q8S_QUAD>(sg, acts, meta, k, nullptr, 1, Q8P_PIECES * Q8S_GROUP_BYTES, x, nw, eps, pick,
                                  partial_v, partial_i, done);
#else
    PDL_WAIT();  // sm_80: never launched
#endif
}
