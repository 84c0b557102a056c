// Activations and broadcasting binary ops, one work-item per output element.

__kernel void activation(__global const float* x, __global float* y, int n,
                         int code, float alpha, float beta) {
    int i = get_global_id(0);
    if (i < n) y[i] = activate(x[i], code, alpha, beta);
}

#define OP_ADD 0
#define OP_SUB 1
#define OP_MUL 2
#define OP_DIV 3

// table: output dims, A's strides, B's strides (see strided_offset).
__kernel void binary(__global const float* a, __global const float* b, __global float* y,
                     __constant const int* table, int n, int op,
                     int code, float alpha, float beta) {
    int i = get_global_id(0);
    if (i >= n) return;
    float u = a[strided_offset(i, table, 1)];
    float v = b[strided_offset(i, table, 2)];
    float r;
    switch (op) {
    case OP_ADD: r = u + v; break;
    case OP_SUB: r = u - v; break;
    case OP_MUL: r = u * v; break;
    default: r = u / v; break;
    }
    y[i] = activate(r, code, alpha, beta);
}
