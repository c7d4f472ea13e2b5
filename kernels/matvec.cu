// y = x · Wᵀ with W: [n_out, n_in] in its stored format, read block by block.
//
// One warp per output row; each lane walks whole blocks of the row and accumulates the
// dequantized weight times the activation. Grid: (ceil(n_out / warps per block), m rows of x).
#include "common.cuh"

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
        matvec<fmt>(y, w, x, n_out, n_in);                                                       \
    }
FOR_EACH_FORMAT(MATVEC)

// ---------------------------------------------------------------------------------------------
// Quantized weights × quantized activations, the arithmetic of ggml's CPU dot products (and the
// approach of llama.cpp's CUDA MMVQ): activation rows are quantized once by quantize.cu (Q8_0
// for Q4_0 / Q5_0 / Q8_0 weights, Q8_1 for Q4_1 / Q5_1, Q8_K for the k-quants); every weight
// block's integer dot product with them is exact (`mv_dp4a`), and is turned into a float term by
// the same f32 operations, in the same order, as ggml's `ggml_vec_dot_*_generic`. Only the
// order in which those terms are summed differs from the CPU.
//
// Work split: a warp takes SUBS × 1024 elements of one weight row per step (SUBS per format,
// so that a step is about 1 to 1.7 KB of weights), in parts of 1024 with 32 elements per lane:
// one legacy block per lane, or one 32-element sub-block per lane and 8 lanes per k-quant
// super-block (whose integer sums are combined exactly by shuffles before the float formula).
// A step's weight bytes are copied to shared memory with coalesced 16-byte loads (whatever the
// block size and alignment); the next step's loads are issued before this step is computed, so
// they are in flight meanwhile; each lane then unpacks its blocks from shared memory. `wpr`
// warps share a row (each takes every wpr-th step) when there are too few rows to fill the
// GPU; a pass serves up to MV_COLS activation rows, so the weights are read once for all.
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

