// y = x · Wᵀ on the tensor cores, for prefill (many activation rows): W: [n_out, k] in its stored
// format, y: [m, n_out] row-major (like matvec.cu).
//
// Two families, both sm_80+ (mma.sync, ldmatrix and cp.async through inline PTX; NVRTC has no
// CUDA headers):
//
// 1. gemm_q8_*: legacy 32-element-block weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) times activation
//    rows quantized by quantize.cu (Q8_0 for Q4_0 / Q5_0 / Q8_0, Q8_1 for Q4_1 / Q5_1), bit for
//    bit ggml's portable CPU result. One `mma.sync.m16n8k32.s8` is exactly one 32-element block
//    for a 16 (weight rows) × 8 (activation rows) tile: its s32 results are the blocks' exact
//    integer dot products Σ q_w·q_a. The thread holding an output then forms that block's f32
//    term with ggml's formula for the format, operation for operation (the rounding intrinsics
//    keep NVRTC from fusing a multiply and an add), and adds it to the output's one f32
//    accumulator: block after block in increasing k, from 0.0f, in a single thread, exactly as
//    the CPU's `sum += term` loop (no split-K, no reassociation). The weights are unpacked to
//    signed bytes in shared memory (Q4_0: q - 8, Q5_0: q - 16, Q4_1 / Q5_1: q as is (0..15 /
//    0..31), Q8_0: q), which makes the integer sums those of ggml's per-format loops.
//
// 2. gemm_f16 / gemm_bf16: F16 / BF16 weights times activations rounded to the weight's type
//    beforehand (gemm_round_f16 / _bf16, as the CPU rounds them), `mma.sync.m16n8k16` with f32
//    accumulation. The products are exact in f32; only the order and precision of the sums
//    differ from the CPU's f64 sum (relative error ~1e-7 per output).
//
// Tiling (both): a thread block computes a BM (weight rows) × BN (activation rows) tile of y,
// warps WM × WN sub-tiles of it. Operands are staged in shared memory k-major, one row of
// the tile per shared row: every shared row holds 32 bytes per mma k step (one quantized block,
// or 16 halves), rows padded by 16 bytes (row stride an odd multiple of 16 bytes: the 8 row
// addresses of each ldmatrix phase hit 8 distinct 16-byte bank groups). cp.async fills a ring
// of NSTAGE stages, NSTAGE - 1 ahead of the stage being computed.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k32" / "mma.m16n8k16"; g = lane / 4,
// t = lane % 4; A: 16 × K row-major (weight rows × k), B: K × 8 column-major (k × activation
// rows, i.e. activation rows k-contiguous), C/D: 16 × 8):
// - A .s8 (m16n8k32), 4 × b32 of 4 bytes: a0 = A[g][4t .. 4t+3], a1 = A[g+8][4t ..],
//   a2 = A[g][16+4t ..], a3 = A[g+8][16+4t ..].
// - A .f16/.bf16 (m16n8k16), 4 × b32 of 2 halves: a0 = A[g][2t, 2t+1], a1 = A[g+8][2t ..],
//   a2 = A[g][8+2t ..], a3 = A[g+8][8+2t ..]. In bytes of a row this is the .s8 layout: a0 is
//   bytes 4t .. 4t+3 of row g, a2 bytes 16+4t .. of row g, and so on.
// - B .s8: b0 = B[4t .. 4t+3][g], b1 = B[16+4t ..][g]; B .f16: b0 = B[2t, 2t+1][g],
//   b1 = B[8+2t ..][g]: again bytes 4t.. and 16+4t.. of (activation) row g.
// - C/D (s32 or f32): c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1].
// - ldmatrix.x4 (b16): lanes 8i .. 8i+7 give the 8 row addresses (16 bytes each) of matrix i;
//   register i of lane l is bytes 4(l%4) .. 4(l%4)+3 of row l/4 of matrix i. So for A, lane l
//   points at row (l % 16), bytes 16·(l / 16): matrices (rows 0-7, bytes 0-15), (rows 8-15,
//   bytes 0-15), (rows 0-7, bytes 16-31), (rows 8-15, bytes 16-31) = a0, a1, a2, a3. For B
//   (two n8 fragments, activation rows n0 .. n0+15), lane l points at row (l % 8) + 8·(l / 16),
//   bytes 16·((l / 8) % 2): registers b0, b1 of rows n0..n0+7, then b0, b1 of rows n0+8..n0+15.
#include "common.cuh"

// ---------------------------------------------------------------------------------------------
// PTX wrappers (the copies and ldmatrix are in common.cuh).

// D (16 × 8 s32) = A (16 × 32 s8) · B (32 × 8 s8) + c, c added to every element.
__device__ __forceinline__ void gm_mma_s8(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1, int c) {
    asm(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %10, %10, %10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c));
}

