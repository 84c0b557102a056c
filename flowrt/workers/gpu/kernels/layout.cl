// Data movement: transpose through a stride table (output dims, then the input strides
// permuted into output order; see strided_offset).

__kernel void transpose(__global const float* x, __global float* y, __constant const int* table, int n) {
    int i = get_global_id(0);
    if (i < n) y[i] = x[strided_offset(i, table, 1)];
}
