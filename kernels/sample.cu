// Token choice on the GPU, so only ids cross to the host.
#include "common.cuh"

// out[0] = index of the largest x (lowest index on ties). One block.
extern "C" __global__ void argmax_f32(i32* out, const float* x, int n) {
    __shared__ float best_v[1024];
    __shared__ int best_i[1024];
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        if (x[i] > bv) {
            bv = x[i];
            bi = i;
        }
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float ov = best_v[threadIdx.x + s];
            const int oi = best_i[threadIdx.x + s];
            if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x])) {
                best_v[threadIdx.x] = ov;
                best_i[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = best_i[0] == 0x7fffffff ? 0 : best_i[0];
}