// D (16 × 8 f32) += A (16 × 16 f16 or bf16) · B (16 × 8).
template <bool BF16>
__device__ __forceinline__ void gm_mma_f16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    if (BF16) {
        asm(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// Shared memory bytes per staged row: 32 per mma k step, + 16 so that consecutive rows start
// an odd number of 16-byte units apart (conflict-free ldmatrix).
#define GM_KSTEPS 2                      // mma k steps per stage (quantized: blocks per stage)
#define GM_ROW (32 * GM_KSTEPS + 16)     // 80 bytes

// ---------------------------------------------------------------------------------------------
// Quantized weights: unpacking one staged 32-element block to 32 signed bytes in element order.

// The integer sum of a block comes out of the mma with 1.5·2^23 added (0x4b400000 as an int,
// the c operand), so its bits are those of the float 1.5·2^23 + isum (exact for |isum| < 2^22;
// here |isum| <= 32·128·128 = 2^19), and `- 1.5·2^23` recovers (float)isum exactly. This avoids
// an int -> float conversion (a quarter- or eighth-rate instruction) per output and block.
#define GM_MAGIC_I 0x4b400000
#define GM_MAGIC_F 12582912.0f

__device__ __forceinline__ float gm_isum_f(int d) { return __fsub_rn(__int_as_float(d), GM_MAGIC_F); }

// N consecutive little-endian words of shared memory at any 2-byte-aligned `p` (aligned loads and
// funnel shifts; reads the aligned word after the last too, which the staging layout provides).
template <int N>
__device__ __forceinline__ void gm_words(const u8* p, u32 (&w)[N]) {
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

// Bytewise x - c for bytes x in [0, 2c), c <= 128, as signed bytes (no borrow between bytes).
__device__ __forceinline__ u32 gm_sub_bytes(u32 x, u32 c4) { return ((x | 0x80808080u) - c4) ^ 0x80808080u; }

// Bits 0..3 of `n` to bit 4 of bytes 0..3 (the fifth bit of four Q5 quants).
__device__ __forceinline__ u32 gm_spread_bit4(u32 n) { return (((n & 15u) * 0x00204081u) & 0x01010101u) << 4; }

__device__ __forceinline__ float gm_half_lo(u32 v) { return f16_to_f32((u16)(v & 0xffffu)); }
__device__ __forceinline__ float gm_half_hi(u32 v) { return f16_to_f32((u16)(v >> 16)); }

// Each format: BYTES per block; MIN: whether it has a minimum (and takes Q8_1 activations);
// unpack(b, q, d, m): the block at `b` (2-byte aligned shared memory) as 8 words of element-order
// signed bytes, its scale d and minimum m; term(isum, dw, mw, da, sa): ggml's block term
// (CPU: synaptix-kernels-cpu quant/legacy.rs `block_term`, which is ggml_vec_dot_*_generic).

// d | qs[16]: element j < 16 in the low nibble of qs[j], j >= 16 in the high nibble of qs[j-16];
// value d·(q - 8). ggml: sumf += (sumi · d_w) · d_a, sumi = Σ (q - 8)·q_a.
struct gm_q4_0 {
    static constexpr int BYTES = 18;
    static constexpr bool MIN = false;
    __device__ static void unpack(const u8* b, u32 (&q)[8], float& d, float& m) {
        u32 w[4];
        gm_words<4>(b + 2, w);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            q[i] = gm_sub_bytes(w[i] & 0x0f0f0f0fu, 0x08080808u);
            q[4 + i] = gm_sub_bytes((w[i] >> 4) & 0x0f0f0f0fu, 0x08080808u);
        }
        d = load_f16(b);
        m = 0.0f;
    }
    __device__ static float term(float s, float dw, float, float da, float) {
        return __fmul_rn(__fmul_rn(s, dw), da);
    }
};

// d | m | qs[16]; value d·q + m. ggml: sumf += (d_w · d_a) · sumi + m_w · s_a, sumi = Σ q·q_a.
struct gm_q4_1 {
    static constexpr int BYTES = 20;
    static constexpr bool MIN = true;
    __device__ static void unpack(const u8* b, u32 (&q)[8], float& d, float& m) {
        u32 w[5];
        gm_words<5>(b, w);  // d | m, qs
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            q[i] = w[1 + i] & 0x0f0f0f0fu;
            q[4 + i] = (w[1 + i] >> 4) & 0x0f0f0f0fu;
        }
        d = gm_half_lo(w[0]);
        m = gm_half_hi(w[0]);
    }
    __device__ static float term(float s, float dw, float mw, float da, float sa) {
        return __fadd_rn(__fmul_rn(__fmul_rn(dw, da), s), __fmul_rn(mw, sa));
    }
};

// d | qh (32 fifth bits, bit j for element j) | qs[16]; value d·(q - 16).
// ggml: sumf += (d_w · d_a) · sumi, sumi = Σ (q - 16)·q_a.
struct gm_q5_0 {
    static constexpr int BYTES = 22;
    static constexpr bool MIN = false;
    __device__ static void unpack(const u8* b, u32 (&q)[8], float& d, float& m) {
        u32 w[5];
        gm_words<5>(b + 2, w);  // qh, qs
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            q[i] = gm_sub_bytes((w[1 + i] & 0x0f0f0f0fu) | gm_spread_bit4(w[0] >> (4 * i)), 0x10101010u);
            q[4 + i] = gm_sub_bytes(((w[1 + i] >> 4) & 0x0f0f0f0fu) | gm_spread_bit4(w[0] >> (16 + 4 * i)),
                                    0x10101010u);
        }
        d = load_f16(b);
        m = 0.0f;
    }
    __device__ static float term(float s, float dw, float, float da, float) {
        return __fmul_rn(__fmul_rn(dw, da), s);
    }
};

