// y = x · Wᵀ on Hopper's warpgroup tensor cores (wgmma, compiled for sm_90a only), for prefill
// with F16 / BF16 halves: the F16 / BF16 weights as stored, or quantized weights dequantized by
// gemm.cu's f16 route. Same contract as gemm.cu's gemm_half (W: [n_out, k] halves, x: [m, k]
// halves already rounded, y: [m, n_out] f32 row-major, k a multiple of 16) and the same
// arithmetic class: f16 / bf16 products, f32 sums in the tensor cores' order.
//
// A thread block of WGS warpgroups (128 threads each) computes BM = 64·WGS weight rows × BN
// activation rows of y; warpgroup g owns weight rows 64g .. 64g + 63 and all BN activation
// rows: one `wgmma.m64nBNk16` per 16 elements of k, its D fragment (BN / 2 f32 per thread) held
// in registers for the whole k loop.
//
// Operands are staged k-major in shared memory, 64 elements of k (128 bytes) per row and stage,
// in the 128-byte swizzled layout wgmma reads through its matrix descriptors: 16-byte chunk c of
// row r at r·128 + 16·(c ^ (r % 8)) from a 1024-byte-aligned tile (so the 8 rows of one 8 × 16
// byte core matrix, which wgmma reads together, sit in 8 distinct bank groups). Descriptor of a
// K-major, 128-byte-swizzled operand: start address / 16 (bits 0-13), leading byte offset / 16
// (bits 16-29; unused with this swizzle when a row holds the whole k step), stride byte offset
// / 16 (bits 32-45: 1024, from one 8-row group to the next), swizzle mode 1 (128 bytes, bits
// 62-63). The k steps inside a staged row start 32 bytes apart: the descriptor's start address
// moves by 2 (the hardware applies the swizzle to the full address).
//
// Pipeline (cp.async from every thread, NSTAGE ring slots): stage s is computed while stages
// s + 1 .. s + NSTAGE - 2 load and stage s - 1's wgmma may still run; the copy for stage
// s + NSTAGE - 2 goes into the slot of stage s - 2, whose wgmma every warpgroup has waited for
// (wgmma.wait_group 1 at the end of iteration s - 1, then the barrier of iteration s). cp.async
// writes through the generic proxy and wgmma reads through the async proxy, hence the
// `fence.proxy.async` between a thread's landed copies and the barrier.
//
// D fragment of m64nN (PTX ISA, "wgmma D matrix fragment"): warp w of the warpgroup holds rows
// 16w .. 16w + 15; lane l (g = l / 4, t = l % 4) holds, for each 8-column group j, d[4j] =
// (16w + g, 8j + 2t), d[4j + 1] = (16w + g, 8j + 2t + 1), d[4j + 2] = (16w + g + 8, 8j + 2t),
// d[4j + 3] = (16w + g + 8, 8j + 2t + 1). Rows are weight rows, columns activation rows.
#include "common.cuh"

