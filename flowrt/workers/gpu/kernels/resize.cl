// Resize, every ONNX mode, one work-item per output value. Interpolation is separable: along
// dim d, output index o reads taps[d] input indices with weights (1 for nearest and for dims
// that do not move, 2 for linear, 4 for cubic, more with antialias), computed on the host as
// CpuRef computes them. The value is the sum over every combination of taps of the product
// of their weights. `geometry` holds per dim (6, leading dims padded): the output size, the
// input stride, taps, the offset of the dim's taps in `index`/`weight`, and the offset of its
// `outside` flags (tf_crop_and_resize: a position outside the input reads `extrapolation`).

__kernel void resize(__global const float* x, int x_off, __global float* y, int y_off, __constant const int* geometry,
                     __global const int* index, __global const float* weight,
                     __global const uchar* outside, int n, float extrapolation) {
    x += x_off; y += y_off;
    int i = get_global_id(0);
    if (i >= n) return;
    int position[6];
    int combos = 1, linear = i;
    for (int d = 5; d >= 0; --d) {
        position[d] = linear % geometry[d];
        linear /= geometry[d];
        if (outside[geometry[24 + d] + position[d]]) {
            y[i] = extrapolation;
            return;
        }
        combos *= geometry[12 + d];
    }
    float sum = 0.0f;
    for (int c = 0; c < combos; ++c) {
        int rest = c, offset = 0;
        float w = 1.0f;
        for (int d = 5; d >= 0; --d) {
            int taps = geometry[12 + d];
            int tap = geometry[18 + d] + position[d] * taps + rest % taps;
            rest /= taps;
            offset += index[tap] * geometry[6 + d];
            w *= weight[tap];
        }
        sum = mad(w, x[offset], sum);
    }
    y[i] = sum;
}