// d | m | qh | qs[16]; value d·q + m. ggml: sumf += (d_w · d_a) · sumi + m_w · s_a.
struct gm_q5_1 {
    static constexpr int BYTES = 24;
    static constexpr bool MIN = true;
    __device__ static void unpack(const u8* b, u32 (&q)[8], float& d, float& m) {
        u32 w[6];
        gm_words<6>(b, w);  // d | m, qh, qs
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            q[i] = (w[2 + i] & 0x0f0f0f0fu) | gm_spread_bit4(w[1] >> (4 * i));
            q[4 + i] = ((w[2 + i] >> 4) & 0x0f0f0f0fu) | gm_spread_bit4(w[1] >> (16 + 4 * i));
        }
        d = gm_half_lo(w[0]);
        m = gm_half_hi(w[0]);
    }
    __device__ static float term(float s, float dw, float mw, float da, float sa) {
        return __fadd_rn(__fmul_rn(__fmul_rn(dw, da), s), __fmul_rn(mw, sa));
    }
};

// d | qs[32] (int8); value d·q. ggml: sumf += sumi · (d_w · d_a).
struct gm_q8_0 {
    static constexpr int BYTES = 34;
    static constexpr bool MIN = false;
    __device__ static void unpack(const u8* b, u32 (&q)[8], float& d, float& m) {
        gm_words<8>(b + 2, q);
        d = load_f16(b);
        m = 0.0f;
    }
    __device__ static float term(float s, float dw, float, float da, float) {
        return __fmul_rn(s, __fmul_rn(dw, da));
    }
};

// Shared memory of a quantized thread block (dynamic; byte offsets, all 16-byte aligned):
// - NSTAGE ring slots, each
//   - raw weights: BM rows × RAW bytes: the 16-byte words covering the row's GM_KSTEPS blocks
//     of the stage (the blocks start at byte `row_off & 15` of the row's slot);
//   - activation quants: BN rows × GM_ROW bytes (row j: the stage's blocks of activation row
//     m0 + j, 32 bytes each, then 16 bytes of padding);
//   - activation metadata: BN × GM_KSTEPS × 8 bytes (quantize.cu's u32 half d | half s << 16,
//     then the i32 Σq, unused here);
// - unpacked weights: BM rows × GM_ROW bytes, the stage's blocks as signed bytes;
// - f32 scales of the stage: wd, wm [GM_KSTEPS][BM], ad, as [GM_KSTEPS][BN] (wm, as: Q4_1 / Q5_1);
// - 16 bytes of slack after the raw weights of the last row (gm_words reads one word ahead).
template <typename F, int BM, int BN, int NSTAGE>
struct gm_qlayout {
    static constexpr int RAW = (GM_KSTEPS * F::BYTES + 14 + 15) / 16 * 16;
    static constexpr int RAW_WORDS = RAW / 16;
    static constexpr int RAW_BYTES = BM * RAW + 16;
    static constexpr int ACT_BYTES = BN * GM_ROW;
    static constexpr int META_BYTES = BN * GM_KSTEPS * 8;
    static constexpr int SLOT = RAW_BYTES + ACT_BYTES + META_BYTES;  // multiple of 16
    static constexpr int A_OFF = NSTAGE * SLOT;
    static constexpr int WD_OFF = A_OFF + BM * GM_ROW;
    static constexpr int WM_OFF = WD_OFF + GM_KSTEPS * BM * 4;
    static constexpr int AD_OFF = WM_OFF + GM_KSTEPS * BM * 4;
    static constexpr int AS_OFF = AD_OFF + GM_KSTEPS * BN * 4;
    static constexpr int BYTES = AS_OFF + GM_KSTEPS * BN * 4;
};