// Makes this thread's generic-proxy writes to shared memory (its landed cp.async copies) visible
// to the async proxy that wgmma reads through.
__device__ __forceinline__ void wg_fence_proxy() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of an accumulator across a wgmma wait.
__device__ __forceinline__ void wg_pin(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// Descriptor of a K-major operand with 128-byte swizzle at shared address `addr` (1024-byte
// aligned tile; see the top).
__device__ __forceinline__ u64 wg_desc(u32 addr) {
    return (u64)((addr & 0x3ffffu) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

// wgmma.m64nNk16 with f32 accumulators: D (64 × N, N / 2 registers per thread) += A (64 × 16)
// · B (16 × N), both from shared memory through descriptors; scale-d = 1 (accumulate), no
// negation, no transpose (both operands K-major). The accumulator operands come in groups of
// 32: WG_R<i> names registers %32i .. %32i+31 in the instruction, WG_ACC(a) binds d[a .. a+31].
#define WG_R0                                                         \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_R1                                                         \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_R2                                                         \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define WG_R3                                                         \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WG_ACC(a) \
    "+f"(d[(a) + 0]), "+f"(d[(a) + 1]), "+f"(d[(a) + 2]), "+f"(d[(a) + 3]), \
    "+f"(d[(a) + 4]), "+f"(d[(a) + 5]), "+f"(d[(a) + 6]), "+f"(d[(a) + 7]), \
    "+f"(d[(a) + 8]), "+f"(d[(a) + 9]), "+f"(d[(a) + 10]), "+f"(d[(a) + 11]), \
    "+f"(d[(a) + 12]), "+f"(d[(a) + 13]), "+f"(d[(a) + 14]), "+f"(d[(a) + 15]), \
    "+f"(d[(a) + 16]), "+f"(d[(a) + 17]), "+f"(d[(a) + 18]), "+f"(d[(a) + 19]), \
    "+f"(d[(a) + 20]), "+f"(d[(a) + 21]), "+f"(d[(a) + 22]), "+f"(d[(a) + 23]), \
    "+f"(d[(a) + 24]), "+f"(d[(a) + 25]), "+f"(d[(a) + 26]), "+f"(d[(a) + 27]), \
    "+f"(d[(a) + 28]), "+f"(d[(a) + 29]), "+f"(d[(a) + 30]), "+f"(d[(a) + 31])
// One instruction: N columns, TY f16 or bf16, REGS the register list, DA / DB / P the operand
// numbers of the descriptors and of the scale-d flag, then the bound accumulators.
#define WG_MMA(N, TY, REGS, DA, DB, P, ...)                                                            \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n"                                         \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #TY "." #TY " {" REGS "}, "         \
                 "%" #DA ", %" #DB ", p, 1, 1, 0, 0;\n}\n"                                            \
                 : __VA_ARGS__                                                                      \
                 : "l"(da), "l"(db), "r"(1))

template <bool BF16>
__device__ __forceinline__ void wg_mma_n64(float (&d)[32], u64 da, u64 db) {
    if (BF16) {
        WG_MMA(64, bf16, WG_R0, 32, 33, 34, WG_ACC(0));
    } else {
        WG_MMA(64, f16, WG_R0, 32, 33, 34, WG_ACC(0));
    }
}
template <bool BF16>
__device__ __forceinline__ void wg_mma_n128(float (&d)[64], u64 da, u64 db) {
    if (BF16) {
        WG_MMA(128, bf16, WG_R0 ", " WG_R1, 64, 65, 66, WG_ACC(0), WG_ACC(32));
    } else {
        WG_MMA(128, f16, WG_R0 ", " WG_R1, 64, 65, 66, WG_ACC(0), WG_ACC(32));
    }
}
template <bool BF16>
__device__ __forceinline__ void wg_mma_n192(float (&d)[96], u64 da, u64 db) {
    if (BF16) {
        WG_MMA(192, bf16, WG_R0 ", " WG_R1 ", " WG_R2, 96, 97, 98, WG_ACC(0), WG_ACC(32),
               WG_ACC(64));
    } else {
        WG_MMA(192, f16, WG_R0 ", " WG_R1 ", " WG_R2, 96, 97, 98, WG_ACC(0), WG_ACC(32),
               WG_ACC(64));
    }
}
template <bool BF16>
__device__ __forceinline__ void wg_mma_n256(float (&d)[128], u64 da, u64 db) {
    if (BF16) {
        WG_MMA(256, bf16, WG_R0 ", " WG_R1 ", " WG_R2 ", " WG_R3, 128, 129, 130, WG_ACC(0),
               WG_ACC(32), WG_ACC(64), WG_ACC(96));
    } else {
        WG_MMA(256, f16, WG_R0 ", " WG_R1 ", " WG_R2 ", " WG_R3, 128, 129, 130, WG_ACC(0),
               WG_ACC(32), WG_ACC(64), WG_ACC(96));
    }
}

template <bool BF16, int N>
__device__ __forceinline__ void wg_mma(float (&d)[N / 2], u64 da, u64 db) {
    if constexpr (N == 64) wg_mma_n64<BF16>(d, da, db);
    else if constexpr (N == 128) wg_mma_n128<BF16>(d, da, db);
    else if constexpr (N == 192) wg_mma_n192<BF16>(d, da, db);
    else wg_mma_n256<BF16>(d, da, db);
}

// One block's tile: weight rows row0 .. row0 + BM of w ([n_out, k] halves) against activation
// rows blockIdx.y · BN .. + BN of x; y[i][r] = Σ x[i]·w[r], then + bias[r] when bias is not null,
// then + res[i][r] when res is not null: one f32 addition each, as separate bias and residual
// passes would do. Block: 128·WGS threads; dynamic shared memory: NSTAGE · (BM + BN) · 128
// bytes + 1024 (alignment).
template <bool BF16, int WGS, int BN, int NSTAGE>
__device__ void gemm_wg(float* __restrict__ y, const u16* __restrict__ w, const float* __restrict__ bias,
                        const float* __restrict__ res, int n_out, int row0, const u16* __restrict__ x, int k,
                        int m) {
    constexpr int BM = 64 * WGS, NT = 128 * WGS;
    constexpr int A_BYTES = BM * 128, SLOT = (BM + BN) * 128;
    // 16-byte copies per thread and stage (the last round partial when (BM + BN)·8 is not a
    // multiple of NT).
    constexpr int COPIES = ((BM + BN) * 8 + NT - 1) / NT;
    static_assert(NSTAGE >= 3, "one slot computing, one draining, at least one loading");
    static_assert(NT % 8 == 0, "a thread's chunk of a row is the same in every copy");
    extern __shared__ __align__(16) u8 wg_shared[];
    const u32 base = (smem_addr(wg_shared) + 1023u) & ~1023u;

    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP, group = tid / 128;
    const int m0 = blockIdx.y * BN;
    const int n_steps = (k + 63) / 64;

    // Stage s: chunk ch (8 elements) of tile row r; rows past n_out / m and chunks past k are
    // zero-filled. A thread's chunk index is the same in every copy (NT is a multiple of 8), and
    // so is its swizzled position (r % 8 too).
    auto issue = [&](int s) {
        if (s >= n_steps) return;
        const u32 slot = base + (u32)((s % NSTAGE) * SLOT);
        const int e = s * 64 + 8 * (tid % 8);
#pragma unroll
        for (int c = 0; c < COPIES; ++c) {
            const int r = tid / 8 + c * (NT / 8);
            if ((BM + BN) * 8 % NT != 0 && r >= BM + BN) break;
            const bool is_w = r < BM;
            const int row = is_w ? row0 + r : m0 + (r - BM);
            const bool ok = (is_w ? row < n_out : row < m) && e < k;
            const u16* src = is_w ? w : x;
            src = ok ? src + (i64)row * k + e : src;
            cp_async16(slot + r * 128 + (((tid % 8) ^ (r % 8)) << 4), src, ok ? 16 : 0);
        }
    };

    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;

#pragma unroll
    for (int s = 0; s < NSTAGE - 2; ++s) {
        issue(s);
        cp_async_commit();  // one group per stage, empty ones too: the wait below counts groups
    }
    for (int s = 0; s < n_steps; ++s) {
        cp_async_wait<NSTAGE - 3>();  // this thread's copies of stage s have landed
        wg_fence_proxy();
        // Every thread's copies of stage s are visible to wgmma; every warpgroup has waited for
        // its wgmma of stage s - 2, whose slot the next copies reuse.
        __syncthreads();
        issue(s + NSTAGE - 2);
        cp_async_commit();

        const u32 slot = base + (u32)((s % NSTAGE) * SLOT);
        const u64 da = wg_desc(slot + group * 64 * 128);
        const u64 db = wg_desc(slot + A_BYTES);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wg_mma<BF16, BN>(acc, da + 2 * kk, db + 2 * kk);
        wg_commit();
        wg_wait<1>();
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) wg_pin(acc[i]);
    }
    wg_wait<0>();
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) wg_pin(acc[i]);
    cp_async_wait<0>();  // no copy may outlive the block (the trailing groups are empty)

    // The tile goes out through shared memory, free once every warpgroup's wgmma is done (each
    // waited for its own; the barrier joins them): acc (+ bias) as [BN activation rows][BM + 4]
    // f32 (the padding puts the 8 rows × 4 columns of one warp store on 32 distinct banks),
    // then each thread takes 4 consecutive weight rows of one activation row: 16-byte loads
    // of the residual and stores of y, a warp covering 512 contiguous bytes.
    constexpr int TS = BM + 4;
    static_assert(BN * TS * 4 <= NSTAGE * SLOT, "the output tile fits in the ring");
    wg_fence_proxy();  // the async-proxy reads of the ring are ordered before the writes below
    __syncthreads();
    float* const tile_out = (float*)(wg_shared + (base - smem_addr(wg_shared)));
    const int g = lane / 4, t = lane % 4;
    const int lrow = group * 64 + (warp % 4) * 16 + g;  // this thread's first row in the tile
    float b[2] = {0.0f, 0.0f};
    if (bias != nullptr) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + lrow + 8 * h;
            b[h] = row < n_out ? bias[row] : 0.0f;
        }
    }
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float v = acc[4 * j + e];
            if (bias != nullptr) v = __fadd_rn(v, b[e / 2]);
            tile_out[(8 * j + 2 * t + e % 2) * TS + lrow + 8 * (e / 2)] = v;
        }
    __syncthreads();
    const bool vec = n_out % 4 == 0;  // 16-byte aligned rows of y and of the residual
    for (int i = tid; i < BN * (BM / 4); i += NT) {
        const int c = i / (BM / 4), r = (i % (BM / 4)) * 4;
        const int col = m0 + c, row = row0 + r;
        if (col >= m || row >= n_out) continue;
        const float4 v = *(const float4*)(tile_out + c * TS + r);
        const i64 at = (i64)col * n_out + row;
        if (vec && row + 4 <= n_out) {
            float4 o = v;
            if (res != nullptr) {
                const float4 q = *(const float4*)(res + at);
                o = make_float4(__fadd_rn(q.x, v.x), __fadd_rn(q.y, v.y), __fadd_rn(q.z, v.z), __fadd_rn(q.w, v.w));
            }
            *(float4*)(y + at) = o;
        } else {
            const float vs[4] = {v.x, v.y, v.z, v.w};
            for (int u = 0; u < 4 && row + u < n_out; ++u)
                y[at + u] = res != nullptr ? __fadd_rn(res[at + u], vs[u]) : vs[u];
        }
    }
}

