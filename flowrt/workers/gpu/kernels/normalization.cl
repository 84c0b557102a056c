// Per-channel scale and shift (inference batch normalization, folded on the host), local
// response normalization across channels, and softmax along an axis.

// x and y are DATA (see common.cl); the folded factor and shift stay float.
__kernel void scale_shift(__global const DATA* x, int x_off, __global DATA* y, int y_off,
                          __global const float* factor, int factor_off, __global const float* shift, int shift_off,
                          int C, int inner, int total, int code, float alpha, float beta) {
    x += x_off; y += y_off; factor += factor_off; shift += shift_off;
    int i = get_global_id(0);
    if (i >= total) return;
    int c = (i / inner) % C;
    STORE(y, i, activate(mad(LOAD(x, i), factor[c], shift[c]), code, alpha, beta));
}

// Channel c sums the squares of channels c - (size - 1) / 2 .. c + size / 2, clipped.
__kernel void lrn(__global const float* x, int x_off, __global float* y, int y_off, int C, int inner, int size,
                  float alpha_over_size, float beta, float bias, int total) {
    x += x_off; y += y_off;
    int i = get_global_id(0);
    if (i >= total) return;
    int c = (i / inner) % C;
    int base = i - c * inner;
    int first = max(c - (size - 1) / 2, 0), last = min(c + size / 2, C - 1);
    float sum = 0.0f;
    for (int k = first; k <= last; ++k) {
        float v = x[base + k * inner];
        sum = mad(v, v, sum);
    }
    y[i] = x[i] / pow(bias + alpha_over_size * sum, beta);
}

// One work-item per row: a row is axis_len values inner apart; shifted by its max. x and y
// are DATA (common.cl); each exponential is computed again for the last pass, so a half y
// is rounded once.
__kernel void softmax(__global const DATA* x, int x_off, __global DATA* y, int y_off, int axis_len, int inner, int rows) {
    x += x_off; y += y_off;
    int r = get_global_id(0);
    if (r >= rows) return;
    int base = (r / inner) * axis_len * inner + r % inner;
    float top = -INFINITY;
    for (int k = 0; k < axis_len; ++k) top = fmax(top, LOAD(x, base + k * inner));
    // Compensated (Kahan) sum: a plain running sum of a long row drifts by up to
    // axis_len * FLT_EPSILON, where numpy's pairwise sum stays near the exact value.
    float sum = 0.0f, lost = 0.0f;
    for (int k = 0; k < axis_len; ++k) {
        float term = exp(LOAD(x, base + k * inner) - top) - lost, next = sum + term;
        lost = (next - sum) - term;
        sum = next;
    }
    for (int k = 0; k < axis_len; ++k) STORE(y, base + k * inner, exp(LOAD(x, base + k * inner) - top) / sum);
}
