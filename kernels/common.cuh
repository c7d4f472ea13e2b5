// Shared definitions of the synaptix kernels.
//
// Compiled by NVRTC at run time with no CUDA headers available: this file declares what the
// kernels need itself. Activations are f32; weights stay in their stored (ggml) layouts, read
// as bytes; every block type's byte offsets below follow ggml's block structs.
#pragma once

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

#define WARP 32
#define INFINITY __int_as_float(0x7f800000)
#define QK_K 256

// Programmatic dependent launch (sm_90+). The host launches every kernel of these files with
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (crates/kernels-cuda/src/launch.rs), so
// a kernel may start before the previous one on the stream has finished. Every kernel begins
// with PDL_WAIT(), before any global memory access: `griddepcontrol.wait` blocks until every
// prerequisite grid has COMPLETED and its memory operations are visible, which keeps each
// kernel's semantics those of plain stream order. PDL_TRIGGER() (`griddepcontrol.launch_
// dependents`) then lets the next kernel be scheduled while this one runs; that kernel's own
// PDL_WAIT() still waits for this grid to complete, so an early trigger only overlaps launch
// latency and the dependent's pre-wait prologue (nothing). Placed after the wait, at most one
// dependent grid sits waiting at a time. Below sm_90 both compile to nothing (the instructions
// do not exist there, and without PDL the stream serialises the kernels anyway).
//
// The exceptions begin with PDL_WAITS_INSIDE() (which expands to nothing) and read, before their
// PDL_WAIT(), only what no kernel of the step writes: the matvecs start loading their weight
// matrix (read-only), attention_one_pass_f32 the host-written positions and block table and the
// cache rows below every position (written by earlier steps), the decode RMSNorms their norm
// weights. Their DRAM latency then overlaps the previous kernel's tail. The k-quant row
// kernel's LATE form (`matvec_q8_rows_*_late`) waits at its end instead: it is launched only
// after a launch on the same inputs, which had waited for them.
#define PDL_WAITS_INSIDE()
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_WAIT()
#define PDL_TRIGGER()
#endif

// KTRACE (a developer define): kernels that support it print their blocks' global-timer marks
// (ns) at the end, one line a block, for timelines of a step (eager or replayed; see
// scripts/dev/kt.py). Device printf slows the step about twentyfold.
#if defined(KTRACE)
__device__ __forceinline__ unsigned long long ktrace_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// Thread 0's marks (entry, after the wait, end) for kernels without early exits of thread 0.
#define KTRACE_START() const unsigned long long kt0 = ktrace_now()
#define KTRACE_WAITED() const unsigned long long kt1 = ktrace_now()
#define KTRACE_END(tag, a, b)                                                                      \
    if (threadIdx.x == 0)                                                                          \
    printf("KT %s %d %d %d 0 %llu %llu %llu %llu %llu\n", tag, (int)(a), (int)(b), (int)blockIdx.x, kt0, kt1, \
           kt1, ktrace_now(), ktrace_now())
#else
#define KTRACE_START()
#define KTRACE_WAITED()
#define KTRACE_END(tag, a, b)
#endif

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf16_to_f32(u16 b) { return __uint_as_float(((u32)b) << 16); }

__device__ __forceinline__ u16 load_u16(const u8* p) { return *(const u16*)p; }
__device__ __forceinline__ u32 load_u32_unaligned(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}
__device__ __forceinline__ float load_f16(const u8* p) { return f16_to_f32(load_u16(p)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    v = warp_sum(v);
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    const int n_warps = blockDim.x / WARP;
    v = lane < n_warps ? partial[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double block_sum_f64(double v) {
    __shared__ double partial_d[32];
    v = warp_sum_f64(v);
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    __syncthreads();
    if (lane == 0) partial_d[warp] = v;
    __syncthreads();
    const int n_warps = blockDim.x / WARP;
    v = lane < n_warps ? partial_d[lane] : 0.0;
    return warp_sum_f64(v);
}

// RMSNorm of one row of `cols` values (cols % 4 == 0, at most 16 * blockDim.x) in registers:
// thread t holds float4 t + j * blockDim.x (j < 4) of the row, out[j] = x * scale * w there. The
// norm weights are read before the PDL wait (no kernel writes them), the row after it. f32
// squares summed in f64, 1 / sqrtf(mean + eps), then the scale, then the weight: the CPU's
// operations, so the same values.
__device__ __forceinline__ void rms_norm_row4(const float4* __restrict__ xr, const float4* __restrict__ wr, int cols,
                                              float eps, float4 (&out)[4]) {
    const int n4 = cols / 4;
    float4 g[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < n4) g[j] = wr[i];
    }
    PDL_WAIT();
    PDL_TRIGGER();
    double ss = 0.0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < n4) {
            out[j] = xr[i];
            ss += (double)__fmul_rn(out[j].x, out[j].x) + (double)__fmul_rn(out[j].y, out[j].y) +
                  (double)__fmul_rn(out[j].z, out[j].z) + (double)__fmul_rn(out[j].w, out[j].w);
        }
    }
    ss = block_sum_f64(ss);
    const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)(ss / (double)cols), eps)));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        if (threadIdx.x + j * blockDim.x >= n4) continue;
        const float4 v = out[j];
        out[j] = make_float4(__fmul_rn(__fmul_rn(v.x, scale), g[j].x), __fmul_rn(__fmul_rn(v.y, scale), g[j].y),
                             __fmul_rn(__fmul_rn(v.z, scale), g[j].z), __fmul_rn(__fmul_rn(v.w, scale), g[j].w));
    }
}

