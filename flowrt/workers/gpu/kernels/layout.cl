// Data movement: transpose through a stride table (output dims, then the input strides
// permuted into output order; see strided_offset).

__kernel void transpose(__global const float* x, __global float* y, __constant const int* table, int n) {
    int i = get_global_id(0);
    if (i < n) y[i] = x[strided_offset(i, table, 1)];
}

// One input of a concat: x is `outer` slabs of `block` values; slab o lands at
// y[o * pitch + start]. (A kernel rather than clEnqueueCopyBufferRect: PoCL 3.0 crashes on
// rectangular copies between sub-buffers, which is what tensors in a pool arena are.)
__kernel void concat_slab(__global const float* x, __global float* y, int block, int pitch, int start, int n) {
    int i = get_global_id(0);
    if (i < n) y[(i / block) * pitch + start + i % block] = x[i];
}
