// y = x · Wᵀ on the tensor cores for k-quant weights (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and Q8_K
// activations (quantize.cu), for prefill (many activation rows): W: [n_out, k] in its stored
// format, y: [m, n_out] row-major. Bit for bit the CPU's result (ggml_vec_dot_*_q8_K_generic,
// synaptix-kernels-cpu quant/kquants.rs) and matvec.cu's `matvec_q8`. sm_80+ (mma.sync,
// ldmatrix and cp.async through inline PTX).
//
// The CPU's arithmetic per output (weight row r, activation row j) and super-block b:
// - Q3_K .. Q6_K: eight integer lane sums aux[l] = Σ_{e % 8 == l} scale(e) · q_w(e) · q_a(e),
//   then in f32 `sums[l] = sums[l] + (d_w · d_a) · (float)aux[l]` (eight chains over the
//   super-blocks in order, from 0), for Q4_K / Q5_K also `sum = sum - (dmin_w · d_a) · summ`
//   with summ = Σ_j min_j · (bsum_2j + bsum_2j+1) = Σ_e min(e) · q_a(e) (bsums are exact sums of
//   the quants); at the end `sum + sums[0] + ... + sums[7]` left to right (sum = 0 for Q3_K /
//   Q6_K).
// - Q2_K: isum = Σ_e scale(e) · q_w(e) · q_a(e), summ = Σ_e min(e) · q_a(e), and one chain
//   `sum = sum + ((d_a · d_w) · isum - (d_a · dmin_w) · summ)`.
//
// Integer parts on the int8 tensor cores (`mma.sync.m16n8k32.s8`, exact s32 sums). For lane l of
// a super-block, the 32 elements 8i + l (i = 0..31) form one k = 32 "chunk", position i. The
// weights of a chunk are v = scale · q (the sub-block scale folded in; the sub-block of element
// 8i + l is i / 2 for 16-element sub-blocks and i / 4 for 32-element ones, the same for every
// lane). v does not fit a byte (Q4_K: up to 945, Q6_K: -3968 .. 4096), so it is split into
// hi = v >> 6 (arithmetic) and lo = v & 63, both bytes, and aux = 64 · Σ hi·a + Σ lo·a, exact.
// Q2_K's v = scale · q <= 45 fits a byte: one chunk per lane, and the 8 lanes' mmas accumulate
// into one exact isum. The mins (Q2_K, Q4_K, Q5_K) are one more chunk per row, byte i = the min
// of position i's sub-block, multiplied with each lane's activation chunk and accumulated over
// the 8 lanes: summ, exact.
//
// Integer -> float: sums below 2^22 in magnitude come out of the mma with 1.5·2^23 added (the c
// operand), so their bits are those of the float 1.5·2^23 + s, and `- 1.5·2^23` gives (float)s
// exactly (gemm.cu's trick). Q3_K / Q4_K lane sums stay below 2^22 (Q4_K: 32·63·15·128 <
// 3.9e6): the hi mma's result · 64 + 1.5·2^23 is the c of the lo mma. Q5_K / Q6_K lane sums
// reach 2^24 (exactly representable, but not in the trick's range): hi and lo sums (each < 2^19)
// are converted separately and aux = fma(hi, 64, lo), exact because the exact result (an integer
// of magnitude <= 2^24) is a float. Every float operation of the CPU then happens once per
// output, in the CPU's order, with the rounding intrinsics (nothing contracted into an FMA).
//
// Tiling: a thread block computes BM (32) weight rows × BN (64) activation rows, 8 warps of
// 16 × 16 (two m16n8 tiles each; per thread 2 weight rows × 4 activation rows = 8 outputs × 9
// chains in registers). One super-block per stage: cp.async stages the raw weight bytes (16-byte
// words covering each row's super-block), the 256 activation quants of each row and their f32
// d into a ring of NSTAGE slots; per stage the threads then unpack the weights into chunks
// (shared row: CHUNKS × 32 bytes + 16) and transpose the activations lane-major (chunk l, byte i
// = q_a(8i + l); row 8 × 32 + 16 bytes), and the warps run the mmas (fragment layouts: see
// gemm.cu's header; rows padded to an odd multiple of 16 bytes, conflict-free ldmatrix).
#include "common.cuh"