// Up to three matrices with the same row length against the same x (Q, K and V; gate and up)
// in one launch, each with its own bias and residual (null: none): the grid's x blocks are part
// 0's row tiles, then part 1's, then part 2's (rows = 0 for an absent part). Grid:
// (Σ ceil(rows_p / BM), ceil(m / BN)).
template <bool BF16, int WGS, int BN, int NSTAGE>
__device__ __forceinline__ void gemm_wg_parts(float* y0, const u16* w0, const float* b0, const float* r0,
                                              int rows0, float* y1, const u16* w1, const float* b1,
                                              const float* r1, int rows1, float* y2, const u16* w2,
                                              const float* b2, const float* r2, int rows2, const u16* x, int k,
                                              int m) {
    constexpr int BM = 64 * WGS;
    const int t0 = (rows0 + BM - 1) / BM, t1 = (rows1 + BM - 1) / BM;
    const int tile = blockIdx.x;
    if (tile < t0) {
        gemm_wg<BF16, WGS, BN, NSTAGE>(y0, w0, b0, r0, rows0, tile * BM, x, k, m);
    } else if (tile < t0 + t1) {
        gemm_wg<BF16, WGS, BN, NSTAGE>(y1, w1, b1, r1, rows1, (tile - t0) * BM, x, k, m);
    } else {
        gemm_wg<BF16, WGS, BN, NSTAGE>(y2, w2, b2, r2, rows2, (tile - t0 - t1) * BM, x, k, m);
    }
}