// The quantized GEMM. Grid: (ceil(n_out / BM), ceil(m / BN)); block: (BM / 32) × (BN / 32) warps,
// each computing a 32 (weight rows) × 32 (activation rows) tile: 2 × 4 mma tiles of 16 × 8,
// i.e. per thread 2 · 4 · 4 = 32 outputs with one f32 accumulator each.
// acts: quantize.cu's buffer (i8 quants [m, k], then at `meta_off` 8 bytes per block).
template <typename F, int BM, int BN, int NSTAGE>
__device__ void gemm_q8(float* __restrict__ y, const u8* __restrict__ w, const u8* __restrict__ acts,
                        long long meta_off, int n_out, int k, int m) {
    using L = gm_qlayout<F, BM, BN, NSTAGE>;
    constexpr int NWN = BN / 32;                 // warps along the activation rows
    constexpr int NT = (BM / 32) * NWN * WARP;  // threads
    extern __shared__ __align__(16) u8 gm_shared[];
    u8* const sh = gm_shared;

    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const int g = lane / 4, t = lane % 4;
    const int row0 = blockIdx.x * BM;  // first weight row (output column of y) of the tile
    const int m0 = blockIdx.y * BN;    // first activation row
    const int nbk = k / 32;            // blocks per row
    const int n_steps = (nbk + GM_KSTEPS - 1) / GM_KSTEPS;
    const i64 w_bytes = (i64)n_out * nbk * F::BYTES;
    const u8* const meta = acts + meta_off;

    // Byte offset in W of the first block of stage s of tile row r.
    auto w_off = [&](int r, int s) -> i64 { return ((i64)(row0 + r) * nbk + (i64)s * GM_KSTEPS) * F::BYTES; };

    // Issues the copies of stage s into ring slot s % NSTAGE (none past the last stage).
    auto issue = [&](int s) {
        if (s >= n_steps) return;
        u8* const slot = sh + (s % NSTAGE) * L::SLOT;
        const int b0 = s * GM_KSTEPS;
        const int nbs = min(GM_KSTEPS, nbk - b0);  // blocks in this stage
        // Weights: the 16-byte words covering [off, off + nbs·BYTES) of each valid row; the
        // last word of the buffer is cut at its end (zero-filled past it).
        for (int i = tid; i < BM * L::RAW_WORDS; i += NT) {
            const int r = i / L::RAW_WORDS, wi = i % L::RAW_WORDS;
            if (row0 + r >= n_out) continue;
            const i64 off = w_off(r, s);
            const i64 wa = (off & ~(i64)15) + 16 * wi;
            if (wa >= off + nbs * F::BYTES) continue;
            const int n = (int)min((i64)16, w_bytes - wa);
            cp_async16(smem_addr(slot + r * L::RAW + 16 * wi), w + wa, n);
        }
        // Activation quants: 2 words per block; rows past m are zero-filled.
        u8* const aq = slot + L::RAW_BYTES;
        for (int i = tid; i < BN * 2 * GM_KSTEPS; i += NT) {
            const int j = i / (2 * GM_KSTEPS), wi = i % (2 * GM_KSTEPS);
            const bool ok = m0 + j < m && wi < 2 * nbs;
            const u8* src = ok ? acts + (i64)(m0 + j) * k + (i64)b0 * 32 + 16 * wi : acts;
            cp_async16(smem_addr(aq + j * GM_ROW + 16 * wi), src, ok ? 16 : 0);
        }
        // Activation block metadata (8 bytes per block).
        u8* const am = aq + L::ACT_BYTES;
        for (int i = tid; i < BN * GM_KSTEPS; i += NT) {
            const int j = i / GM_KSTEPS, bb = i % GM_KSTEPS;
            const bool ok = m0 + j < m && bb < nbs;
            const u8* src = ok ? meta + ((i64)(m0 + j) * nbk + b0 + bb) * 8 : meta;
            cp_async8(smem_addr(am + i * 8), src, ok ? 8 : 0);
        }
    };

    u8* const a_tile = sh + L::A_OFF;
    float* const wd = (float*)(sh + L::WD_OFF);
    float* const wmin = (float*)(sh + L::WM_OFF);
    float* const ad = (float*)(sh + L::AD_OFF);
    float* const asum = (float*)(sh + L::AS_OFF);

    // This warp's tile: weight rows wr0 .. wr0 + 32, activation rows wc0 .. wc0 + 32 (of the block
    // tile). A warp whose activation rows all lie past m computes nothing (but keeps the barriers).
    const int wr0 = (warp / NWN) * 32, wc0 = (warp % NWN) * 32;
    const bool active = m0 + wc0 < m;
    // ldmatrix row addresses (see the layout notes at the top), for k step 0 of the tile.
    const u32 a_addr = smem_addr(a_tile + (wr0 + lane % 16) * GM_ROW + 16 * (lane / 16));
    const int b_row = wc0 + lane % 8 + 8 * (lane / 16), b_col = 16 * ((lane / 8) % 2);

    float acc[2][4][4];  // [16-row tile i][8-column tile j][c0..c3]
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < NSTAGE - 1; ++s) {
        issue(s);
        cp_async_commit();  // one group per stage, empty ones too: the wait below counts groups
    }

    for (int s = 0; s < n_steps; ++s) {
        cp_async_wait<NSTAGE - 2>();  // this thread's copies of stage s have landed
        // Every thread's copies of stage s are visible, and every warp is done with stage s - 1
        // (a_tile, the scales and ring slot (s - 1) % NSTAGE are free).
        __syncthreads();
        issue(s + NSTAGE - 1);
        cp_async_commit();

        const u8* const slot = sh + (s % NSTAGE) * L::SLOT;
        const int nbs = min(GM_KSTEPS, nbk - s * GM_KSTEPS);
        // Unpack the weights (one block per thread and pass) and convert the scales to f32.
        for (int i = tid; i < BM * GM_KSTEPS; i += NT) {
            const int r = i / GM_KSTEPS, bb = i % GM_KSTEPS;
            if (row0 + r >= n_out || bb >= nbs) continue;
            const u8* blk = slot + r * L::RAW + (int)(w_off(r, s) & 15) + bb * F::BYTES;
            u32 q[8];
            float d, mn;
            F::unpack(blk, q, d, mn);
            uint4* dst = (uint4*)(a_tile + r * GM_ROW + bb * 32);
            dst[0] = make_uint4(q[0], q[1], q[2], q[3]);
            dst[1] = make_uint4(q[4], q[5], q[6], q[7]);
            wd[bb * BM + r] = d;
            if (F::MIN) wmin[bb * BM + r] = mn;
        }
        const u8* const am = slot + L::RAW_BYTES + L::ACT_BYTES;
        for (int i = tid; i < BN * GM_KSTEPS; i += NT) {
            const int j = i / GM_KSTEPS, bb = i % GM_KSTEPS;
            const u32 v = *(const u32*)(am + i * 8);
            ad[bb * BN + j] = gm_half_lo(v);
            if (F::MIN) asum[bb * BN + j] = gm_half_hi(v);
        }
        __syncthreads();

        if (active) {
            const u32 b_addr = smem_addr(slot + L::RAW_BYTES + b_row * GM_ROW + b_col);
#pragma unroll
            for (int bb = 0; bb < GM_KSTEPS; ++bb) {
                if (bb >= nbs) break;
                u32 a[2][4], b[4][2];
                ldmatrix4(a[0], a_addr + bb * 32);
                ldmatrix4(a[1], a_addr + 16 * GM_ROW + bb * 32);
#pragma unroll
                for (int jj = 0; jj < 2; ++jj) {
                    u32 r[4];
                    ldmatrix4(r, b_addr + jj * 16 * GM_ROW + bb * 32);
                    b[2 * jj][0] = r[0], b[2 * jj][1] = r[1];
                    b[2 * jj + 1][0] = r[2], b[2 * jj + 1][1] = r[3];
                }
                // Scales of this thread's rows (wr0 + 16i + g + 8h) and activation rows
                // (wc0 + 8j + 2t + c).
                float dw[2][2], mw[2][2], da[4][2], sa[4][2];
#pragma unroll
                for (int i = 0; i < 2; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int r = bb * BM + wr0 + 16 * i + 8 * h + g;
                        dw[i][h] = wd[r];
                        mw[i][h] = F::MIN ? wmin[r] : 0.0f;
                    }
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int c = bb * BN + wc0 + 8 * j + 2 * t;
                    const float2 dv = *(const float2*)(ad + c);
                    da[j][0] = dv.x, da[j][1] = dv.y;
                    if (F::MIN) {
                        const float2 sv = *(const float2*)(asum + c);
                        sa[j][0] = sv.x, sa[j][1] = sv.y;
                    } else {
                        sa[j][0] = sa[j][1] = 0.0f;
                    }
                }
#pragma unroll
                for (int i = 0; i < 2; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        int d[4];
                        gm_mma_s8(d, a[i], b[j][0], b[j][1], GM_MAGIC_I);
                        // d[e]: weight row wr0 + 16i + g + 8(e / 2), activation row
                        // wc0 + 8j + 2t + e % 2.
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const float term = F::term(gm_isum_f(d[e]), dw[i][e / 2], mw[i][e / 2],
                                                       da[j][e % 2], sa[j][e % 2]);
                            acc[i][j][e] = __fadd_rn(acc[i][j][e], term);
                        }
                    }
            }
        }
    }
    cp_async_wait<0>();  // no copy may outlive the block (the trailing groups are empty)

    if (!active) return;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = row0 + wr0 + 16 * i + g + 8 * (e / 2);
                const int col = m0 + wc0 + 8 * j + 2 * t + e % 2;
                if (row < n_out && col < m) y[(i64)col * n_out + row] = acc[i][j][e];
            }
}

