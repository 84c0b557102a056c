// im2col for 2-D convolution: the column matrix [N][C * KH * KW][OH * OW] of an NCHW input,
// one work-item per entry; padding cells read as 0. The GEMM in gemm.cl does the rest.

__kernel void im2col(__global const float* x, int x_off, __global float* cols, int cols_off,
                     int C, int H, int W, int KH, int KW, int OH, int OW,
                     int SH, int SW, int PH, int PW, int DH, int DW, int total) {
    x += x_off; cols += cols_off;
    int i = get_global_id(0);
    if (i >= total) return;
    int ow = i % OW, t = i / OW;
    int oh = t % OH; t /= OH;
    int kw = t % KW; t /= KW;
    int kh = t % KH; t /= KH;  // t is now n * C + c
    int ih = oh * SH - PH + kh * DH, iw = ow * SW - PW + kw * DW;
    cols[i] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? x[(t * H + ih) * W + iw] : 0.0f;
}