__device__ __forceinline__ float block_max(float v) {
    __shared__ float partial[32];
    v = warp_max(v);
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    const int n_warps = blockDim.x / WARP;
    v = lane < n_warps ? partial[lane] : -INFINITY;
    return warp_max(v);
}

// ---------------------------------------------------------------------------------------------
// Arithmetic of llama.cpp's portable CPU build (the reference synaptix's CPU path reproduces),
// with rounding intrinsics so that no multiply-add is fused where the reference has two ops.

__device__ __forceinline__ float madd_rn(float a, float b, float c) { return __fadd_rn(__fmul_rn(a, b), c); }

// ggml's SSE2 polynomial exp (range reduction by ln 2, degree-5 polynomial, scaling beyond
// |n| > 126, flush beyond 192), lane for lane.
__device__ __forceinline__ float ggml_expf(float x) {
    const float r = __int_as_float(0x4b400000);
    const float z = madd_rn(x, __int_as_float(0x3fb8aa3b), r);
    const float n = __fsub_rn(z, r);
    const float b = __fsub_rn(__fsub_rn(x, __fmul_rn(n, __int_as_float(0x3f317200))),
                              __fmul_rn(n, __int_as_float(0x35bfbe8e)));
    const u32 e = __float_as_uint(z) << 23;
    const float k = __uint_as_float(e + 0x3f800000u);
    const float u = __fmul_rn(b, b);
    const float j = madd_rn(madd_rn(madd_rn(__int_as_float(0x3c072010), b, __int_as_float(0x3d2b9f17)), u,
                                    madd_rn(__int_as_float(0x3e2aaf33), b, __int_as_float(0x3efffedb))),
                            u, __fmul_rn(__int_as_float(0x3f7ffff6), b));
    if (fabsf(n) <= 126.0f) return madd_rn(j, k, k);
    const u32 g = n <= 0.0f ? 0x82000000u : 0u;
    const float s1 = __uint_as_float(g + 0x7f000000u);
    const float s2 = __uint_as_float(e - g);
    if (fabsf(n) > 192.0f) return __fmul_rn(s1, s1);
    return __fmul_rn(madd_rn(s2, j, s2), s1);
}

// The gated activations of an MLP, as ggml's CPU computes them. SiLU · up for element `c` of a
// row of `cols`: ggml's polynomial exp for the row's groups of four, libm-style expf for its tail.
__device__ __forceinline__ float swiglu_one(float g, float u, int c, int cols) {
    const float e = c < cols / 4 * 4 ? ggml_expf(__fsub_rn(0.0f, g)) : expf(-g);
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, e)), u);
}
// GELU (tanh approximation) · up, GELU looked up in ggml's table of f16 values (65536 entries
// indexed by the input's f16 bits), saturating outside ±10.
__device__ __forceinline__ float geglu_one(float g, float u, const u16* table) {
    const float a = g <= -10.0f ? 0.0f : (g >= 10.0f ? g : f16_to_f32(table[f32_to_f16(g)]));
    return __fmul_rn(a, u);
}

// ---------------------------------------------------------------------------------------------
// Block formats: element `j` of one block, dequantized. `BLOCK` elements in `BYTES` bytes.