// Configurations: `l` 128 weight rows × 64 activation rows (8 warps, two blocks per SM), `s`
// 64 × 64 (4 warps) for grids too small to fill the GPU with `l`. Both give identical results.
#define GM_NSTAGE_Q 3
#define GEMM_Q8(name, fmt)                                                                          \
    extern "C" __global__ void __launch_bounds__(256, 2)                                            \
        gemm_q8_##name##_l(float* y, const u8* w, const u8* acts, long long meta_off, int n_out,    \
                           int k, int m) {                                                          \
        PDL_WAIT();                                                                                 \
        PDL_TRIGGER();                                                                              \
        gemm_q8<fmt, 128, 64, GM_NSTAGE_Q>(y, w, acts, meta_off, n_out, k, m);                      \
    }                                                                                               \
    extern "C" __global__ void __launch_bounds__(128, 4)                                            \
        gemm_q8_##name##_s(float* y, const u8* w, const u8* acts, long long meta_off, int n_out,    \
                           int k, int m) {                                                          \
        PDL_WAIT();                                                                                 \
        PDL_TRIGGER();                                                                              \
        gemm_q8<fmt, 64, 64, GM_NSTAGE_Q>(y, w, acts, meta_off, n_out, k, m);                       \
    }
GEMM_Q8(q4_0, gm_q4_0)
GEMM_Q8(q4_1, gm_q4_1)
GEMM_Q8(q5_0, gm_q5_0)
GEMM_Q8(q5_1, gm_q5_1)
GEMM_Q8(q8_0, gm_q8_0)

