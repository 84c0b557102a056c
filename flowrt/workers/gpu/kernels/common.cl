// Shared by every GpuAcc program: the activation epilogue. Each ACT_<KIND> is the code of the
// activation table (flowrt/engine/graph/layer_kind.py, declared with the kind in its layers/
// file), for every kind fused "everywhere" and the curves GpuAcc fuses (GPU_CURVES in
// kernels/__init__.py); tests/workers/gpu/test_activation_codes.py checks that they agree.
// The semantics are CpuRef's activation kernels'.
//
// Every tensor parameter of a kernel is a buffer followed by the offset, in elements, of the
// tensor's first element in it (`x, x_off`): the tensors of a memory pool lie at offsets of the
// pool's one buffer (GpuTensor.kernel_args), as the Compute Library passes each tensor's
// offset_first_element_in_bytes. Sub-buffers would do the same, but NVIDIA's driver makes a
// launch over sub-buffers that overlap others (a pool reuses its bytes) several times dearer.
//
// Tensors of float16 layers (reduce_fp32_to_fp16) are stored as half and computed in float:
// a program built with HALF_STORAGE reads and writes its DATA tensors with vload_half and
// vstore_half_rte (core OpenCL: no cl_khr_fp16 needed), through LOAD and STORE.
#ifdef HALF_STORAGE
#define DATA half
#define LOAD(p, i) vload_half((i), (p))
#define STORE(p, i, v) vstore_half_rte((v), (i), (p))
#else
#define DATA float
#define LOAD(p, i) ((p)[i])
#define STORE(p, i, v) ((p)[i] = (v))
#endif

#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_LEAKY_RELU 2
#define ACT_CLIP 3
#define ACT_SIGMOID 4
#define ACT_TANH 5
#define ACT_HARD_SIGMOID 6
#define ACT_HARD_SWISH 7
#define ACT_GELU 10
#define ACT_GELU_TANH 11
#define ACT_SWISH 12

float activate(float v, int code, float alpha, float beta) {
    switch (code) {
    case ACT_RELU: return fmax(v, 0.0f);
    case ACT_LEAKY_RELU: return v > 0.0f ? v : v * alpha;
    case ACT_CLIP: return fmin(fmax(v, alpha), beta);
    case ACT_SIGMOID: {
        // exp only ever sees -|v|, so it cannot overflow
        float e = exp(-fabs(v));
        return v >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
    }
    case ACT_TANH: return tanh(v);
    case ACT_HARD_SIGMOID: return clamp(v * alpha + beta, 0.0f, 1.0f);
    case ACT_HARD_SWISH: return v * clamp(v * (1.0f / 6.0f) + 0.5f, 0.0f, 1.0f);
    case ACT_GELU: return 0.5f * v * (1.0f + erf(v * 0.70710678118654752f));  // the exact (erf) form
    case ACT_GELU_TANH: return 0.5f * v * (1.0f + tanh(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    case ACT_SWISH: {  // v * sigmoid(alpha * v), exp seeing only -|alpha * v|
        float u = alpha * v, e = exp(-fabs(u));
        return v * (u >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e));
    }
    default: return v;
    }
}

// Rank-6 index arithmetic for broadcasting and transposing: a table of 6 output dims followed
// by one or more sets of 6 strides (0 on a broadcast dim), leading dims padded with 1.
int strided_offset(int linear, __constant const int* table, int set) {
    int offset = 0;
    for (int d = 5; d >= 0; --d) {
        int size = table[d];
        offset += (linear % size) * table[6 * set + d];
        linear /= size;
    }
    return offset;
}
