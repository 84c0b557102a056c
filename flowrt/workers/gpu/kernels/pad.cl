// Pad in every mode, one work-item per output value. `table` holds, per dim (6, leading dims
// padded): the output dims, the input strides, the first kept input index `lo`, the values
// grown before the kept range, and the kept range's length. Along each dim the output index
// maps to j in the kept range: constant mode writes `value` outside it, reflect mirrors
// without repeating the edge, edge clamps and wrap repeats, as numpy.pad's modes do.

#define PAD_CONSTANT 0
#define PAD_REFLECT 1
#define PAD_EDGE 2
#define PAD_WRAP 3

int pad_source(int j, int len, int mode) {
    if (j >= 0 && j < len) return j;
    if (mode == PAD_CONSTANT || len == 0) return -1;
    if (mode == PAD_EDGE) return j < 0 ? 0 : len - 1;
    if (mode == PAD_WRAP) return ((j % len) + len) % len;
    if (len == 1) return 0;
    int period = 2 * (len - 1);
    int k = ((j % period) + period) % period;
    return k < len ? k : period - k;
}

__kernel void pad(__global const float* x, int x_off, __global float* y, int y_off, __constant const int* table,
                  int n, int mode, float value) {
    x += x_off; y += y_off;
    int i = get_global_id(0);
    if (i >= n) return;
    int linear = i, offset = 0;
    for (int d = 5; d >= 0; --d) {
        int size = table[d];
        int j = pad_source(linear % size - table[18 + d], table[24 + d], mode);
        linear /= size;
        if (j < 0) {
            y[i] = value;
            return;
        }
        offset += (table[12 + d] + j) * table[6 + d];
    }
    y[i] = x[offset];
}
