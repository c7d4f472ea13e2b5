// Element-wise ops on f32 activations.
#include "common.cuh"

// out[i] = a[i] + b[i]
extern "C" __global__ void add_f32(float* out, const float* a, const float* b, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

// x[i] *= s
extern "C" __global__ void scale_f32(float* x, float s, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

// x: [rows, cols] += bias: [cols]
extern "C" __global__ void add_bias_f32(float* x, const float* bias, int rows, int cols) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) x[i] += bias[i % cols];
}

// SwiGLU: out = silu(gate) * up
extern "C" __global__ void swiglu_f32(float* out, const float* gate, const float* up, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

// GeGLU with the tanh approximation of GELU: out = gelu(gate) * up
extern "C" __global__ void geglu_f32(float* out, const float* gate, const float* up, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float x = gate[i];
        const float sqrt_2_over_pi = 0.79788456080286535587989211986876f;
        const float g = 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * x * (1.0f + 0.044715f * x * x)));
        out[i] = g * up[i];
    }
}

// x = cap * tanh(x / cap) (final-logit soft-capping)
extern "C" __global__ void softcap_f32(float* x, float cap, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}
