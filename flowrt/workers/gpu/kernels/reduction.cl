// Reductions over a set of axes and layer normalization: one work-item per output value, or
// (the *_rows kernels) one work-group per contiguous row, its work-items striding along the
// row and combining their partial results through local memory (group_combine).
//
// reduce: output i starts at the input offset that the `kept` table gives it (the kept dims,
// then their input strides; see strided_offset); its `count` values lie where the `reduced`
// table puts them, or at base + k when they are contiguous. Codes match REDUCE_CODES in
// kernels/reduce.py.

#define R_SUM 0
#define R_MEAN 1
#define R_MAX 2
#define R_MIN 3
#define R_PROD 4
#define R_L1 5
#define R_L2 6
#define R_SUM_SQUARE 7
#define R_LOG_SUM 8
#define R_LOG_SUM_EXP 9

float reduce_start(int op) {
    switch (op) {
    case R_MAX: return -INFINITY;
    case R_MIN: return INFINITY;
    case R_PROD: return 1.0f;
    default: return 0.0f;
    }
}

float reduce_step(float acc, float v, int op, float shift) {
    switch (op) {
    case R_MAX: return (v > acc || isnan(v)) ? v : acc;
    case R_MIN: return (v < acc || isnan(v)) ? v : acc;
    case R_PROD: return acc * v;
    case R_L1: return acc + fabs(v);
    case R_L2:
    case R_SUM_SQUARE: return mad(v, v, acc);
    case R_LOG_SUM_EXP: return acc + exp(v - shift);
    default: return acc + v;
    }
}

float reduce_finish(float acc, int op, int count, float shift) {
    switch (op) {
    case R_MEAN: return acc / (float)count;
    case R_L2: return sqrt(acc);
    case R_LOG_SUM: return log(acc);
    case R_LOG_SUM_EXP: return log(acc) + shift;
    default: return acc;
    }
}

// How two partial results of `op` combine: by the op itself where it picks or multiplies, else
// by adding (every other op sums terms it has already transformed).
float reduce_combine(float a, float b, int op) {
    return (op == R_MAX || op == R_MIN || op == R_PROD) ? reduce_step(a, b, op, 0.0f) : a + b;
}

