// Activation quantizers: f32 rows to the 8-bit formats ggml pairs with quantized weights,
// bit for bit with ggml's reference C (`quantize_row_q8_0_ref`, `_q8_1_ref`, `_q8_K_ref`, as
// synaptix-kernels-cpu reproduces them), including its handling of zeros, ties, tiny scales,
// infinities and NaN. Every float operation is an explicit round-to-nearest intrinsic, so the
// compiler cannot contract a multiply and an add into an FMA that the C code does not have.
//
// Output layout (one byte buffer `out`, offsets in bytes; rows of `k` elements, `k` a multiple of
// the block length, all rows back to back):
// - quants: `i8 qs[rows * k]` at `out`;
// - Q8_0 / Q8_1: per 32-element block a `u32` with the half bits of `d` (low 16) and, for Q8_1,
//   of `s = d * Σq` (high 16), then the block's `i32 Σq`: 8 bytes per block at `out + meta`;
// - Q8_K: per 256-element block `f32 d` at `out + meta` and sixteen `i16` sums of 16 quants at
//   `out + bsums`.
#include "common.cuh"

#define Q8_FULL 0xffffffffu

// ggml's FP32_TO_FP16: round to nearest even; NaN becomes 0x7e00 with the input's sign (the
// hardware conversion would give 0x7fff).
__device__ __forceinline__ u16 q8_f32_to_f16(float f) {
    if (f != f) return (u16)(((__float_as_uint(f) >> 16) & 0x8000u) | 0x7e00u);
    return f32_to_f16(f);
}

// `a * b` with the NaN an x86 CPU produces: a NaN operand propagates (quieted, sign kept), an
// invalid product (0 × ∞) is the default NaN 0xffc00000 (sign set). The GPU's canonical NaN is
// 0x7fffffff; only the sign survives the half conversion, but it does survive.
__device__ __forceinline__ float q8_mul_like_x86(float a, float b) {
    const float r = __fmul_rn(a, b);
    if (r == r) return r;
    if (a != a) return __uint_as_float(__float_as_uint(a) | 0x400000u);
    if (b != b) return __uint_as_float(__float_as_uint(b) | 0x400000u);
    return __uint_as_float(0xffc00000u);
}

__device__ __forceinline__ int q8_warp_sum_int(int v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(Q8_FULL, v, o);
    return v;
}

// C's roundf (ties away from zero), spelled out: `v - trunc(v)` is exact. NaN and infinities
// come back unchanged.
__device__ __forceinline__ float round_half_away(float v) {
    const float t = truncf(v);
    return fabsf(__fsub_rn(v, t)) >= 0.5f ? __fadd_rn(t, copysignf(1.0f, v)) : t;
}

// Q8_0 (and Q8_1 when `Q81`): one warp per 32-element block, lane i holding element i.
template <bool Q81>
__device__ void quantize_q8_32(const float* x, u8* out, long long meta, int n_blocks) {
    const int lane = threadIdx.x % WARP;
    const int b = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (b >= n_blocks) return;  // whole warps leave together
    const float v = x[(i64)b * 32 + lane];
    const float av = fabsf(v);
    // amax = MAX(amax, |x_j|) in element order, C's MAX(a, b) = a > b ? a : b: a NaN replaces
    // the running maximum and is replaced by the next value, so amax is the maximum over the
    // elements after the last NaN (that NaN when it is the last element).
    const u32 nan_lanes = __ballot_sync(Q8_FULL, av != av);
    const int last_nan = nan_lanes ? 31 - __clz(nan_lanes) : -1;
    float amax = warp_max(lane > last_nan ? av : 0.0f);
    if (last_nan == 31) amax = __shfl_sync(Q8_FULL, av, 31);
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    const float r = round_half_away(__fmul_rn(v, id));
    // C's float to int8_t as x86 compilers emit it: cvttss2si (NaN and |r| >= 2^31 give
    // INT_MIN), then the low byte.
    const int qi = (r != r || fabsf(r) >= 2147483648.0f) ? 0 : (int)r;
    const i8 q = (i8)(qi & 0xff);
    out[(i64)b * 32 + lane] = (u8)q;
    const int sum = q8_warp_sum_int((int)q);
    if (lane == 0) {
        u32 packed = q8_f32_to_f16(d);
        if (Q81) packed |= (u32)q8_f32_to_f16(q8_mul_like_x86((float)sum, d)) << 16;
        uint2* m = (uint2*)(out + meta) + b;
        *m = make_uint2(packed, (u32)sum);
    }
}