// ---------------------------------------------------------------------------------------------
// PTX wrappers (the copies and ldmatrix are in common.cuh).

// D (16 × 8 s32) = A (16 × 32 s8) · B (32 × 8 s8) + C, C given per element.
__device__ __forceinline__ void gk_mma(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1, const int (&c)[4]) {
    asm(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %11, %12, %13};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c[0]), "r"(c[1]), "r"(c[2]),
          "r"(c[3]));
}

// ---------------------------------------------------------------------------------------------
// Helpers.

#define GK_MAGIC_I 0x4b400000
#define GK_MAGIC_F 12582912.0f
// (float)s of an mma result d = 1.5·2^23 + s (bits), |s| < 2^22: exact.
__device__ __forceinline__ float gk_isum_f(int d) { return __fsub_rn(__int_as_float(d), GK_MAGIC_F); }

// N consecutive little-endian words of shared memory at any 2-byte-aligned `p` (reads the word
// after the last too).
template <int N>
__device__ __forceinline__ void gk_words(const u8* p, u32 (&w)[N]) {
    const u32 mis = (u32)(unsigned long long)p & 3u;
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

// Lane-major gathers (matvec.cu's mv_gather_at): built at `b + l` (b 2-byte aligned), `g(off)`
// (off a multiple of 4) returns bytes off + l, + 8, + 16, + 24 of the super-block at b.
struct gk_gather {
    const u8* a;
    u32 sel;
    __device__ gk_gather(const u8* p) {
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

// v = sc · q per byte of `w` (bytes q unsigned, sc <= 63, q·sc < 2^16) as hi = v >> 6 and
// lo = v & 63 bytes (hi < 64).
__device__ __forceinline__ void gk_split_u(u32 w, u32 sc, u32& hi, u32& lo) {
    const u32 p02 = (w & 0x00ff00ffu) * sc, p13 = ((w >> 8) & 0x00ff00ffu) * sc;
    lo = (p02 & 0x003f003fu) | ((p13 & 0x003f003fu) << 8);
    hi = ((p02 >> 6) & 0x003f003fu) | (((p13 >> 6) & 0x003f003fu) << 8);
}

// v = s · q per signed byte q of `w`, s = s0 for bytes 0, 1 and s1 for bytes 2, 3; hi = v >> 6
// (arithmetic, must fit a signed byte), lo = v & 63.
__device__ __forceinline__ void gk_split_s(u32 w, int s0, int s1, u32& hi, u32& lo) {
    hi = 0, lo = 0;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        const int v = (p < 2 ? s0 : s1) * (int)(i8)(u8)(w >> (8 * p));
        lo |= (u32)(v & 63) << (8 * p);
        hi |= ((u32)(v >> 6) & 0xffu) << (8 * p);
    }
}

__device__ __forceinline__ u32 gk_byte(u32 w, int i) { return (w >> (8 * i)) & 0xffu; }

// ---------------------------------------------------------------------------------------------
// Formats. `unpack(b, l, c)`: the chunks of lane l of the super-block at `b` (shared memory,
// 2-byte aligned, 4-byte aligned where the block size allows) as words, word w = positions
// 4w .. 4w + 3 (elements 32w + l, + 8, + 16, + 24): SPLIT formats c[0..8] = hi, c[8..16] = lo;
// Q2_K c[0..8] = v. `meta(b, d, dmin, mn)`: the scales and the min chunk's words.
// SPLIT: chunks 2l (hi) and 2l + 1 (lo) of a shared row, the min chunk at 16; Q2_K: chunk l,
// the min chunk at 8. CHAIN: lane sums below 2^22 (see the header).

// Q4_K / Q5_K scales: sc[8] and the min words (byte i of the chunk: min_{i / 4}).
__device__ __forceinline__ void gk_k4_scales(const u8* b, u32& sc_lo, u32& sc_hi, u32& mins0, u32& mins1) {
    const u32* s = (const u32*)b;  // 16-byte aligned (144- and 176-byte blocks)
    const u32 s0 = s[1], s1 = s[2], s2 = s[3];
    sc_lo = s0 & 0x3f3f3f3fu;
    sc_hi = (s2 & 0x0f0f0f0fu) | (((s0 >> 6) & 0x03030303u) << 4);
    mins0 = s1 & 0x3f3f3f3fu;
    mins1 = ((s2 >> 4) & 0x0f0f0f0fu) | (((s1 >> 6) & 0x03030303u) << 4);
}

// d | dmin | scales[12] | qs[128]; element 64c + 32h + j: (qs[32c + j] >> 4h) & 15, sub-block
// 2c + h (= word index of the lane-major words).
struct gk_q4_k {
    static constexpr int BYTES = 144, CHUNKS = 17;
    static constexpr bool SPLIT = true, MIN = true, CHAIN = true;
    __device__ static void quants(const u8* b, int l, u32 (&w)[8]) {
        const gk_gather g(b + l);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const u32 q = g(16 + 32 * c);
            w[2 * c] = q & 0x0f0f0f0fu, w[2 * c + 1] = (q >> 4) & 0x0f0f0f0fu;
        }
    }
    __device__ static void fold(const u8* b, const u32 (&w)[8], u32 (&c)[16]) {
        u32 sc_lo, sc_hi, m0, m1;
        gk_k4_scales(b, sc_lo, sc_hi, m0, m1);
#pragma unroll
        for (int i = 0; i < 8; ++i) gk_split_u(w[i], gk_byte(i < 4 ? sc_lo : sc_hi, i % 4), c[i], c[8 + i]);
    }
    __device__ static void unpack(const u8* b, int l, u32 (&c)[16]) {
        u32 w[8];
        quants(b, l, w);
        fold(b, w, c);
    }
    __device__ static void meta(const u8* b, float& d, float& dmin, u32 (&mn)[8]) {
        u32 sc_lo, sc_hi, m0, m1;
        gk_k4_scales(b, sc_lo, sc_hi, m0, m1);
#pragma unroll
        for (int i = 0; i < 8; ++i) mn[i] = gk_byte(i < 4 ? m0 : m1, i % 4) * 0x01010101u;
        const u32 dd = *(const u32*)b;
        d = f16_to_f32((u16)(dd & 0xffffu)), dmin = f16_to_f32((u16)(dd >> 16));
    }
};

// d | dmin | scales[12] | qh[32] | qs[128]: Q4_K's q plus 16 when bit (e / 32) of qh[e % 32].
struct gk_q5_k : gk_q4_k {
    static constexpr int BYTES = 176;
    static constexpr bool CHAIN = false;  // lane sums up to 32·63·31·128 > 2^22
    __device__ static void unpack(const u8* b, int l, u32 (&c)[16]) {
        const gk_gather g(b + l);
        const u32 h = g(16);
        u32 w[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 q = g(48 + 32 * i);
            w[2 * i] = (q & 0x0f0f0f0fu) | (((h >> (2 * i)) & 0x01010101u) << 4);
            w[2 * i + 1] = ((q >> 4) & 0x0f0f0f0fu) | (((h >> (2 * i + 1)) & 0x01010101u) << 4);
        }
        fold(b, w, c);
    }
};

// ql[128] | qh[64] | scales[16] (int8) | d. Element 128h + 32g + j: low 4 bits from
// ql[64h + 32(g & 1) + j] (high nibble for g >= 2), high 2 bits (qh[32h + j] >> 2g) & 3, minus
// 32; 16-element sub-blocks (word w: bytes 0, 1 in sub-block 2w, bytes 2, 3 in 2w + 1).
struct gk_q6_k {
    static constexpr int BYTES = 210, CHUNKS = 16;
    static constexpr bool SPLIT = true, MIN = false, CHAIN = false;  // lane sums up to 2^24
    __device__ static void unpack(const u8* b, int l, u32 (&c)[16]) {
        const gk_gather g(b + l);
        const u32 l00 = g(0), l01 = g(32), l10 = g(64), l11 = g(96), h0 = g(128), h1 = g(160);
        u32 s[4];
        gk_words<4>(b + 192, s);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int h = i / 4, q = i % 4;
            const u32 lw = h == 0 ? ((q & 1) ? l01 : l00) : ((q & 1) ? l11 : l10);
            const u32 hb = h == 0 ? h0 : h1;
            const u32 x = ((lw >> (4 * (q >> 1))) & 0x0f0f0f0fu) | (((hb >> (2 * q)) & 0x03030303u) << 4);
            const u32 v = (x + 0x60606060u) ^ 0x80808080u;  // x - 32, bytewise
            const u32 sw = s[i / 2];
            const int s0 = (int)(i8)(u8)gk_byte(sw, 2 * (i % 2)), s1 = (int)(i8)(u8)gk_byte(sw, 2 * (i % 2) + 1);
            gk_split_s(v, s0, s1, c[i], c[8 + i]);
        }
    }
    __device__ static void meta(const u8* b, float& d, float& dmin, u32 (&mn)[8]) {
        d = load_f16(b + 208), dmin = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) mn[i] = 0u;
    }
};