// ---------------------------------------------------------------------------------------------
// F16 / BF16 weights.

// x (f32) rounded to f16 (round to nearest even, as ggml's FP32_TO_FP16) or to bf16 (ggml's
// FP32_TO_BF16: nearest even, NaN kept quiet), n values (a multiple of 4, x 16-byte aligned):
// four per thread, one 16-byte load and one 8-byte store.
__device__ __forceinline__ u16 gm_bf16(float x) {
    const u32 u = __float_as_uint(x);
    return (u & 0x7fffffffu) > 0x7f800000u ? (u16)((u >> 16) | 0x40u) : (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
template <bool BF16>
__device__ __forceinline__ void gm_round4(u16* __restrict__ out, const float* __restrict__ x, int n) {
    const int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i >= n) return;
    const float4 v = *(const float4*)(x + i);
    u16 h[4];
    if (BF16) {
        h[0] = gm_bf16(v.x), h[1] = gm_bf16(v.y), h[2] = gm_bf16(v.z), h[3] = gm_bf16(v.w);
    } else {
        h[0] = f32_to_f16(v.x), h[1] = f32_to_f16(v.y), h[2] = f32_to_f16(v.z), h[3] = f32_to_f16(v.w);
    }
    *(uint2*)(out + i) = make_uint2(h[0] | ((u32)h[1] << 16), h[2] | ((u32)h[3] << 16));
}
extern "C" __global__ void gemm_round_f16(u16* __restrict__ out, const float* __restrict__ x, int n) {
    PDL_WAIT();
    PDL_TRIGGER();
    gm_round4<false>(out, x, n);
}
extern "C" __global__ void gemm_round_bf16(u16* __restrict__ out, const float* __restrict__ x, int n) {
    PDL_WAIT();
    PDL_TRIGGER();
    gm_round4<true>(out, x, n);
}

// Grid: (ceil(n_out / BM), ceil(m / BN)); block: (BM / WM) × (BN / WN) warps, each a WM × WN
// tile of (WM / 16) × (WN / 8) mma tiles with f32 accumulators. w: [n_out, k] halves, x: [m, k]
// halves (already rounded), k a multiple of 16. Shared memory: NSTAGE slots of (BM + BN) rows ×
// GM_ROW bytes (a stage is 32 elements of k: 64 bytes of each row), weights first.
template <bool BF16, int BM, int BN, int WM, int WN, int NSTAGE>
__device__ void gemm_half(float* __restrict__ y, const u16* __restrict__ w, const u16* __restrict__ x,
                          int n_out, int k, int m) {
    constexpr int NWN = BN / WN;
    constexpr int NT = (BM / WM) * NWN * WARP;
    constexpr int MI = WM / 16, NJ = WN / 8;  // mma tiles per warp
    constexpr int SLOT = (BM + BN) * GM_ROW;
    constexpr int KS = 16 * GM_KSTEPS;  // elements of k per stage
    static_assert(NJ % 2 == 0, "B fragments are loaded two n8 tiles at a time");
    extern __shared__ __align__(16) u8 gm_shared[];
    u8* const sh = gm_shared;

    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const int g = lane / 4, t = lane % 4;
    const int row0 = blockIdx.x * BM, m0 = blockIdx.y * BN;
    const int n_steps = (k + KS - 1) / KS;

    // Stage s: 16-byte words (8 elements) wi = 0..3 of each tile row; rows past n_out / m and
    // words past k are zero-filled.
    auto issue = [&](int s) {
        if (s >= n_steps) return;
        u8* const slot = sh + (s % NSTAGE) * SLOT;
        const int e0 = s * KS;
        // A fixed count per thread, so the loop unrolls and the row arithmetic is hoisted out
        // of the k loop.
        static_assert(((BM + BN) * 4) % NT == 0, "every thread issues the same number of copies");
#pragma unroll
        for (int c = 0; c < (BM + BN) * 4 / NT; ++c) {
            const int i = tid + c * NT;
            const int r = i / 4, wi = i % 4;
            const int e = e0 + 8 * wi;
            const bool is_w = r < BM;
            const int row = is_w ? row0 + r : m0 + (r - BM);
            const bool ok = (is_w ? row < n_out : row < m) && e < k;
            const u16* base = is_w ? w : x;
            const u16* src = ok ? base + (i64)row * k + e : base;
            cp_async16(smem_addr(slot + r * GM_ROW + 16 * wi), src, ok ? 16 : 0);
        }
    };

    const int wr0 = (warp / NWN) * WM, wc0 = (warp % NWN) * WN;
    const bool active = m0 + wc0 < m;
    // ldmatrix addresses relative to a slot (layout notes at the top).
    const int a_off = (wr0 + lane % 16) * GM_ROW + 16 * (lane / 16);
    const int b_off = (BM + wc0 + lane % 8 + 8 * (lane / 16)) * GM_ROW + 16 * ((lane / 8) % 2);

    float acc[MI][NJ][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < NSTAGE - 1; ++s) {
        issue(s);
        cp_async_commit();
    }
    for (int s = 0; s < n_steps; ++s) {
        cp_async_wait<NSTAGE - 2>();
        __syncthreads();  // stage s visible to all; slot (s - 1) % NSTAGE free
        issue(s + NSTAGE - 1);
        cp_async_commit();
        if (active) {
            const u32 slot = smem_addr(sh + (s % NSTAGE) * SLOT);
            const int nks = min(GM_KSTEPS, (k - s * KS) / 16);  // k16 steps in this stage
#pragma unroll
            for (int kk = 0; kk < GM_KSTEPS; ++kk) {
                if (kk >= nks) break;
                u32 a[MI][4], b[NJ][2];
#pragma unroll
                for (int i = 0; i < MI; ++i) ldmatrix4(a[i], slot + a_off + 16 * i * GM_ROW + 32 * kk);
#pragma unroll
                for (int jj = 0; jj < NJ / 2; ++jj) {
                    u32 r[4];
                    ldmatrix4(r, slot + b_off + 16 * jj * GM_ROW + 32 * kk);
                    b[2 * jj][0] = r[0], b[2 * jj][1] = r[1];
                    b[2 * jj + 1][0] = r[2], b[2 * jj + 1][1] = r[3];
                }
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int j = 0; j < NJ; ++j) gm_mma_f16<BF16>(acc[i][j], a[i], b[j][0], b[j][1]);
            }
        }
    }
    cp_async_wait<0>();

    if (!active) return;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = row0 + wr0 + 16 * i + g + 8 * (e / 2);
                const int col = m0 + wc0 + 8 * j + 2 * t + e % 2;
                if (row < n_out && col < m) y[(i64)col * n_out + row] = acc[i][j][e];
            }
}