extern "C" __global__ void quantize_q8_0(const float* x, u8* out, long long meta, int n_blocks) {
    quantize_q8_32<false>(x, out, meta, n_blocks);
}

extern "C" __global__ void quantize_q8_1(const float* x, u8* out, long long meta, int n_blocks) {
    quantize_q8_32<true>(x, out, meta, n_blocks);
}

// Q8_K: one warp per 256-element block, lane i holding elements 8i .. 8i + 7.
extern "C" __global__ void quantize_q8_k(const float* x, u8* out, long long meta, long long bsums,
                                         int n_blocks) {
    const int lane = threadIdx.x % WARP;
    const int b = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (b >= n_blocks) return;
    const float4* xv = (const float4*)(x + (i64)b * QK_K + 8 * lane);
    const float4 v0 = xv[0], v1 = xv[1];
    const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    // amax over |x| (`|x| > amax` never holds for NaN), then the first element of that
    // magnitude: its signed value maps to -127.
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
    amax = warp_max(amax);
    float* dptr = (float*)(out + meta) + b;
    short* bs = (short*)(out + bsums) + (i64)b * 16;
    u32* q_out = (u32*)(out + (i64)b * QK_K + 8 * lane);
    if (amax == 0.0f) {
        q_out[0] = 0;
        q_out[1] = 0;
        if (lane % 2 == 0) bs[lane / 2] = 0;
        if (lane == 0) *dptr = 0.0f;
        return;
    }
    int first = 8;
#pragma unroll
    for (int i = 7; i >= 0; --i) first = fabsf(v[i]) == amax ? i : first;
    float mine = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) mine = i == first ? v[i] : mine;
    int pos = first < 8 ? 8 * lane + first : QK_K;
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) pos = min(pos, __shfl_xor_sync(Q8_FULL, pos, o));
    const float max = __shfl_sync(Q8_FULL, mine, pos / 8);
    const float iscale = __fdiv_rn(-127.0f, max);
    u32 packed[2] = {0, 0};
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        // ggml's nearest_int: (iscale * x + 1.5 * 2^23) rounds to an integer (half to even)
        // in the low mantissa bits. NaN products: x86 propagates a NaN operand's payload, and
        // an invalid product is the default NaN (payload 0x400000, which reads as 0).
        const float p = __fmul_rn(iscale, v[i]);
        int qi;
        if (p != p) {
            qi = v[i] != v[i] ? (int)(__float_as_uint(v[i]) & 0x3fffffu) : 0;
        } else {
            const float biased = __fadd_rn(p, 12582912.0f);
            qi = (int)(__float_as_uint(biased) & 0x007fffffu) - 0x00400000;
        }
        const i8 q = (i8)(min(qi, 127) & 0xff);  // C: MIN(127, v) stored into an int8_t
        sum += q;
        packed[i / 4] |= ((u32)(u8)q) << (8 * (i % 4));
    }
    q_out[0] = packed[0];
    q_out[1] = packed[1];
    const int group = sum + __shfl_xor_sync(Q8_FULL, sum, 1);  // 16 quants: lanes 2g, 2g + 1
    if (lane % 2 == 0) bs[lane / 2] = (short)group;
    if (lane == 0) *dptr = __fdiv_rn(1.0f, iscale);
}