// hmask[32] | qs[64] | scales[12] (16 six-bit scales, offset 32) | d. Element 128h + 32s + j:
// (qs[32h + j] >> 2s) & 3, minus 4 unless bit (e / 32) of hmask[j] is set; 16-element
// sub-blocks.
struct gk_q3_k {
    static constexpr int BYTES = 110, CHUNKS = 16;
    static constexpr bool SPLIT = true, MIN = false, CHAIN = true;  // |lane sum| <= 32·128·128
    __device__ static void unpack(const u8* b, int l, u32 (&c)[16]) {
        const gk_gather g(b + l);
        const u32 hm = g(0), q0 = g(32), q1 = g(64);
        u32 s[3];
        gk_words<3>(b + 96, s);
        const u32 parts[4] = {
            (s[0] & 0x0f0f0f0fu) | ((s[2] & 0x03030303u) << 4),
            (s[1] & 0x0f0f0f0fu) | (((s[2] >> 2) & 0x03030303u) << 4),
            ((s[0] >> 4) & 0x0f0f0f0fu) | (((s[2] >> 4) & 0x03030303u) << 4),
            ((s[1] >> 4) & 0x0f0f0f0fu) | (((s[2] >> 6) & 0x03030303u) << 4),
        };
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const u32 q = i < 4 ? q0 : q1;
            const u32 x = ((q >> (2 * (i % 4))) & 0x03030303u) | (((hm >> i) & 0x01010101u) << 2);
            const u32 v = (x + 0x7c7c7c7cu) ^ 0x80808080u;  // x - 4, bytewise
            // scales 2i, 2i + 1: bytes (2i) % 4, (2i) % 4 + 1 of parts[i / 2]
            const u32 pw = parts[i / 2];
            const int s0 = (int)gk_byte(pw, 2 * (i % 2)) - 32, s1 = (int)gk_byte(pw, 2 * (i % 2) + 1) - 32;
            gk_split_s(v, s0, s1, c[i], c[8 + i]);
        }
    }
    __device__ static void meta(const u8* b, float& d, float& dmin, u32 (&mn)[8]) {
        d = load_f16(b + 108), dmin = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) mn[i] = 0u;
    }
};