struct fmt_f32 {
    static constexpr int BLOCK = 1, BYTES = 4;
    __device__ static float get(const u8* b, int) { return *(const float*)b; }
};
struct fmt_f16 {
    static constexpr int BLOCK = 1, BYTES = 2;
    __device__ static float get(const u8* b, int) { return load_f16(b); }
};
struct fmt_bf16 {
    static constexpr int BLOCK = 1, BYTES = 2;
    __device__ static float get(const u8* b, int) { return bf16_to_f32(load_u16(b)); }
};
// d | qs[16]: element j < 16 in the low nibble of qs[j], j >= 16 in the high nibble of qs[j-16].
struct fmt_q4_0 {
    static constexpr int BLOCK = 32, BYTES = 18;
    __device__ static float get(const u8* b, int j) {
        const u8 q = b[2 + (j & 15)];
        return load_f16(b) * (float)((j < 16 ? (q & 15) : (q >> 4)) - 8);
    }
};
struct fmt_q4_1 {
    static constexpr int BLOCK = 32, BYTES = 20;
    __device__ static float get(const u8* b, int j) {
        const u8 q = b[4 + (j & 15)];
        return load_f16(b) * (float)(j < 16 ? (q & 15) : (q >> 4)) + load_f16(b + 2);
    }
};
// d | qh (32 fifth bits) | qs[16].
struct fmt_q5_0 {
    static constexpr int BLOCK = 32, BYTES = 22;
    __device__ static float get(const u8* b, int j) {
        const u32 qh = load_u32_unaligned(b + 2);
        const u8 q = b[6 + (j & 15)];
        const int lo = j < 16 ? (q & 15) : (q >> 4);
        const int hi = (int)((qh >> j) & 1u) << 4;  // signed: the -16 below must not wrap
        return load_f16(b) * (float)((lo | hi) - 16);
    }
};
struct fmt_q5_1 {
    static constexpr int BLOCK = 32, BYTES = 24;
    __device__ static float get(const u8* b, int j) {
        const u32 qh = *(const u32*)(b + 4);
        const u8 q = b[8 + (j & 15)];
        const int lo = j < 16 ? (q & 15) : (q >> 4);
        const int hi = (int)((qh >> j) & 1u) << 4;
        return load_f16(b) * (float)(lo | hi) + load_f16(b + 2);
    }
};
struct fmt_q8_0 {
    static constexpr int BLOCK = 32, BYTES = 34;
    __device__ static float get(const u8* b, int j) { return load_f16(b) * (float)(i8)b[2 + j]; }
};
// ggml's `kvalues_iq4nl` as four little-endian words of signed bytes (entry i in byte i % 4 of
// word i / 4): the values an IQ4_NL / IQ4_XS code stands for.
#define IQ4_TABLE0 0xbfad9881u  // -127 -104 -83 -65
#define IQ4_TABLE1 0xf6eaddcfu  // -49 -35 -22 -10
#define IQ4_TABLE2 0x26190d01u  // 1 13 25 38
#define IQ4_TABLE3 0x71594535u  // 53 69 89 113
__device__ __forceinline__ int iq4_value(int code) {
    const u32 w = code < 8 ? (code < 4 ? IQ4_TABLE0 : IQ4_TABLE1) : (code < 12 ? IQ4_TABLE2 : IQ4_TABLE3);
    return (int)(i8)(u8)(w >> (8 * (code & 3)));
}
// Four codes (one a byte, each 0..15) to the four table values (signed bytes) in place.
__device__ __forceinline__ u32 iq4_lookup4(u32 codes) {
    // Byte k's low three bits select among eight table bytes (selector nibble k), bit 3 picks
    // the low or the high half of the table.
    const u32 sel = (codes & 7u) | ((codes >> 4) & 0x70u) | ((codes >> 8) & 0x700u) | ((codes >> 12) & 0x7000u);
    const u32 lo = __byte_perm(IQ4_TABLE0, IQ4_TABLE1, sel), hi = __byte_perm(IQ4_TABLE2, IQ4_TABLE3, sel);
    const u32 high = ((codes >> 3) & 0x01010101u) * 0xffu;
    return (lo & ~high) | (hi & high);
}
// d | qs[16]: element j < 16 is code qs[j] & 15, element j + 16 code qs[j] >> 4; value d * T[code].
struct fmt_iq4_nl {
    static constexpr int BLOCK = 32, BYTES = 18;
    __device__ static float get(const u8* b, int j) {
        const u8 q = b[2 + (j & 15)];
        return load_f16(b) * (float)iq4_value(j < 16 ? (q & 15) : (q >> 4));
    }
};
// IQ4_XS as the GPU holds it (`DeviceMatrix::upload` rewrites each 136-byte super-block as eight
// 20-byte blocks): d (the super-block's f16) | l - 32 (i8, the sub-block's 6-bit scale) | 0 |
// qs[16] as IQ4_NL's; value (d * (l - 32)) * T[code], ggml's dequantization.
struct fmt_iq4_xs {
    static constexpr int BLOCK = 32, BYTES = 20;
    __device__ static float get(const u8* b, int j) {
        const u8 q = b[4 + (j & 15)];
        return (load_f16(b) * (float)(i8)b[2]) * (float)iq4_value(j < 16 ? (q & 15) : (q >> 4));
    }
};
// scales[16] (low nibble scale, high nibble min) | qs[64] | d | dmin.
struct fmt_q2_k {
    static constexpr int BLOCK = QK_K, BYTES = 84;
    __device__ static float get(const u8* b, int e) {
        const int n = e / 128, r = e % 128, j = r / 32, l32 = r % 32;
        const u8 sc = b[n * 8 + j * 2 + l32 / 16];
        const int q = (b[16 + n * 32 + l32] >> (2 * j)) & 3;
        return load_f16(b + 80) * (float)(sc & 15) * (float)q - load_f16(b + 82) * (float)(sc >> 4);
    }
};
// hmask[32] | qs[64] | scales[12] (16 six-bit scales, offset 32) | d.
struct fmt_q3_k {
    static constexpr int BLOCK = QK_K, BYTES = 110;
    __device__ static int scale(const u8* s, int i) {
        const int lo = i < 8 ? (s[i] & 15) : (s[i - 8] >> 4);
        const int hi = (s[8 + (i & 3)] >> (2 * (i / 4))) & 3;
        return (lo | (hi << 4)) - 32;
    }
    __device__ static float get(const u8* b, int e) {
        const int n = e / 128, r = e % 128, j = r / 32, l32 = r % 32;
        const int q = (b[32 + n * 32 + l32] >> (2 * j)) & 3;
        const int high = (b[l32] >> (n * 4 + j)) & 1;
        return load_f16(b + 108) * (float)scale(b + 96, n * 8 + j * 2 + l32 / 16) * (float)(q - (high ? 0 : 4));
    }
};
// The 6-bit scale and min `j` (0..8) of a Q4_K / Q5_K super-block.
__device__ __forceinline__ void k4_scale_min(const u8* s, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}
// d | dmin | scales[12] | qs[128].
struct fmt_q4_k {
    static constexpr int BLOCK = QK_K, BYTES = 144;
    __device__ static float get(const u8* b, int e) {
        const int c = e / 64, r = e % 64, hi = r >= 32;
        int sc, m;
        k4_scale_min(b + 4, 2 * c + hi, &sc, &m);
        const u8 q = b[16 + 32 * c + (r & 31)];
        return load_f16(b) * (float)sc * (float)(hi ? (q >> 4) : (q & 15)) - load_f16(b + 2) * (float)m;
    }
};
// d | dmin | scales[12] | qh[32] | qs[128].
struct fmt_q5_k {
    static constexpr int BLOCK = QK_K, BYTES = 176;
    __device__ static float get(const u8* b, int e) {
        const int c = e / 64, r = e % 64, hi = r >= 32, l = r & 31;
        int sc, m;
        k4_scale_min(b + 4, 2 * c + hi, &sc, &m);
        const u8 q = b[48 + 32 * c + l];
        const int v = (hi ? (q >> 4) : (q & 15)) + (((b[16 + l] >> (2 * c + hi)) & 1) << 4);
        return load_f16(b) * (float)sc * (float)v - load_f16(b + 2) * (float)m;
    }
};
// ql[128] | qh[64] | scales[16] (int8) | d.
struct fmt_q6_k {
    static constexpr int BLOCK = QK_K, BYTES = 210;
    __device__ static float get(const u8* b, int e) {
        const int n = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
        const u8 ql = b[64 * n + l + (quarter & 1) * 32];
        const int lo = quarter >= 2 ? (ql >> 4) : (ql & 15);
        const int hi = (b[128 + 32 * n + l] >> (2 * quarter)) & 3;
        const int sc = (i8)b[192 + 8 * n + l / 16 + 2 * quarter];
        return load_f16(b + 208) * (float)sc * (float)((lo | (hi << 4)) - 32);
    }
};

