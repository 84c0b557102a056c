// 2-D max and average pooling over NCHW, one work-item per output element, and global
// average pooling, one work-item per (n, c). Window geometry (pads, ceil mode) is resolved on
// the host by window_geometry, exactly as for CpuRef. Tensors are DATA (see common.cl).

#define POOL_ARGS int H, int W, int OH, int OW, int KH, int KW, int SH, int SW, \
                  int PH, int PW, int DH, int DW, int total

__kernel void max_pool(__global const DATA* x, int x_off, __global DATA* y, int y_off, POOL_ARGS) {
    x += x_off; y += y_off;
    int i = get_global_id(0);
    if (i >= total) return;
    int ow = i % OW, t = i / OW, oh = t % OH, nc = t / OH;
    __global const DATA* plane = x + nc * H * W;
    float best = -INFINITY;
    for (int kh = 0; kh < KH; ++kh) {
        int ih = oh * SH - PH + kh * DH;
        if (ih < 0 || ih >= H) continue;
        for (int kw = 0; kw < KW; ++kw) {
            int iw = ow * SW - PW + kw * DW;
            if (iw >= 0 && iw < W) best = fmax(best, LOAD(plane, ih * W + iw));
        }
    }
    STORE(y, i, best);
}

// How many of the window's cells along one axis lie in [low, high).
int cells_in(int start, int k, int d, int low, int high) {
    int count = 0;
    for (int j = 0; j < k; ++j) count += (start + j * d >= low && start + j * d < high);
    return count;
}

// The divisor counts the input cells, and the pad cells when include_pad (never the cells
// that ceil mode reaches past the trailing pads): PH_END and PW_END bound them.
__kernel void average_pool(__global const DATA* x, int x_off, __global DATA* y, int y_off, POOL_ARGS,
                           int include_pad, int PH_END, int PW_END) {
    x += x_off; y += y_off;
    int i = get_global_id(0);
    if (i >= total) return;
    int ow = i % OW, t = i / OW, oh = t % OH, nc = t / OH;
    __global const DATA* plane = x + nc * H * W;
    float sum = 0.0f;
    for (int kh = 0; kh < KH; ++kh) {
        int ih = oh * SH - PH + kh * DH;
        if (ih < 0 || ih >= H) continue;
        for (int kw = 0; kw < KW; ++kw) {
            int iw = ow * SW - PW + kw * DW;
            if (iw >= 0 && iw < W) sum += LOAD(plane, ih * W + iw);
        }
    }
    int rows = include_pad ? cells_in(oh * SH - PH, KH, DH, -PH, H + PH_END) : cells_in(oh * SH - PH, KH, DH, 0, H);
    int cols = include_pad ? cells_in(ow * SW - PW, KW, DW, -PW, W + PW_END) : cells_in(ow * SW - PW, KW, DW, 0, W);
    STORE(y, i, sum / (float)max(rows * cols, 1));
}

__kernel void global_average_pool(__global const DATA* x, int x_off, __global DATA* y, int y_off, int size, int total) {
    x += x_off; y += y_off;
    int i = get_global_id(0);
    if (i >= total) return;
    __global const DATA* plane = x + i * size;
    float sum = 0.0f;
    for (int j = 0; j < size; ++j) sum += LOAD(plane, j);
    STORE(y, i, sum / (float)size);
}