// scales[16] (scale | min << 4 per 16 elements) | qs[64] | d | dmin. Element 128h + 32s + j:
// (qs[32h + j] >> 2s) & 3. v = scale · q <= 45: one byte.
struct gk_q2_k {
    static constexpr int BYTES = 84, CHUNKS = 9;
    static constexpr bool SPLIT = false, MIN = true, CHAIN = true;
    __device__ static void unpack(const u8* b, int l, u32 (&c)[16]) {
        const gk_gather g(b + l);
        const u32 q0 = g(16), q1 = g(48);
        const u32* s = (const u32*)b;  // 84-byte blocks: 4-byte aligned
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const u32 q = ((i < 4 ? q0 : q1) >> (2 * (i % 4))) & 0x03030303u;
            const u32 sw = s[i / 2];
            const u32 s0 = gk_byte(sw, 2 * (i % 2)) & 15u, s1 = gk_byte(sw, 2 * (i % 2) + 1) & 15u;
            c[i] = (q & 0x0000ffffu) * s0 + (q & 0xffff0000u) * s1;
            c[8 + i] = 0u;
        }
    }
    __device__ static void meta(const u8* b, float& d, float& dmin, u32 (&mn)[8]) {
        const u32* s = (const u32*)b;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const u32 sw = s[i / 2];
            const u32 m0 = gk_byte(sw, 2 * (i % 2)) >> 4, m1 = gk_byte(sw, 2 * (i % 2) + 1) >> 4;
            mn[i] = m0 * 0x0101u + m1 * 0x01010000u;
        }
        const u32 dd = *(const u32*)(b + 80);
        d = f16_to_f32((u16)(dd & 0xffffu)), dmin = f16_to_f32((u16)(dd >> 16));
    }
};