// The work-group's partials `v` combined (a tree over `part`, one float per work-item; the
// local size a power of two), returned to every work-item.
float group_combine(float v, __local float* part, int op) {
    int lid = get_local_id(0);
    part[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int width = get_local_size(0) / 2; width > 0; width /= 2) {
        if (lid < width) part[lid] = reduce_combine(part[lid], part[lid + width], op);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float all = part[0];
    barrier(CLK_LOCAL_MEM_FENCE);  // part is written again by the next call
    return all;
}

#define ROW_GROUP_MAX 256  // the largest local size of the *_rows kernels

__kernel void reduce(__global const float* x, int x_off, __global float* y, int y_off, __constant const int* kept,
                     __constant const int* reduced, int count, int contiguous, int n, int op) {
    x += x_off; y += y_off;
    int i = get_global_id(0);
    if (i >= n) return;
    int base = strided_offset(i, kept, 1);
    float shift = 0.0f;
    if (op == R_LOG_SUM_EXP) {  // shift by the max so that exp cannot overflow
        float top = -INFINITY;
        for (int k = 0; k < count; ++k)
            top = reduce_step(top, x[base + (contiguous ? k : strided_offset(k, reduced, 1))], R_MAX, 0.0f);
        shift = isfinite(top) ? top : 0.0f;
    }
    float acc = reduce_start(op);
    for (int k = 0; k < count; ++k)
        acc = reduce_step(acc, x[base + (contiguous ? k : strided_offset(k, reduced, 1))], op, shift);
    y[i] = reduce_finish(acc, op, count, shift);
}

// One work-item per row of `size` contiguous values: y = (x - mean) / sqrt(var + eps) * scale
// + bias, scale and bias read along the row with steps of 1 (0 when they are one value); the
// row's mean goes to mean_out when stats > 0, its 1 / sqrt(var + eps) to inv_std_out when
// stats > 1 (LayerNormalization's optional outputs). With center 0 the mean is taken as 0:
// x / sqrt(mean(x^2) + eps) * scale, RMSNormalization.
__kernel void layer_norm(__global const DATA* x, int x_off, __global DATA* y, int y_off,
                         __global const DATA* scale, int scale_off, int scale_step,
                         __global const DATA* bias, int bias_off, int bias_step, int has_bias,
                         __global DATA* mean_out, int mean_out_off, __global DATA* inv_std_out, int inv_std_out_off, int stats,
                         int center, int size, int rows, float epsilon) {
    x += x_off; y += y_off; scale += scale_off; bias += bias_off; mean_out += mean_out_off; inv_std_out += inv_std_out_off;
    int r = get_global_id(0);
    if (r >= rows) return;
    __global const DATA* row = x + r * size;
    float mean = 0.0f;
    if (center) {
        for (int k = 0; k < size; ++k) mean += LOAD(row, k);
        mean /= (float)size;
    }
    float var = 0.0f;
    for (int k = 0; k < size; ++k) {
        float d = LOAD(row, k) - mean;
        var = mad(d, d, var);
    }
    float inv_std = 1.0f / sqrt(var / (float)size + epsilon);
    for (int k = 0; k < size; ++k) {
        float v = (LOAD(row, k) - mean) * inv_std * LOAD(scale, k * scale_step);
        STORE(y, r * size + k, has_bias ? v + LOAD(bias, k * bias_step) : v);
    }
    if (stats > 0) STORE(mean_out, r, mean);
    if (stats > 1) STORE(inv_std_out, r, inv_std);
}

// reduce's contiguous case with one work-group per output value (the reduced values of output
// i are `count` values from the offset the `kept` table gives it).
__kernel void reduce_rows(__global const float* x, int x_off, __global float* y, int y_off, __constant const int* kept,
                          int count, int n, int op) {
    __local float part[ROW_GROUP_MAX];
    x += x_off; y += y_off;
    int i = get_group_id(0), lid = get_local_id(0), step = get_local_size(0);
    if (i >= n) return;
    __global const float* row = x + strided_offset(i, kept, 1);
    float shift = 0.0f;
    if (op == R_LOG_SUM_EXP) {
        float top = -INFINITY;
        for (int k = lid; k < count; k += step) top = reduce_step(top, row[k], R_MAX, 0.0f);
        top = group_combine(top, part, R_MAX);
        shift = isfinite(top) ? top : 0.0f;
    }
    float acc = reduce_start(op);
    for (int k = lid; k < count; k += step) acc = reduce_step(acc, row[k], op, shift);
    acc = group_combine(acc, part, op);
    if (lid == 0) y[i] = reduce_finish(acc, op, count, shift);
}

// layer_norm (and RMSNormalization) with one work-group per row.
__kernel void layer_norm_rows(__global const DATA* x, int x_off, __global DATA* y, int y_off,
                              __global const DATA* scale, int scale_off, int scale_step,
                              __global const DATA* bias, int bias_off, int bias_step, int has_bias,
                              __global DATA* mean_out, int mean_out_off, __global DATA* inv_std_out, int inv_std_out_off, int stats,
                              int center, int size, int rows, float epsilon) {
    __local float part[ROW_GROUP_MAX];
    x += x_off; y += y_off; scale += scale_off; bias += bias_off; mean_out += mean_out_off; inv_std_out += inv_std_out_off;
    int r = get_group_id(0), lid = get_local_id(0), step = get_local_size(0);
    if (r >= rows) return;
    __global const DATA* row = x + r * size;
    float mean = 0.0f;
    if (center) {  // the same in every work-item of the group: each meets the barriers
        float sum = 0.0f;
        for (int k = lid; k < size; k += step) sum += LOAD(row, k);
        mean = group_combine(sum, part, R_SUM) / (float)size;
    }
    float var = 0.0f;
    for (int k = lid; k < size; k += step) {
        float d = LOAD(row, k) - mean;
        var = mad(d, d, var);
    }
    float inv_std = 1.0f / sqrt(group_combine(var, part, R_SUM) / (float)size + epsilon);
    for (int k = lid; k < size; k += step) {
        float v = (LOAD(row, k) - mean) * inv_std * LOAD(scale, k * scale_step);
        STORE(y, r * size + k, has_bias ? v + LOAD(bias, k * bias_step) : v);
    }
    if (lid == 0 && stats > 0) STORE(mean_out, r, mean);
    if (lid == 0 && stats > 1) STORE(inv_std_out, r, inv_std);
}

// Softmax along the last axis with one work-group per row of axis_len values, shifted by the
// row's max (NaN if the row has one, as numpy's max is).
__kernel void softmax_rows(__global const DATA* x, int x_off, __global DATA* y, int y_off, int axis_len, int rows) {
    __local float part[ROW_GROUP_MAX];
    x += x_off; y += y_off;
    int r = get_group_id(0), lid = get_local_id(0), step = get_local_size(0);
    if (r >= rows) return;
    int base = r * axis_len;
    float top = -INFINITY;
    for (int k = lid; k < axis_len; k += step) top = reduce_step(top, LOAD(x, base + k), R_MAX, 0.0f);
    top = group_combine(top, part, R_MAX);
    float sum = 0.0f;
    for (int k = lid; k < axis_len; k += step) sum += exp(LOAD(x, base + k) - top);
    sum = group_combine(sum, part, R_SUM);
    for (int k = lid; k < axis_len; k += step) STORE(y, base + k, exp(LOAD(x, base + k) - top) / sum);
}

// AttentionSoftmax: softmax(scale * x + mask) along the last axis, one work-group per row.
// Row r is (i0, i1, i2) of the leading dims (sizes d1, d2 of the inner two); the mask's row
// lies at i0 * s0 + i1 * s1 + i2 * s2 and its values mcol apart (a stride of 0 where it
// broadcasts); without a mask (has_mask 0) m is not read.
__kernel void attention_softmax_rows(__global const DATA* x, int x_off, __global DATA* y, int y_off,
                                     __global const DATA* m, int m_off, int has_mask, int d1, int d2,
                                     int s0, int s1, int s2, int mcol, float scale, int axis_len, int rows) {
    __local float part[ROW_GROUP_MAX];
    x += x_off; y += y_off; m += m_off;
    int r = get_group_id(0), lid = get_local_id(0), step = get_local_size(0);
    if (r >= rows) return;
    int base = r * axis_len;
    int i2 = r % d2, i1 = (r / d2) % d1, i0 = r / d2 / d1;
    __global const DATA* mrow = m + i0 * s0 + i1 * s1 + i2 * s2;
#define SCORE(k) mad(LOAD(x, base + (k)), scale, has_mask ? LOAD(mrow, (k) * mcol) : 0.0f)
    float top = -INFINITY;
    for (int k = lid; k < axis_len; k += step) top = reduce_step(top, SCORE(k), R_MAX, 0.0f);
    top = group_combine(top, part, R_MAX);
    float sum = 0.0f;
    for (int k = lid; k < axis_len; k += step) sum += exp(SCORE(k) - top);
    sum = group_combine(sum, part, R_SUM);
    for (int k = lid; k < axis_len; k += step) STORE(y, base + k, exp(SCORE(k) - top) / sum);
#undef SCORE
}