// Tiles: `w2n128` 128 weight rows × 128 activation rows (two warpgroups, 4 stages: 129 KiB, one
// block per SM); `w2n256` 128 × 256 (3 stages, 145 KiB); `w2n192` 128 × 192 and `w3n128`
// 192 × 128 (4 stages, 161 KiB: one wave where 128 × 128 tiles need a few blocks more than the
// GPU has SMs); `w1n128` 64 × 128 (4 stages, 97 KiB, two blocks per SM); `w1n64` 64 × 64
// (4 stages, 65 KiB, three blocks per SM).
#define GEMM_WG(name, bf, wgs, bn, nstage)                                                           \
    extern "C" __global__ void __launch_bounds__(128 * wgs, 1)                                       \
        name(float* y0, const u16* w0, const float* b0, const float* r0, int rows0, float* y1,       \
             const u16* w1, const float* b1, const float* r1, int rows1, float* y2, const u16* w2,   \
             const float* b2, const float* r2, int rows2, const u16* x, int k, int m) {              \
        PDL_WAIT();                                                                                  \
        PDL_TRIGGER();                                                                               \
        gemm_wg_parts<bf, wgs, bn, nstage>(y0, w0, b0, r0, rows0, y1, w1, b1, r1, rows1, y2, w2, b2, \
                                           r2, rows2, x, k, m);                                      \
    }
GEMM_WG(gemm_wg_f16_w2n128, false, 2, 128, 4)
GEMM_WG(gemm_wg_f16_w2n256, false, 2, 256, 3)
GEMM_WG(gemm_wg_f16_w2n192, false, 2, 192, 4)
GEMM_WG(gemm_wg_f16_w3n128, false, 3, 128, 4)
GEMM_WG(gemm_wg_f16_w1n128, false, 1, 128, 4)
GEMM_WG(gemm_wg_f16_w1n64, false, 1, 64, 4)
GEMM_WG(gemm_wg_bf16_w2n128, true, 2, 128, 4)
GEMM_WG(gemm_wg_bf16_w2n256, true, 2, 256, 3)
GEMM_WG(gemm_wg_bf16_w2n192, true, 2, 192, 4)
GEMM_WG(gemm_wg_bf16_w3n128, true, 3, 128, 4)
GEMM_WG(gemm_wg_bf16_w1n128, true, 1, 128, 4)
GEMM_WG(gemm_wg_bf16_w1n64, true, 1, 64, 4)