// ---------------------------------------------------------------------------------------------
// The kernel.

#define GK_BM 32             // weight rows per thread block
#define GK_BN 64             // activation rows per thread block
#define GK_NT 256            // threads: (BM / 16) × (BN / 16) warps of 16 × 16
#define GK_BROW (8 * 32 + 16)  // transposed activation row: 8 chunks + padding

// Shared memory (dynamic; byte offsets, all 16-byte aligned):
// - NSTAGE ring slots, each: raw weights (BM rows × RAW bytes: the 16-byte words covering the
//   row's super-block, which starts at byte `offset & 15`), + 16 bytes of slack (gk_words and the
//   gathers read a little past a block); activation quants (BN rows × 256); activation d (BN f32);
// - unpacked weights: BM rows × AROW (CHUNKS × 32 + 16);
// - transposed activations: BN rows × GK_BROW;
// - f32 d and dmin of the stage's weight rows.
template <typename F, int NSTAGE>
struct gk_layout {
    static constexpr int RAW = (F::BYTES + 14 + 15) / 16 * 16;
    static constexpr int RAW_WORDS = RAW / 16;
    static constexpr int RAW_BYTES = GK_BM * RAW + 16;
    static constexpr int ACT_OFF = RAW_BYTES;
    static constexpr int AD_OFF = ACT_OFF + GK_BN * 256;
    static constexpr int SLOT = AD_OFF + GK_BN * 4;  // multiple of 16
    static constexpr int AROW = F::CHUNKS * 32 + 16;
    static constexpr int A_OFF = NSTAGE * SLOT;
    static constexpr int B_OFF = A_OFF + GK_BM * AROW;
    static constexpr int WD_OFF = B_OFF + GK_BN * GK_BROW;
    static constexpr int WM_OFF = WD_OFF + GK_BM * 4;
    static constexpr int BYTES = WM_OFF + GK_BM * 4;
};

// O_p = [e0.p, e1.p, e2.p, e3.p] for p = 0..3 (a 4 × 4 byte transpose).
__device__ __forceinline__ void gk_transpose4(u32 e0, u32 e1, u32 e2, u32 e3, u32& o0, u32& o1, u32& o2,
                                              u32& o3) {
    const u32 a = __byte_perm(e0, e1, 0x5140), b = __byte_perm(e0, e1, 0x7362);
    const u32 c = __byte_perm(e2, e3, 0x5140), d = __byte_perm(e2, e3, 0x7362);
    o0 = __byte_perm(a, c, 0x5410), o1 = __byte_perm(a, c, 0x7632);
    o2 = __byte_perm(b, d, 0x5410), o3 = __byte_perm(b, d, 0x7632);
}

