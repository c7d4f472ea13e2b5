// The activation quantizers' block routines, shared by quantize.cu and the kernels that
// quantize their own output for the matvec after them (attention.cu). See quantize.cu for
// the layout and the ggml functions these reproduce bit for bit.
#pragma once

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

// Q8_0 (and Q8_1 when `Q81`): one warp per 32-element block, lane i holding element i (v).
// The quant of lane i's element (returned) and the block's scale `d` (every lane).
__device__ __forceinline__ i8 quantize_q8_32_lane(float v, float& d) {
    const int lane = threadIdx.x % WARP;
    const float av = fabsf(v);
    // amax = MAX(amax, |x_j|) in element order, C's MAX(a, b) = a > b ? a : b: a NaN replaces
    // the running maximum and is replaced by the next value, so amax is the maximum over the
    // elements after the last NaN (that NaN when it is the last element).
    const u32 nan_lanes = __ballot_sync(Q8_FULL, av != av);
    const int last_nan = nan_lanes ? 31 - __clz(nan_lanes) : -1;
    float amax = warp_max(lane > last_nan ? av : 0.0f);
    if (last_nan == 31) amax = __shfl_sync(Q8_FULL, av, 31);
    d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    const float r = round_half_away(__fmul_rn(v, id));
    // C's float to int8_t as x86 compilers emit it: cvttss2si (NaN and |r| >= 2^31 give
    // INT_MIN), then the low byte.
    const int qi = (r != r || fabsf(r) >= 2147483648.0f) ? 0 : (int)r;
    return (i8)(qi & 0xff);
}

// Q8_0 with eight lanes a 32-value block: lane l of the warp holds values 4(l % 8) .. 4(l % 8) + 3
// of its group's block (u), every lane of the warp calls. Returns the lane's four quants, one a
// byte in value order, and the block's scale `d`: quantize_q8_32_lane's operations element for
// element (C's MAX in element order for amax, walked serially where the block holds a NaN).
__device__ __forceinline__ u32 quantize_q8_32_quad(float4 u, float& d) {
    const int lane = threadIdx.x % WARP;
    float amax = fmaxf(fmaxf(fabsf(u.x), fabsf(u.y)), fmaxf(fabsf(u.z), fabsf(u.w)));
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(Q8_FULL, amax, o));
    const float e4[4] = {u.x, u.y, u.z, u.w};
    const bool nan_here = u.x != u.x || u.y != u.y || u.z != u.z || u.w != u.w;
    const u32 nan_lanes = __ballot_sync(Q8_FULL, nan_here);
    if (nan_lanes) {  // warp-uniform
        // A NaN replaces C's running maximum and is replaced by the next value: the block's amax
        // is that of its values after the last NaN, so walk them in order.
        const int base = lane & ~7;
        float m = 0.0f;
#pragma unroll
        for (int e = 0; e < 32; ++e) {
            const float av = fabsf(__shfl_sync(Q8_FULL, e4[e % 4], base + e / 4));
            m = m > av ? m : av;
        }
        if (nan_lanes & (0xffu << base)) amax = m;
    }
    d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    u32 word = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float r = round_half_away(__fmul_rn(e4[j], id));
        // C's float to int8_t as x86 compilers emit it (see quantize_q8_32_lane).
        const int qi = (r != r || fabsf(r) >= 2147483648.0f) ? 0 : (int)r;
        word |= (u32)(qi & 0xff) << (8 * j);
    }
    return word;
}

// Block `b` of the activations (by the calling warp): quants, the half bits of d (and for Q8_1
// of d·Σq) and Σq, laid out as quantize.cu describes.
template <bool Q81>
__device__ void quantize_q8_32_value(float v, u8* out, long long meta, int b) {
    const int lane = threadIdx.x % WARP;
    float d;
    const i8 q = quantize_q8_32_lane(v, d);
    out[(i64)b * 32 + lane] = (u8)q;
    const int sum = q8_warp_sum_int((int)q);
    if (lane == 0) {
        u32 packed = q8_f32_to_f16(d);
        if (Q81) packed |= (u32)q8_f32_to_f16(q8_mul_like_x86((float)sum, d)) << 16;
        uint2* m = (uint2*)(out + meta) + b;
        *m = make_uint2(packed, (u32)sum);
    }
}

// Block `b` of x (by the calling warp).
template <bool Q81>
__device__ void quantize_q8_32_block(const float* x, u8* out, long long meta, int b) {
    quantize_q8_32_value<Q81>(x[(i64)b * 32 + threadIdx.x % WARP], out, meta, b);
}

// Q8_K quantization of one 256-value block by the calling warp, lane i holding values
// 8i .. 8i + 7 in `v`: the lane's quants (packed, little-endian) in q[0], q[1], their sum, and the
// block's scale d (all lanes). A block of zeros gives zero quants and d = 0.
__device__ __forceinline__ void quantize_q8_k_lane(const float (&v)[8], u32 (&q)[2], int& sum, float& d) {
    // amax over |x| (`|x| > amax` never holds for NaN), then the first element of that
    // magnitude: its signed value maps to -127.
    const int lane = threadIdx.x % WARP;
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
    amax = warp_max(amax);
    q[0] = 0, q[1] = 0, sum = 0, d = 0.0f;
    if (amax == 0.0f) return;  // warp-uniform
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
        const i8 qb = (i8)(min(qi, 127) & 0xff);  // C: MIN(127, v) stored into an int8_t
        sum += qb;
        q[i / 4] |= ((u32)(u8)qb) << (8 * (i % 4));
    }
    d = __fdiv_rn(1.0f, iscale);
}

// Q8_K block `b` (by the calling warp), lane i holding elements 8i .. 8i + 7.
// xb: the block's 256 values (global or shared memory, 16-byte aligned).
__device__ void quantize_q8_k_values(const float* xb, u8* out, long long meta, long long bsums, int b) {
    const int lane = threadIdx.x % WARP;
    const float4* xv = (const float4*)(xb + 8 * lane);
    const float4 v0 = xv[0], v1 = xv[1];
    const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    u32 q[2];
    int sum;
    float d;
    quantize_q8_k_lane(v, q, sum, d);
    u32* q_out = (u32*)(out + (i64)b * QK_K + 8 * lane);
    q_out[0] = q[0];
    q_out[1] = q[1];
    const int group = sum + __shfl_xor_sync(Q8_FULL, sum, 1);  // 16 quants: lanes 2g, 2g + 1
    if (lane % 2 == 0) ((short*)(out + bsums))[(i64)b * 16 + lane / 2] = (short)group;
    if (lane == 0) ((float*)(out + meta))[b] = d;
}

__device__ __forceinline__ void quantize_q8_k_block(const float* x, u8* out, long long meta, long long bsums, int b) {
    quantize_q8_k_values(x + (i64)b * QK_K, out, meta, bsums, b);
}
