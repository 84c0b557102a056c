// Data movement: transpose through a stride table (output dims, then the input strides
// permuted into output order; see strided_offset).

__kernel void transpose(__global const float* x, int x_off, __global float* y, int y_off, __constant const int* table, int n) {
    x += x_off; y += y_off;
    int i = get_global_id(0);
    if (i < n) y[i] = x[strided_offset(i, table, 1)];
}

// One input of a concat: x is `outer` slabs of `block` values; slab o lands at
// y[o * pitch + start]. (A kernel rather than clEnqueueCopyBufferRect: one launch, whatever
// the number of slabs, and PoCL 3.0 crashed on rectangular copies between sub-buffers.)
__kernel void concat_slab(__global const float* x, int x_off, __global float* y, int y_off, int block, int pitch, int start, int n) {
    x += x_off; y += y_off;
    int i = get_global_id(0);
    if (i < n) y[(i / block) * pitch + start + i % block] = x[i];
}