// 16 bytes of read-only global memory (activations: cached in L1, reused by every warp).
__device__ __forceinline__ uint4 mv_ld_nc16(const void* p) {
    uint4 v;
    asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// 16 bytes of weights, read once: not kept in L1.
__device__ __forceinline__ uint4 mv_ld_stream16(const void* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// The last 16-byte word of a weight buffer whose size is not a multiple of 16, bytes past the
// end read as zero (out of line: rare, and it would cost registers in every kernel).
__device__ __noinline__ uint4 mv_weight_tail(const u8* w, i64 at, i64 total) {
    u32 t[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < 16; ++i)
        if (at + i < total) t[i / 4] |= (u32)w[at + i] << (8 * (i % 4));
    return make_uint4(t[0], t[1], t[2], t[3]);
}

// The 16-byte word at byte `at` (a multiple of 16) of a weight buffer of `total` bytes.
__device__ __forceinline__ uint4 mv_weight_word(const u8* w, i64 at, i64 total) {
    return at + 16 <= total ? mv_ld_stream16(w + at) : mv_weight_tail(w, at, total);
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

// Two aligned 16-byte words of shared memory as 8 words.
__device__ __forceinline__ void mv_lds_words16(const u8* p, u32 (&w)[8]) {
    const uint4 a = *(const uint4*)p, b = *(const uint4*)(p + 16);
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
    w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}

// Signed bytewise dot product accumulate (the unsigned overload would be wrong here).
__device__ __forceinline__ int mv_dp4a(u32 a, u32 b, int c) { return __dp4a((int)a, (int)b, c); }

__device__ __forceinline__ int mv_dot8(const u32 (&w)[8], const u32 (&a)[8]) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) s = mv_dp4a(w[i], a[i], s);
    return s;
}

// Σ over elements 0..16 (words 0..3) and 16..32 (words 4..7) separately.
__device__ __forceinline__ void mv_dot8_halves(const u32 (&w)[8], const u32 (&a)[8], int& s0,
                                            int& s1) {
    s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) s0 = mv_dp4a(w[i], a[i], s0), s1 = mv_dp4a(w[4 + i], a[4 + i], s1);
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

// Legacy blocks (32 elements): `load` unpacks a block into 8 words of 4 byte-sized quants in
// element order; `term` is ggml's float formula for that block and an activation block
// (`am.x`: half bits of d | s << 16, `am.y`: Σ of the activation quants).

// d | qs[16]; value d * (q - 8). ggml: sumi * d_w * d_a, sumi = Σ (q - 8) a.
struct mv_q4_0 {
    static constexpr int BLOCK = 32, BYTES = 18;
    static constexpr bool KQ = false;
    static constexpr int SUBS = 2;  // 1024-element parts per warp step
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
    static constexpr int BLOCK = 32, BYTES = 20;
    static constexpr bool KQ = false;
    static constexpr int SUBS = 2;  // 1024-element parts per warp step
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
    static constexpr int BLOCK = 32, BYTES = 22;
    static constexpr bool KQ = false;
    static constexpr int SUBS = 2;  // 1024-element parts per warp step
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
    static constexpr int BLOCK = 32, BYTES = 24;
    static constexpr bool KQ = false;
    static constexpr int SUBS = 2;  // 1024-element parts per warp step
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
    static constexpr int BLOCK = 32, BYTES = 34;
    static constexpr bool KQ = false;
    static constexpr int SUBS = 1;  // 1024-element parts per warp step
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

// K-quants (256 elements): lane `j` of the 8 serving a super-block unpacks elements
// 32j .. 32j + 32 (`load`) and computes that part's exact integer sums (`ints`: the scaled
// Σ q·a and, for types with minimums, Σ min · bsum, with `bs` the two activation sums of 16
// of its elements). The 8 lanes' integers are added exactly; `term` is ggml's float formula
// for the whole super-block with the activation scale `da`.

// scales[16] (scale | min << 4 per 16 elements) | qs[64] | d | dmin.
// Element 128h + 32s + l: (qs[32h + l] >> 2s) & 3. ggml: (d_a·d) isum - (d_a·dmin) summ.
struct mv_q2_k {
    static constexpr int BLOCK = QK_K, BYTES = 84;
    static constexpr bool KQ = true;
    static constexpr int SUBS = 4;  // 1024-element parts per warp step
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

// hmask[32] | qs[64] | scales[12] (16 six-bit scales, offset 32) | d. Element 128h + 32s + l:
// low bits as Q2_K, minus 4 unless bit (e / 32) of hmask[l] is set. ggml: (d·d_a) isum.
struct mv_q3_k {
    static constexpr int BLOCK = QK_K, BYTES = 110;
    static constexpr bool KQ = true;
    static constexpr int SUBS = 3;  // 1024-element parts per warp step
    u32 w[8];
    int sc0, sc1;
    float d;
    __device__ void load(const u8* b, int j) {
        u32 q[8], h[8];
        mv_lds_words<8>(b + 32 + 32 * (j / 4), q);
        mv_lds_words<8>(b, h);
        const int shift = 2 * (j % 4);
#pragma unroll
        for (int i = 0; i < 8; ++i)
            w[i] = mv_sub_bytes(((q[i] >> shift) & 0x03030303u) | (((h[i] >> j) & 0x01010101u) << 2),
                             0x04040404u);
        sc0 = fmt_q3_k::scale(b + 96, 2 * j), sc1 = fmt_q3_k::scale(b + 96, 2 * j + 1);
        d = load_f16(b + 108);
    }
    __device__ void ints(const u32 (&a)[8], u32, int& isum, int& summ) const {
        int s0, s1;
        mv_dot8_halves(w, a, s0, s1);
        isum = sc0 * s0 + sc1 * s1;
        summ = 0;
    }
    __device__ float term(int isum, int, float da) const {
        return __fmul_rn(__fmul_rn(d, da), (float)isum);
    }
};

// d | dmin | scales[12] (8 six-bit scales and mins) | qs[128]. Element 64c + 32t + l:
// (qs[32c + l] >> 4t) & 15, sub-block 2c + t. ggml: (d·d_a) isum - (dmin·d_a) summ.
struct mv_q4_k {
    static constexpr int BLOCK = QK_K, BYTES = 144;
    static constexpr bool KQ = true;
    static constexpr int SUBS = 2;  // 1024-element parts per warp step
    u32 w[8];
    int sc, mn;
    float d, dmin;
    __device__ void load(const u8* b, int j) {
        u32 q[8];
        mv_lds_words16(b + 16 + 32 * (j / 2), q);  // 144-byte blocks stay 16-byte aligned
        const int shift = 4 * (j % 2);
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = (q[i] >> shift) & 0x0f0f0f0fu;
        k4_scale_min(b + 4, j, &sc, &mn);
        const u32 dd = *(const u32*)b;
        d = mv_half_lo(dd), dmin = mv_half_hi(dd);
    }
    __device__ void ints(const u32 (&a)[8], u32 bs, int& isum, int& summ) const {
        isum = sc * mv_dot8(w, a);
        summ = mn * ((int)(short)(bs & 0xffffu) + (int)(short)(bs >> 16));
    }
    __device__ float term(int isum, int summ, float da) const {
        return __fsub_rn(__fmul_rn(__fmul_rn(d, da), (float)isum),
                         __fmul_rn(__fmul_rn(dmin, da), (float)summ));
    }
};

// d | dmin | scales[12] | qh[32] | qs[128]: Q4_K plus 16 when bit (e / 32) of qh[e % 32] is set.
struct mv_q5_k {
    static constexpr int BLOCK = QK_K, BYTES = 176;
    static constexpr bool KQ = true;
    static constexpr int SUBS = 2;  // 1024-element parts per warp step
    u32 w[8];
    int sc, mn;
    float d, dmin;
    __device__ void load(const u8* b, int j) {
        u32 q[8], h[8];
        mv_lds_words16(b + 48 + 32 * (j / 2), q);  // 176-byte blocks stay 16-byte aligned
        mv_lds_words16(b + 16, h);
        const int shift = 4 * (j % 2);
#pragma unroll
        for (int i = 0; i < 8; ++i)
            w[i] = ((q[i] >> shift) & 0x0f0f0f0fu) | (((h[i] >> j) & 0x01010101u) << 4);
        k4_scale_min(b + 4, j, &sc, &mn);
        const u32 dd = *(const u32*)b;
        d = mv_half_lo(dd), dmin = mv_half_hi(dd);
    }
    __device__ void ints(const u32 (&a)[8], u32 bs, int& isum, int& summ) const {
        isum = sc * mv_dot8(w, a);
        summ = mn * ((int)(short)(bs & 0xffffu) + (int)(short)(bs >> 16));
    }
    __device__ float term(int isum, int summ, float da) const {
        return __fsub_rn(__fmul_rn(__fmul_rn(d, da), (float)isum),
                         __fmul_rn(__fmul_rn(dmin, da), (float)summ));
    }
};

// ql[128] | qh[64] | scales[16] (int8) | d. Element 128h + 32g + l: low 4 bits from
// ql[64h + 32(g & 1) + l] (high nibble for g >= 2), high 2 bits (qh[32h + l] >> 2g) & 3,
// value minus 32. ggml: (d·d_a) isum.
struct mv_q6_k {
    static constexpr int BLOCK = QK_K, BYTES = 210;
    static constexpr bool KQ = true;
    static constexpr int SUBS = 2;  // 1024-element parts per warp step
    u32 w[8];
    int sc0, sc1;
    float d;
    __device__ void load(const u8* b, int j) {
        const int h = j / 4, g = j % 4;
        u32 lo[8], hi[8];
        mv_lds_words<8>(b + 64 * h + 32 * (g & 1), lo);
        mv_lds_words<8>(b + 128 + 32 * h, hi);
        const int lshift = 4 * (g / 2), hshift = 2 * g;
#pragma unroll
        for (int i = 0; i < 8; ++i)
            w[i] = mv_sub_bytes(((lo[i] >> lshift) & 0x0f0f0f0fu) | (((hi[i] >> hshift) & 0x03030303u) << 4),
                             0x20202020u);
        sc0 = (i8)b[192 + 2 * j], sc1 = (i8)b[192 + 2 * j + 1];
        d = load_f16(b + 208);
    }
    __device__ void ints(const u32 (&a)[8], u32, int& isum, int& summ) const {
        int s0, s1;
        mv_dot8_halves(w, a, s0, s1);
        isum = sc0 * s0 + sc1 * s1;
        summ = 0;
    }
    __device__ float term(int isum, int, float da) const {
        return __fmul_rn(__fmul_rn(d, da), (float)isum);
    }
};

// 32 activation quants (16-byte aligned) as 8 words.
__device__ __forceinline__ void mv_load_acts(const i8* p, u32 (&a)[8]) {
    const uint4 x = mv_ld_nc16(p), z = mv_ld_nc16(p + 16);
    a[0] = x.x, a[1] = x.y, a[2] = x.z, a[3] = x.w;
    a[4] = z.x, a[5] = z.y, a[6] = z.z, a[7] = z.w;
}

template <typename F>
struct mv_shape {
    // Elements of a row per warp step: F::SUBS times 32 per lane, so that each step moves
    // about a kilobyte or more of weights (bytes in flight hide the memory latency).
    static constexpr int STEP = F::SUBS * MV_CHUNK;
    static constexpr int CHUNK_BYTES = STEP / F::BLOCK * F::BYTES;
    // 16-byte words a step can touch (its start is not aligned).
    static constexpr int WORDS = (CHUNK_BYTES + 30) / 16;
    static constexpr int LOADS = (WORDS + WARP - 1) / WARP;
};

// Loads the 16-byte words of weight bytes [s, e) (from the word holding s) into `buf`: word
// `lane + 32 i` in buf[i].
template <int LOADS>
__device__ __forceinline__ void mv_fetch(uint4 (&buf)[LOADS], const u8* w, i64 s, i64 e, i64 total,
                                         int lane) {
    const i64 first = s >> 4;
    const int n_words = (int)(((e + 15) >> 4) - first);
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
        const int wi = lane + WARP * i;
        if (wi < n_words) buf[i] = mv_weight_word(w, (first + wi) * 16, total);
    }
}

// y[m0 + j][row] for the rows of this block and the activation rows m0 .. m0 + MV_COLS.
template <typename F>
__device__ void matvec_q8(float* __restrict__ y, const u8* __restrict__ w,
                          const u8* __restrict__ acts, long long meta_off, long long bsums_off,
                          int n_out, int k, int m, int wpr) {
    using S = mv_shape<F>;
    __shared__ uint4 stage[MV_WARPS][S::WORDS + 1];  // + 1: mv_lds_words may read one word past
    __shared__ float partial[MV_WARPS][MV_COLS];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int row = blockIdx.x * (MV_WARPS / wpr) + warp / wpr;
    const int part = warp % wpr;
    const int m0 = blockIdx.y * MV_COLS;
    const int nc = min(MV_COLS, m - m0);
    const i64 row_bytes = (i64)(k / F::BLOCK) * F::BYTES;
    const i64 total = (i64)n_out * row_bytes;
    const int n_chunks = (k + S::STEP - 1) / S::STEP;
    const i8* qs = (const i8*)acts;
    const u8* meta = acts + meta_off;
    const u8* bsums = acts + bsums_off;

    float acc[MV_COLS];
#pragma unroll
    for (int j = 0; j < MV_COLS; ++j) acc[j] = 0.0f;

    if (row < n_out) {
        const i64 row0 = (i64)row * row_bytes, row_end = row0 + row_bytes;
        uint4 buf[S::LOADS];
        if (part < n_chunks) {
            const i64 s = row0 + (i64)part * S::CHUNK_BYTES;
            mv_fetch<S::LOADS>(buf, w, s, min(s + S::CHUNK_BYTES, row_end), total, lane);
        }
        for (int c = part; c < n_chunks; c += wpr) {
            const i64 s = row0 + (i64)c * S::CHUNK_BYTES;
            const i64 e = min(s + S::CHUNK_BYTES, row_end);
            const int n_words = (int)(((e + 15) >> 4) - (s >> 4));
#pragma unroll
            for (int i = 0; i < S::LOADS; ++i) {
                const int wi = lane + WARP * i;
                if (wi < n_words) stage[warp][wi] = buf[i];
            }
            __syncwarp();
            if (c + wpr < n_chunks) {  // the next step's loads fly while this one computes
                const i64 s2 = row0 + (i64)(c + wpr) * S::CHUNK_BYTES;
                mv_fetch<S::LOADS>(buf, w, s2, min(s2 + S::CHUNK_BYTES, row_end), total, lane);
            }
            const u8* base = (const u8*)stage[warp] + (s & 15);
#pragma unroll
            for (int sub = 0; sub < F::SUBS; ++sub) {
                const int e_sub = c * S::STEP + sub * MV_CHUNK;  // first element of this part
                if (e_sub >= k) break;
                const int e0 = e_sub + 32 * lane;  // this lane's first element of the row
                const bool valid = e0 < k;
                F f;
                if (valid)
                    f.load(F::KQ ? base + (sub * 4 + lane / 8) * F::BYTES
                                 : base + (sub * WARP + lane) * F::BYTES,
                           lane % 8);
#pragma unroll
                for (int j = 0; j < MV_COLS; ++j) {
                    if (j >= nc) break;
                    const i64 ae = (i64)(m0 + j) * k + e0;  // activation element index
                    if constexpr (F::KQ) {
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
                        if (valid && lane % 8 == 0) acc[j] += f.term(isum, summ, da);
                    } else {
                        if (valid) {
                            u32 a[8];
                            mv_load_acts(qs + ae, a);
                            const uint2 am = *(const uint2*)(meta + (ae / 32) * 8);
                            acc[j] += f.term(a, am);
                        }
                    }
                }
            }
            __syncwarp();
        }
    }

#pragma unroll
    for (int j = 0; j < MV_COLS; ++j)
        if (j < nc) acc[j] = warp_sum(acc[j]);
    if (wpr == 1) {
        float v = acc[0];
#pragma unroll
        for (int j = 1; j < MV_COLS; ++j) v = lane == j ? acc[j] : v;
        if (row < n_out && lane < nc) y[(i64)(m0 + lane) * n_out + row] = v;
    } else {
        if (lane == 0) {
#pragma unroll
            for (int j = 0; j < MV_COLS; ++j) partial[warp][j] = acc[j];
        }
        __syncthreads();
        if (part == 0 && row < n_out && lane < nc) {
            float v = 0.0f;
            for (int p = 0; p < wpr; ++p) v += partial[warp + p][lane];
            y[(i64)(m0 + lane) * n_out + row] = v;
        }
    }
}

#define MATVEC_Q8(name, fmt)                                                                     \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP, MV_MIN_BLOCKS)                 \
        matvec_q8_##name(float* y, const u8* w, const u8* acts, long long meta_off,              \
                         long long bsums_off, int n_out, int k, int m, int wpr) {                \
        matvec_q8<fmt>(y, w, acts, meta_off, bsums_off, n_out, k, m, wpr);                       \
    }
MATVEC_Q8(q4_0, mv_q4_0)
MATVEC_Q8(q4_1, mv_q4_1)
MATVEC_Q8(q5_0, mv_q5_0)
MATVEC_Q8(q5_1, mv_q5_1)
MATVEC_Q8(q8_0, mv_q8_0)
MATVEC_Q8(q2_k, mv_q2_k)
MATVEC_Q8(q3_k, mv_q3_k)
MATVEC_Q8(q4_k, mv_q4_k)
MATVEC_Q8(q5_k, mv_q5_k)
MATVEC_Q8(q6_k, mv_q6_k)

// ---------------------------------------------------------------------------------------------
// Float weights the way ggml's CPU computes them: the activation rounded to the weight's type
// (F16: half, BF16: bfloat16, F32: as is), each product w·x rounded to f32, the products summed
// in f64 (rounded to f32 once at the end; the CPU's f64 sum runs in element order, so the two
// differ only when the association of that sum changes the final rounding). One warp per row,
// 16-byte weight loads when rows are 16-byte aligned, MV_COLS activation rows per pass.

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

__device__ __forceinline__ double mv_warp_sum_f64(double v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(MV_FULL, v, o);
    return v;
}

template <int T>
__device__ void matvec_float(float* __restrict__ y, const u8* __restrict__ w,
                             const float* __restrict__ x, int n_out, int k, int m) {
    constexpr int EB = T == 0 ? 4 : 2;  // bytes per weight
    constexpr int EPW = 16 / EB;        // weights per 16-byte word
    constexpr int UNROLL = 4;           // words in flight per lane
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int row = blockIdx.x * MV_WARPS + warp;
    const int m0 = blockIdx.y * MV_COLS;
    const int nc = min(MV_COLS, m - m0);
    if (row >= n_out) return;
    const u8* wr = w + (i64)row * k * EB;
    double acc[MV_COLS];
#pragma unroll
    for (int j = 0; j < MV_COLS; ++j) acc[j] = 0.0;
    if (k % EPW == 0) {
        const int nw = k / EPW;
        for (int w0 = 0; w0 < nw; w0 += WARP * UNROLL) {
            uint4 wv[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int wi = w0 + u * WARP + lane;
                if (wi < nw) wv[u] = mv_ld_stream16(wr + (i64)wi * 16);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int wi = w0 + u * WARP + lane;
                if (wi >= nw) break;
                float wf[EPW];
                const u32 words[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
#pragma unroll
                for (int e = 0; e < EPW; ++e) {
                    if (T == 0) wf[e] = __uint_as_float(words[e]);
                    else {
                        const u16 h = (u16)(words[e / 2] >> (16 * (e % 2)));
                        wf[e] = T == 1 ? f16_to_f32(h) : bf16_to_f32(h);
                    }
                }
#pragma unroll
                for (int j = 0; j < MV_COLS; ++j) {
                    if (j >= nc) break;
                    const float4* xv = (const float4*)(x + (i64)(m0 + j) * k + (i64)wi * EPW);
#pragma unroll
                    for (int q = 0; q < EPW / 4; ++q) {
                        const float4 v = xv[q];
                        const float xs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            acc[j] += (double)__fmul_rn(wf[4 * q + e], mv_round_act<T>(xs[e]));
                    }
                }
            }
        }
    } else {
        for (int i = lane; i < k; i += WARP) {
            const float wf = mv_weight_at<T>(wr, i);
#pragma unroll
            for (int j = 0; j < MV_COLS; ++j) {
                if (j >= nc) break;
                acc[j] += (double)__fmul_rn(wf, mv_round_act<T>(x[(i64)(m0 + j) * k + i]));
            }
        }
    }
    double v = 0.0;
#pragma unroll
    for (int j = 0; j < MV_COLS; ++j) {
        const double s = mv_warp_sum_f64(acc[j]);
        v = lane == j ? s : v;
    }
    if (lane < nc) y[(i64)(m0 + lane) * n_out + row] = (float)v;
}

#define MATVEC_FLOAT(name, t)                                                                    \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP, MV_MIN_BLOCKS)                 \
        matvec_float_##name(float* y, const u8* w, const float* x, int n_out, int k, int m) {    \
        matvec_float<t>(y, w, x, n_out, k, m);                                                   \
    }
MATVEC_FLOAT(f32, 0)
MATVEC_FLOAT(f16, 1)
MATVEC_FLOAT(bf16, 2)