// Grid: (ceil(n_out / BM), ceil(m / BN)), GK_NT threads. acts: quantize.cu's Q8_K buffer (i8
// quants [m, k], f32 d per super-block at `meta_off`); k a multiple of 256.
template <typename F, int NSTAGE>
__device__ void gemm_k(float* __restrict__ y, const u8* __restrict__ w, const u8* __restrict__ acts,
                       long long meta_off, int n_out, int k, int m) {
    using L = gk_layout<F, NSTAGE>;
    constexpr int BM = GK_BM, BN = GK_BN, NT = GK_NT;
    constexpr int NWN = BN / 16;  // warps along the activation rows
    extern __shared__ __align__(16) u8 gk_shared[];
    u8* const sh = gk_shared;

    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const int g = lane / 4, t = lane % 4;
    const int row0 = blockIdx.x * BM;
    const int m0 = blockIdx.y * BN;
    const int nsb = k / QK_K;  // super-blocks per row
    const i64 w_bytes = (i64)n_out * nsb * F::BYTES;
    const u8* const meta = acts + meta_off;

    auto w_off = [&](int r, int s) -> i64 { return ((i64)(row0 + r) * nsb + s) * F::BYTES; };

    // Copies of stage (super-block) s into ring slot s % NSTAGE; none past the last.
    auto issue = [&](int s) {
        if (s >= nsb) return;
        u8* const slot = sh + (s % NSTAGE) * L::SLOT;
        for (int i = tid; i < BM * L::RAW_WORDS; i += NT) {
            const int r = i / L::RAW_WORDS, wi = i % L::RAW_WORDS;
            if (row0 + r >= n_out) continue;
            const i64 off = w_off(r, s);
            const i64 wa = (off & ~(i64)15) + 16 * wi;
            if (wa >= off + F::BYTES) continue;
            const int n = (int)min((i64)16, w_bytes - wa);
            cp_async16(smem_addr(slot + r * L::RAW + 16 * wi), w + wa, n);
        }
        for (int i = tid; i < BN * 16; i += NT) {
            const int j = i / 16, wi = i % 16;
            const bool ok = m0 + j < m;
            const u8* src = ok ? acts + (i64)(m0 + j) * k + (i64)s * QK_K + 16 * wi : acts;
            cp_async16(smem_addr(slot + L::ACT_OFF + j * 256 + 16 * wi), src, ok ? 16 : 0);
        }
        for (int j = tid; j < BN; j += NT) {
            const bool ok = m0 + j < m;
            const u8* src = ok ? meta + ((i64)(m0 + j) * nsb + s) * 4 : meta;
            cp_async4(smem_addr(slot + L::AD_OFF + 4 * j), src, ok ? 4 : 0);
        }
    };

    u8* const a_tile = sh + L::A_OFF;
    u8* const b_tile = sh + L::B_OFF;
    float* const wd = (float*)(sh + L::WD_OFF);
    float* const wmin = (float*)(sh + L::WM_OFF);

    // This warp: weight rows wr0 .. wr0 + 16, activation rows wc0 .. wc0 + 16 of the tile.
    const int wr0 = (warp / NWN) * 16, wc0 = (warp % NWN) * 16;
    const bool active = m0 + wc0 < m;
    const u32 a_addr = smem_addr(a_tile + (wr0 + lane % 16) * L::AROW + 16 * (lane / 16));
    const u32 b_addr = smem_addr(b_tile + (wc0 + lane % 8 + 8 * (lane / 16)) * GK_BROW + 16 * ((lane / 8) % 2));

    // Chains of this thread's outputs [n8 tile j][c0..c3] (weight row wr0 + g + 8(e / 2),
    // activation row wc0 + 8j + 2t + e % 2): lanes (Q3_K .. Q6_K), and `sum` (Q2_K: the only
    // one; Q4_K / Q5_K: the min chain).
    constexpr int NL = F::SPLIT ? 8 : 1;
    float sums[NL][2][4];
    float sum[2][4];
#pragma unroll
    for (int l = 0; l < NL; ++l)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) sums[l][j][e] = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) sum[j][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < NSTAGE - 1; ++s) {
        issue(s);
        cp_async_commit();
    }

    for (int s = 0; s < nsb; ++s) {
        cp_async_wait<NSTAGE - 2>();
        // Stage s visible to all; every warp is done with stage s - 1 (tiles and its slot free).
        __syncthreads();
        issue(s + NSTAGE - 1);
        cp_async_commit();

        const u8* const slot = sh + (s % NSTAGE) * L::SLOT;
        // Weights: one (row, lane) per thread (BM · 8 = NT).
        {
            const int r = tid / 8, l = tid % 8;
            if (row0 + r < n_out) {
                const u8* blk = slot + r * L::RAW + (int)(w_off(r, s) & 15);
                u32 c[16];
                F::unpack(blk, l, c);
                u8* const dst = a_tile + r * L::AROW;
                if (F::SPLIT) {
                    uint4* hi = (uint4*)(dst + 64 * l);
                    hi[0] = make_uint4(c[0], c[1], c[2], c[3]);
                    hi[1] = make_uint4(c[4], c[5], c[6], c[7]);
                    hi[2] = make_uint4(c[8], c[9], c[10], c[11]);
                    hi[3] = make_uint4(c[12], c[13], c[14], c[15]);
                } else {
                    uint4* v = (uint4*)(dst + 32 * l);
                    v[0] = make_uint4(c[0], c[1], c[2], c[3]);
                    v[1] = make_uint4(c[4], c[5], c[6], c[7]);
                }
                if (l == 0) {
                    float d, dmin;
                    u32 mn[8];
                    F::meta(blk, d, dmin, mn);
                    wd[r] = d;
                    wmin[r] = dmin;
                    if (F::MIN) {
                        uint4* mc = (uint4*)(dst + 32 * (F::CHUNKS - 1));
                        mc[0] = make_uint4(mn[0], mn[1], mn[2], mn[3]);
                        mc[1] = make_uint4(mn[4], mn[5], mn[6], mn[7]);
                    }
                }
            }
        }
        // Activations, lane-major: task (row j, 32-element group G) writes positions 4G .. 4G+3
        // of the 8 chunks of row j.
        for (int i = tid; i < BN * 8; i += NT) {
            const int j = i / 8, G = i % 8;
            const uint4 x = *(const uint4*)(slot + L::ACT_OFF + j * 256 + 32 * G);
            const uint4 z = *(const uint4*)(slot + L::ACT_OFF + j * 256 + 32 * G + 16);
            u32 o[8];
            gk_transpose4(x.x, x.z, z.x, z.z, o[0], o[1], o[2], o[3]);
            gk_transpose4(x.y, x.w, z.y, z.w, o[4], o[5], o[6], o[7]);
            u8* const dst = b_tile + j * GK_BROW + 4 * G;
#pragma unroll
            for (int l = 0; l < 8; ++l) *(u32*)(dst + 32 * l) = o[l];
        }
        __syncthreads();

        if (active) {
            const float* const ad = (const float*)(slot + L::AD_OFF);
            float dw[2], dm[2], da[2][2];
#pragma unroll
            for (int h = 0; h < 2; ++h) dw[h] = wd[wr0 + g + 8 * h], dm[h] = wmin[wr0 + g + 8 * h];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const float2 v = *(const float2*)(ad + wc0 + 8 * j + 2 * t);
                da[j][0] = v.x, da[j][1] = v.y;
            }
            u32 amin[4];
            if (F::MIN) ldmatrix4(amin, a_addr + 32 * (F::CHUNKS - 1));
            const int magic4[4] = {GK_MAGIC_I, GK_MAGIC_I, GK_MAGIC_I, GK_MAGIC_I};
            const int zero4[4] = {0, 0, 0, 0};
            int isum[2][4], msum[2][4];  // Q2_K's isum, the mins' summ (+ 1.5·2^23)
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) isum[j][e] = GK_MAGIC_I, msum[j][e] = GK_MAGIC_I;
            // Lane sums: the CPU's (d_w · d_a) · (float)aux, per output.
            float dd[2][4];
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) dd[j][e] = __fmul_rn(dw[e / 2], da[j][e % 2]);
#pragma unroll
            for (int l = 0; l < 8; ++l) {
                u32 b[4];  // n8 tile 0: b[0], b[1]; tile 1: b[2], b[3]
                ldmatrix4(b, b_addr + 32 * l);
                if (F::SPLIT) {
                    u32 ah[4], al[4];
                    ldmatrix4(ah, a_addr + 64 * l);
                    ldmatrix4(al, a_addr + 64 * l + 32);
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        float aux[4];
                        if (F::CHAIN) {
                            int hs[4], c[4], d[4];
                            gk_mma(hs, ah, b[2 * j], b[2 * j + 1], zero4);
#pragma unroll
                            for (int e = 0; e < 4; ++e) c[e] = hs[e] * 64 + GK_MAGIC_I;
                            gk_mma(d, al, b[2 * j], b[2 * j + 1], c);
#pragma unroll
                            for (int e = 0; e < 4; ++e) aux[e] = gk_isum_f(d[e]);
                        } else {
                            int hs[4], ls[4];
                            gk_mma(hs, ah, b[2 * j], b[2 * j + 1], magic4);
                            gk_mma(ls, al, b[2 * j], b[2 * j + 1], magic4);
#pragma unroll
                            for (int e = 0; e < 4; ++e) aux[e] = __fmaf_rn(gk_isum_f(hs[e]), 64.0f, gk_isum_f(ls[e]));
                        }
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            sums[F::SPLIT ? l : 0][j][e] =
                                __fadd_rn(sums[F::SPLIT ? l : 0][j][e], __fmul_rn(dd[j][e], aux[e]));
                    }
                } else {
                    u32 av[4];
                    ldmatrix4(av, a_addr + 32 * l);
#pragma unroll
                    for (int j = 0; j < 2; ++j) gk_mma(isum[j], av, b[2 * j], b[2 * j + 1], isum[j]);
                }
                if (F::MIN) {
#pragma unroll
                    for (int j = 0; j < 2; ++j) gk_mma(msum[j], amin, b[2 * j], b[2 * j + 1], msum[j]);
                }
            }
            if (F::SPLIT && F::MIN) {
                // ggml: sum -= (dmin · d_a) · summ
#pragma unroll
                for (int j = 0; j < 2; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        sum[j][e] = __fsub_rn(sum[j][e], __fmul_rn(__fmul_rn(dm[e / 2], da[j][e % 2]),
                                                                   gk_isum_f(msum[j][e])));
            } else if (!F::SPLIT) {
                // ggml (Q2_K): sum += (d_a · d) · isum - (d_a · dmin) · summ
#pragma unroll
                for (int j = 0; j < 2; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const float a = da[j][e % 2];
                        const float term = __fsub_rn(__fmul_rn(__fmul_rn(a, dw[e / 2]), gk_isum_f(isum[j][e])),
                                                     __fmul_rn(__fmul_rn(a, dm[e / 2]), gk_isum_f(msum[j][e])));
                        sum[j][e] = __fadd_rn(sum[j][e], term);
                    }
            }
        }
    }
    cp_async_wait<0>();

    if (!active) return;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int row = row0 + wr0 + g + 8 * (e / 2);
            const int col = m0 + wc0 + 8 * j + 2 * t + e % 2;
            // ggml: sum (Q4_K / Q5_K: the min chain; Q3_K / Q6_K: 0) + sums[0] + ... + sums[7];
            // Q2_K: sum.
            float v = sum[j][e];
            if (F::SPLIT) {
#pragma unroll
                for (int l = 0; l < NL; ++l) v = __fadd_rn(v, sums[l][j][e]);
            }
            if (row < n_out && col < m) y[(i64)col * n_out + row] = v;
        }
}

// Two ring depths: 3 stages, and 2 for GPUs whose per-block shared memory cannot hold 3 (the
// launcher picks; both give identical results).
#define GEMM_K(name, fmt)                                                                            \
    extern "C" __global__ void __launch_bounds__(GK_NT, 2)                                           \
        gemm_k_##name(float* y, const u8* w, const u8* acts, long long meta_off, int n_out, int k,   \
                      int m) {                                                                       \
        gemm_k<fmt, 3>(y, w, acts, meta_off, n_out, k, m);                                           \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(GK_NT, 2)                                           \
        gemm_k_##name##_2s(float* y, const u8* w, const u8* acts, long long meta_off, int n_out,     \
                           int k, int m) {                                                           \
        gemm_k<fmt, 2>(y, w, acts, meta_off, n_out, k, m);                                           \
    }
GEMM_K(q2_k, gk_q2_k)
GEMM_K(q3_k, gk_q3_k)
GEMM_K(q4_k, gk_q4_k)
GEMM_K(q5_k, gk_q5_k)
GEMM_K(q6_k, gk_q6_k)