// `l`: 128 × 128 tiles, 8 warps of 64 × 32; `s`: 64 × 64, 4 warps of 32 × 32. 4 stages.
#define GM_NSTAGE_F 4
#define GEMM_HALF(name, bf)                                                                         \
    extern "C" __global__ void __launch_bounds__(256, 2)                                            \
        gemm_##name##_l(float* y, const u16* w, const u16* x, int n_out, int k, int m) {            \
        PDL_WAIT();                                                                                 \
        PDL_TRIGGER();                                                                              \
        gemm_half<bf, 128, 128, 64, 32, GM_NSTAGE_F>(y, w, x, n_out, k, m);                         \
    }                                                                                               \
    extern "C" __global__ void __launch_bounds__(128, 4)                                            \
        gemm_##name##_s(float* y, const u16* w, const u16* x, int n_out, int k, int m) {            \
        PDL_WAIT();                                                                                 \
        PDL_TRIGGER();                                                                              \
        gemm_half<bf, 64, 64, 32, 32, GM_NSTAGE_F>(y, w, x, n_out, k, m);                           \
    }
GEMM_HALF(f16, false)
GEMM_HALF(bf16, true)

// ---------------------------------------------------------------------------------------------
// Prefill through f16 for quantized weights (not bit-exact): the weights dequantized into halves
// (each value rounded to f16 once) and the activations' quantized values d·q rounded to f16, then
// the f16 GEMM above. The integer GEMMs keep the CPU's exact arithmetic but cost more per output;
// this path trades the last bits (NMSE ~1e-7 on the outputs) for the f16 tensor cores' rate.