// Instantiates `MACRO(name, fmt)` for every executed weight format.
#define FOR_EACH_FORMAT(MACRO) \
    MACRO(f32, fmt_f32)        \
    MACRO(f16, fmt_f16)        \
    MACRO(bf16, fmt_bf16)      \
    MACRO(q4_0, fmt_q4_0)      \
    MACRO(q4_1, fmt_q4_1)      \
    MACRO(q5_0, fmt_q5_0)      \
    MACRO(q5_1, fmt_q5_1)      \
    MACRO(q8_0, fmt_q8_0)      \
    MACRO(q2_k, fmt_q2_k)      \
    MACRO(q3_k, fmt_q3_k)      \
    MACRO(q4_k, fmt_q4_k)      \
    MACRO(q5_k, fmt_q5_k)      \
    MACRO(q6_k, fmt_q6_k)      \
    MACRO(iq4_nl, fmt_iq4_nl)  \
    MACRO(iq4_xs, fmt_iq4_xs)

// ---------------------------------------------------------------------------------------------
// Asynchronous copies and fragment loads (sm_80+, inline PTX: NVRTC has no CUDA headers), for
// the GEMM files.

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared, bypassing L1; bytes from `n` on are zero-filled (n = 0: nothing is
// read).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int n) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
// 8 and 4 bytes (through L1: .cg only exists for 16).
__device__ __forceinline__ void cp_async8(u32 dst, const void* src, int n) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async4(u32 dst, const void* src, int n) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's latest copy groups are in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Four 8 × 8 b16 matrices from shared memory (lanes 8i .. 8i+7 give the row addresses of
// matrix i; register i of lane l is bytes 4(l % 4) .. +3 of row l / 4 of matrix i).
__device__ __forceinline__ void ldmatrix4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// ---------------------------------------------------------------------------------------------
// Rotary position embedding of one pair (rope.cu, attention.cu).

// Pair i of a head of n_rot rotated dimensions: elements (2i, 2i + 1), or (i, i + n_rot / 2)
// with neox; rotated by the (cos, sin) at cs[2i], cs[2i + 1] of the row's table, as the CPU
// reference does, then multiplied by `scale` when `scaled`. The caller stores r0 at a, r1 at b.
struct rope_pair {
    int a, b;
    float r0, r1;
};
__device__ __forceinline__ rope_pair rope_rotate(const float* head, const float* cs_row, int i, int half, int neox,
                                                 bool scaled, float scale) {
    const float c = cs_row[2 * i], s = cs_row[2 * i + 1];
    rope_pair p;
    p.a = neox ? i : 2 * i;
    p.b = neox ? i + half : 2 * i + 1;
    const float x0 = head[p.a], x1 = head[p.b];
    p.r0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    p.r1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    if (scaled) {
        p.r0 = __fmul_rn(p.r0, scale);
        p.r1 = __fmul_rn(p.r1, scale);
    }
    return p;
}

// The better of two (value, index) candidates: the larger value, the lower index on equal values
// (NaN never wins: it is never greater nor equal). Associative and commutative, so any reduction
// order gives the same pick.
__device__ __forceinline__ void argmax_take(float& bv, int& bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}
__device__ __forceinline__ void argmax_warp(float& bv, int& bi) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float v = __shfl_down_sync(0xffffffffu, bv, off);
        const int i = __shfl_down_sync(0xffffffffu, bi, off);
        argmax_take(bv, bi, v, i);
    }
}
// Ends an argmax over many blocks: every thread of the block calls it with its candidate (its
// first maximum); the block's best goes to partial_v / partial_i [blockIdx.x], and the last block
// to finish (counted by `done`, which atomicInc returns to 0 for the next launch; zero before the
// first) reduces the partials with its first warp and writes the index to out[0] (0 when nothing
// beats -inf). At most 32 warps a block.
__device__ __forceinline__ void argmax_blocks_end(float bv, int bi, i32* out, float* partial_v, int* partial_i,
                                                  unsigned int* done) {
    __shared__ float warp_v[32];
    __shared__ int warp_i[32];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, n_warps = blockDim.x / WARP;
    argmax_warp(bv, bi);
    if (lane == 0) {
        warp_v[warp] = bv;
        warp_i[warp] = bi;
    }
    __syncthreads();
    if (warp != 0) return;
    bv = lane < n_warps ? warp_v[lane] : -INFINITY;
    bi = lane < n_warps ? warp_i[lane] : 0x7fffffff;
    argmax_warp(bv, bi);
    int last = 0;
    if (lane == 0) {
        partial_v[blockIdx.x] = bv;
        partial_i[blockIdx.x] = bi;
        __threadfence();  // the partial is visible before the count says so
        last = atomicInc(done, gridDim.x - 1) == gridDim.x - 1;
    }
    if (!__shfl_sync(0xffffffffu, last, 0)) return;
    __threadfence();
    bv = -INFINITY;
    bi = 0x7fffffff;
    for (int b = lane; b < gridDim.x; b += WARP)
        argmax_take(bv, bi, ((volatile float*)partial_v)[b], ((volatile int*)partial_i)[b]);
    argmax_warp(bv, bi);
    if (lane == 0) out[0] = bi == 0x7fffffff ? 0 : bi;
}
