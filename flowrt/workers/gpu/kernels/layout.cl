// Data movement: transpose through a stride table (output dims, then the input strides
// permuted into output order, or an Expand's broadcast strides; see strided_offset). Tensors
// are DATA (see common.cl).

__kernel void transpose(__global const DATA* x, int x_off, __global DATA* y, int y_off, __constant const int* table, int n) {
    x += x_off; y += y_off;
    int i = get_global_id(0);
    if (i < n) STORE(y, i, LOAD(x, strided_offset(i, table, 1)));
}

// The same gather `run` (8, 4 or 2) values of the output's last dim a work-item, where that dim
// is read in order (its input stride 1) and `run` divides it: the index arithmetic (a division
// and a remainder per dim) once per run, and the run's values read as one vector before any
// is written (x and y may alias as far as the compiler knows: a loop would wait on each load).
#ifdef HALF_STORAGE
#define LOAD_RUN(n, p) vload_half##n(0, p)
#define STORE_RUN(n, v, p) vstore_half##n##_rte(v, 0, p)
#else
#define LOAD_RUN(n, p) vload##n(0, p)
#define STORE_RUN(n, v, p) vstore##n(v, 0, p)
#endif
__kernel void transpose_runs(__global const DATA* x, int x_off, __global DATA* y, int y_off, __constant const int* table, int run, int n) {
    int i = get_global_id(0);
    if (i >= n) return;
    x += x_off + strided_offset(i * run, table, 1);
    y += y_off + i * run;
    if (run == 8) STORE_RUN(8, LOAD_RUN(8, x), y);
    else if (run == 4) STORE_RUN(4, LOAD_RUN(4, x), y);
    else STORE_RUN(2, LOAD_RUN(2, x), y);
}

// One input of a concat: x is `outer` slabs of `block` values; slab o lands at
// y[o * pitch + start]. (A kernel rather than clEnqueueCopyBufferRect: one launch, whatever
// the number of slabs, and PoCL 3.0 crashed on rectangular copies between sub-buffers.)
__kernel void concat_slab(__global const DATA* x, int x_off, __global DATA* y, int y_off, int block, int pitch, int start, int n) {
    x += x_off; y += y_off;
    int i = get_global_id(0);
    if (i < n) STORE(y, (i / block) * pitch + start + i % block, LOAD(x, i));
}

// Up to CONCAT_INPUTS inputs of a concat that lie in one buffer, in one launch (a DenseNet
// concatenates every earlier feature map at each layer: one launch per input was most of its
// launches). Input j is `outer` slabs of block_j values at x + src_j; slab o lands at
// y[o * pitch + start_j]. Work-item i copies value r = i % total of slab o = i / total, where
// total is the sum of the blocks, from the input whose blocks hold r.
#define CONCAT_INPUTS 16
#define CONCAT_PARAMS(j) int src##j, int block##j, int start##j
#define CONCAT_FIND(j)                                                                   \
    if (!found && j < count) {                                                           \
        if (r < block##j) { src = src##j; block = block##j; start = start##j; found = 1; } \
        else r -= block##j;                                                              \
    }
// Every part's (src, block, start), and which one holds value i: o = i / total is the slab,
// r = i % total the value in it, then the part's (src, block, start) and r within it.
#define CONCAT_ALL_PARAMS                                                                \
    CONCAT_PARAMS(0), CONCAT_PARAMS(1), CONCAT_PARAMS(2), CONCAT_PARAMS(3), CONCAT_PARAMS(4),   \
    CONCAT_PARAMS(5), CONCAT_PARAMS(6), CONCAT_PARAMS(7), CONCAT_PARAMS(8), CONCAT_PARAMS(9),   \
    CONCAT_PARAMS(10), CONCAT_PARAMS(11), CONCAT_PARAMS(12), CONCAT_PARAMS(13), CONCAT_PARAMS(14), \
    CONCAT_PARAMS(15)
#define CONCAT_LOOKUP(i)                                                                 \
    int o = (i) / total, r = (i) % total, src = 0, block = 0, start = 0, found = 0;      \
    CONCAT_FIND(0) CONCAT_FIND(1) CONCAT_FIND(2) CONCAT_FIND(3) CONCAT_FIND(4) CONCAT_FIND(5) \
    CONCAT_FIND(6) CONCAT_FIND(7) CONCAT_FIND(8) CONCAT_FIND(9) CONCAT_FIND(10) CONCAT_FIND(11) \
    CONCAT_FIND(12) CONCAT_FIND(13) CONCAT_FIND(14) CONCAT_FIND(15)
__kernel void concat_many(__global const DATA* x, __global DATA* y, int y_off, int pitch, int total, int n,
                          int count, CONCAT_ALL_PARAMS) {
    int i = get_global_id(0);
    if (i >= n) return;
    CONCAT_LOOKUP(i)
    STORE(y, y_off + o * pitch + start + r, LOAD(x, src + o * block + r));
}

// A split into up to CONCAT_INPUTS outputs that lie in one buffer, in one launch: concat_many
// the other way. x is `outer` slabs of `total` values (the split axis and the dims after it);
// output j takes block_j values of each slab, its first element at y + src_j (start_j unused),
// slab o at o * block_j. Work-item i copies x's value i: x is read in order.
__kernel void split_many(__global const DATA* x, int x_off, __global DATA* y, int total, int n,
                         int count, CONCAT_ALL_PARAMS) {
    int i = get_global_id(0);
    if (i >= n) return;
    CONCAT_LOOKUP(i)
    (void)start;
    STORE(y, src + o * block + r, LOAD(x, x_off + i));
}

// A Gather: y[o, k, s] = x[o, idx[k], s] for o < outer (the dims before the axis), k < count
// (the indices, made non-negative on the host) and s < slab (the dims after it); x holds `dim`
// slabs per o. One work-item per output value.
__kernel void gather_rows(__global const DATA* x, int x_off, __global DATA* y, int y_off,
                          __global const int* idx, int idx_off, int count, int slab, int dim, int n) {
    int i = get_global_id(0);
    if (i >= n) return;
    int s = i % slab, k = (i / slab) % count, o = i / (slab * count);
    STORE(y, y_off + i, LOAD(x, x_off + (o * dim + idx[idx_off + k]) * slab + s));
}
