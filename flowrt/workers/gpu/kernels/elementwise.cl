// Activations, broadcasting binary ops and unary functions, one work-item per output element,
// over DATA tensors (see common.cl); and the casts between float and half storage.

__kernel void activation(__global const DATA* x, int x_off, __global DATA* y, int y_off, int n,
                         int code, float alpha, float beta) {
    x += x_off; y += y_off;
    int i = get_global_id(0);
    if (i < n) STORE(y, i, activate(LOAD(x, i), code, alpha, beta));
}

#define OP_ADD 0
#define OP_SUB 1
#define OP_MUL 2
#define OP_DIV 3
#define OP_POW 4

// table: output dims, A's strides, B's strides (see strided_offset).
__kernel void binary(__global const DATA* a, int a_off, __global const DATA* b, int b_off, __global DATA* y, int y_off,
                     __constant const int* table, int n, int op,
                     int code, float alpha, float beta) {
    a += a_off; b += b_off; y += y_off;
    int i = get_global_id(0);
    if (i >= n) return;
    float u = LOAD(a, strided_offset(i, table, 1));
    float v = LOAD(b, strided_offset(i, table, 2));
    float r;
    switch (op) {
    case OP_ADD: r = u + v; break;
    case OP_SUB: r = u - v; break;
    case OP_MUL: r = u * v; break;
    case OP_POW: r = pow(u, v); break;
    default: r = u / v; break;
    }
    STORE(y, i, activate(r, code, alpha, beta));
}

// Unary functions; codes match UNARY_CODES in kernels/unary.py. alpha and beta are the
// layer's attributes where it has them (Elu's alpha, HardSigmoid's alpha and beta).
float unary_op(float v, int op, float alpha, float beta) {
    switch (op) {
    case 0: return exp(v);
    case 1: return log(v);
    case 2: return sqrt(v);
    case 3: return -v;
    case 4: return fabs(v);
    case 5: return 1.0f / v;
    case 6: return floor(v);
    case 7: return ceil(v);
    case 8: return rint(v);  // half to even, as numpy rounds
    case 9: return erf(v);
    case 10: return sin(v);
    case 11: return cos(v);
    case 12: return activate(v, ACT_GELU, 0.0f, 0.0f);  // common.cl's curves, one formula each
    case 13: return activate(v, ACT_GELU_TANH, 0.0f, 0.0f);
    case 14: return v > 0.0f ? v : alpha * expm1(v);
    case 15: return fmax(v, 0.0f) + log1p(exp(-fabs(v)));  // softplus without overflow
    case 16: return v / (1.0f + fabs(v));
    case 17: return fmin(fmax(mad(alpha, v, beta), 0.0f), 1.0f);
    default: return v;
    }
}

__kernel void unary(__global const DATA* x, int x_off, __global DATA* y, int y_off, int n, int op, float alpha, float beta) {
    x += x_off; y += y_off;
    int i = get_global_id(0);
    if (i < n) STORE(y, i, unary_op(LOAD(x, i), op, alpha, beta));
}

// The borders of float16 layers: float32 to half (rounded to nearest even, as numpy's astype)
// and back. Built in any program: they name their storage themselves.
__kernel void to_half(__global const float* x, int x_off, __global half* y, int y_off, int n) {
    int i = get_global_id(0);
    if (i < n) vstore_half_rte(x[x_off + i], y_off + i, y);
}

__kernel void from_half(__global const half* x, int x_off, __global float* y, int y_off, int n) {
    int i = get_global_id(0);
    if (i < n) y[y_off + i] = vload_half(x_off + i, x);
}

// ApplyRotary: y = x * cos + rotate_half(x) * sin along rows of `length` (even) values,
// rotate_half(x) = (-x[half:], x[:half]); cos and sin read through the table's strides
// (sets 1 and 2: 0 where they broadcast), x through set 3 (a transposed x: its last axis
// stays last, so a row's values are contiguous).
__kernel void apply_rotary(__global const DATA* x, int x_off, __global const DATA* c, int c_off,
                           __global const DATA* s, int s_off, __global DATA* y, int y_off,
                           __constant const int* table, int length, int n) {
    x += x_off; c += c_off; s += s_off; y += y_off;
    int i = get_global_id(0);
    if (i >= n) return;
    int mid = length / 2, d = i % length, at = strided_offset(i, table, 3);
    float rotated = d < mid ? -LOAD(x, at + mid) : LOAD(x, at - mid);
    STORE(y, i, mad(LOAD(x, at), LOAD(c, strided_offset(i, table, 1)), rotated * LOAD(s, strided_offset(i, table, 2))));
}
