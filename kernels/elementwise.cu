// Element-wise ops on f32 activations.
#include "common.cuh"

// out[i] = a[i] + b[i]
extern "C" __global__ void add_f32(float* out, const float* a, const float* b, int n) {
    PDL_WAIT();
    PDL_TRIGGER();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

// x[i] *= s
extern "C" __global__ void scale_f32(float* x, float s, int n) {
    PDL_WAIT();
    PDL_TRIGGER();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

// x: [rows, cols] += bias: [cols]
extern "C" __global__ void add_bias_f32(float* x, const float* bias, int rows, int cols) {
    PDL_WAIT();
    PDL_TRIGGER();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) x[i] += bias[i % cols];
}

// SwiGLU: out = silu(gate) * up, over rows of `cols`. As the reference: ggml's polynomial exp
// for groups of four within a row, libm-style expf for the row's tail. Four consecutive
// elements per thread (16-byte loads and stores when they are all there).
extern "C" __global__ void swiglu_f32(float* out, const float* gate, const float* up, int n, int cols) {
    PDL_WAIT();
    PDL_TRIGGER();
    const int i0 = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i0 >= n) return;
    int c = i0 % cols;
    if (i0 + 4 <= n) {
        const float4 g = *(const float4*)(gate + i0), u = *(const float4*)(up + i0);
        float4 r;
        r.x = swiglu_one(g.x, u.x, c, cols);
        c = c + 1 == cols ? 0 : c + 1;
        r.y = swiglu_one(g.y, u.y, c, cols);
        c = c + 1 == cols ? 0 : c + 1;
        r.z = swiglu_one(g.z, u.z, c, cols);
        c = c + 1 == cols ? 0 : c + 1;
        r.w = swiglu_one(g.w, u.w, c, cols);
        *(float4*)(out + i0) = r;
    } else {
        for (int i = i0; i < n; ++i) {
            out[i] = swiglu_one(gate[i], up[i], c, cols);
            c = c + 1 == cols ? 0 : c + 1;
        }
    }
}

// GeGLU with the tanh approximation of GELU: out = gelu(gate) * up, GELU looked up in ggml's
// table of f16 values (`table`: 65536 entries indexed by the f16 bits of the input, built on the
// host exactly as the CPU builds it), saturating outside ±10.
extern "C" __global__ void geglu_f32(float* out, const float* gate, const float* up, int n, const u16* table) {
    PDL_WAIT();
    PDL_TRIGGER();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = geglu_one(gate[i], up[i], table);
    }
}

// x = cap * tanh(x / cap) (final-logit soft-capping)
extern "C" __global__ void softcap_f32(float* x, float cap, int n) {
    PDL_WAIT();
    PDL_TRIGGER();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}