// Eight consecutive elements j0 .. j0 + 7 of one block (j0 a multiple of 8), rounded to f16.
template <typename F>
__device__ __forceinline__ void dequant8(u16 (&h)[8], const u8* b, int j0) {
#pragma unroll
    for (int u = 0; u < 8; ++u) h[u] = f32_to_f16(F::get(b, j0 + u));
}
// Q4_K: the eight share one sub-block (scale and min decoded once) and 8 aligned quant bytes
// (144-byte blocks keep 16-byte alignment).
template <>
__device__ __forceinline__ void dequant8<fmt_q4_k>(u16 (&h)[8], const u8* b, int j0) {
    const int c = j0 / 64, hi = (j0 % 64) >= 32, l0 = j0 & 31;
    int sc, m;
    k4_scale_min(b + 4, 2 * c + hi, &sc, &m);
    const float d = load_f16(b) * (float)sc, dm = load_f16(b + 2) * (float)m;
    const uint2 q = *(const uint2*)(b + 16 + 32 * c + l0);
#pragma unroll
    for (int u = 0; u < 8; ++u) {
        const u32 byte = ((u < 4 ? q.x : q.y) >> (8 * (u % 4))) & 0xffu;
        h[u] = f32_to_f16(d * (float)(hi ? (byte >> 4) : (byte & 15u)) - dm);
    }
}
// Q6_K: one scale for the eight (a 16-element group), quant bytes read singly (210-byte blocks).
template <>
__device__ __forceinline__ void dequant8<fmt_q6_k>(u16 (&h)[8], const u8* b, int j0) {
    const int n = j0 / 128, r = j0 % 128, quarter = r / 32, l0 = r % 32;
    const float d = load_f16(b + 208) * (float)(i8)b[192 + 8 * n + l0 / 16 + 2 * quarter];
    const u8* ql = b + 64 * n + (quarter & 1) * 32 + l0;
    const u8* qh = b + 128 + 32 * n + l0;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
        const int lo = quarter >= 2 ? (ql[u] >> 4) : (ql[u] & 15);
        const int hi = (qh[u] >> (2 * quarter)) & 3;
        h[u] = f32_to_f16(d * (float)((lo | (hi << 4)) - 32));
    }
}

// out: [rows, cols] halves (cols a multiple of 16) from weights of format F, [rows, cols /
// F::BLOCK] blocks; one thread per 8 consecutive outputs (one 16-byte store).
template <typename F>
__device__ void dequant_f16(u16* __restrict__ out, const u8* __restrict__ w, int rows, int cols) {
    const int per_row = cols / 8;
    const i64 n = (i64)rows * per_row;
    const i64 row_bytes = (i64)(cols / F::BLOCK) * F::BYTES;
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        const i64 r = o / per_row;
        const int e = (int)(o - r * per_row) * 8;
        const u8* row = w + r * row_bytes;
        u16 h[8];
        if constexpr (F::BLOCK >= 8) {
            dequant8<F>(h, row + (e / F::BLOCK) * F::BYTES, e % F::BLOCK);
        } else {
#pragma unroll
            for (int u = 0; u < 8; ++u) h[u] = f32_to_f16(F::get(row + (e + u) * F::BYTES, 0));
        }
        uint4 v;
        v.x = h[0] | ((u32)h[1] << 16);
        v.y = h[2] | ((u32)h[3] << 16);
        v.z = h[4] | ((u32)h[5] << 16);
        v.w = h[6] | ((u32)h[7] << 16);
        *(uint4*)(out + r * cols + e) = v;
    }
}

#define DEQUANT_F16(name, fmt)                                                                    \
    extern "C" __global__ void gemm_dequant_f16_##name(u16* out, const u8* w, int rows, int cols) { \
        PDL_WAIT();                                                                                \
        PDL_TRIGGER();                                                                             \
        dequant_f16<fmt>(out, w, rows, cols);                                                      \
    }
FOR_EACH_FORMAT(DEQUANT_F16)

// out[i] = f16(d · q[i]) for n quantized activations (quantize.cu's layout): `block` values per
// scale, the scale an f32 at meta + 4·b (Q8_K, f32_scale = 1) or an f16 in the low half of the
// 8 bytes at meta + 8·b (Q8_0, Q8_1).
extern "C" __global__ void gemm_acts_f16(u16* __restrict__ out, const u8* __restrict__ acts, long long meta, int n,
                                         int block, int f32_scale) {
    PDL_WAIT();
    PDL_TRIGGER();
    // Eight activations per thread (n and block are multiples of 8): one 8-byte load of quants,
    // one 16-byte store.
    const int i = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n) return;
    const int b = i / block;
    const float d = f32_scale ? *(const float*)(acts + meta + 4LL * b) : load_f16(acts + meta + 8LL * b);
    const uint2 q = *(const uint2*)(acts + i);
    u32 h[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const u32 word = u < 2 ? q.x : q.y;
        const int s = 16 * (u % 2);
        const u16 a = f32_to_f16(__fmul_rn(d, (float)(i8)(word >> s)));
        const u16 c = f32_to_f16(__fmul_rn(d, (float)(i8)(word >> (s + 8))));
        h[u] = a | ((u32)c << 16);
    }
    *(uint4*)(out + i) = make_uint4(h[0], h[1], h[2], h[3]);
}
