// A 3x3 stride-1 convolution by Winograd's minimal filtering F(2x2, 3x3) (Lavin and Gray): each
// 2x2 block of outputs takes 16 multiplies per input channel where the direct product takes 36.
// The input's 4x4 tiles d (overlapping by two) become V = Bt d B (winograd_input), the filters
// U = G g Gt (once, at load, on the host), and the 16 elements of the transformed tiles are 16
// independent GEMMs over the channels, M_e = U_e V_e (gemm.cl, 16 batches); winograd_output
// turns each tile back, Y = At M A, adding the bias and a residual and applying the activation.
//
// V is (16, C, P) and M (16, K, P), P = images x tile rows x tile columns: tile p of image n
// is p = (n * tiles_h + ty) * tiles_w + tx, so work-items next to each other read and write
// next to each other.

// V[e][c][p] for one (channel, tile) a work-item: the 4x4 input tile at rows 2 ty - PH ..,
// columns 2 tx - PW .. (zero outside the image), transformed.
__kernel void winograd_input(int C, int H, int W, int PH, int PW, int tiles_h, int tiles_w, int P,
                             __global const DATA* x, int x_off, __global DATA* V, int V_off) {
    const int i = get_global_id(0);
    if (i >= C * P) return;
    const int c = i / P, p = i % P, per_image = tiles_h * tiles_w;
    const int n = p / per_image, t = p % per_image;
    const int h0 = (t / tiles_w) * 2 - PH, w0 = (t % tiles_w) * 2 - PW;
    x += x_off + (n * C + c) * H * W;
    float d[4][4];
    for (int r = 0; r < 4; ++r)
        for (int s = 0; s < 4; ++s) {
            int h = h0 + r, w = w0 + s;
            d[r][s] = ((uint)h < (uint)H && (uint)w < (uint)W) ? LOAD(x, h * W + w) : 0.0f;
        }
    float b[4][4];  // Bt d: the rows combined
    for (int s = 0; s < 4; ++s) {
        b[0][s] = d[0][s] - d[2][s];
        b[1][s] = d[1][s] + d[2][s];
        b[2][s] = d[2][s] - d[1][s];
        b[3][s] = d[1][s] - d[3][s];
    }
    V += V_off + c * P + p;
    const int plane = C * P;
    for (int r = 0; r < 4; ++r) {  // (Bt d) B: the columns
        STORE(V, (4 * r + 0) * plane, b[r][0] - b[r][2]);
        STORE(V, (4 * r + 1) * plane, b[r][1] + b[r][2]);
        STORE(V, (4 * r + 2) * plane, b[r][2] - b[r][1]);
        STORE(V, (4 * r + 3) * plane, b[r][1] - b[r][3]);
    }
}

// Y's 2x2 block of one (output channel, tile) a work-item from M[e][k][p]: At M A, plus the
// bias and the residual R (laid out as Y), then the activation; the block's outputs past the
// image's edge are not written.
__kernel void winograd_output(int K, int OH, int OW, int tiles_h, int tiles_w, int P,
                              __global const DATA* M, int M_off, __global DATA* Y, int Y_off,
                              __global const DATA* bias, int bias_off, int has_bias,
                              __global const DATA* R, int R_off, int has_res,
                              int code, float act_alpha, float act_beta) {
    const int i = get_global_id(0);
    if (i >= K * P) return;
    const int k = i / P, p = i % P, per_image = tiles_h * tiles_w;
    const int n = p / per_image, t = p % per_image;
    const int h0 = (t / tiles_w) * 2, w0 = (t % tiles_w) * 2;
    M += M_off + k * P + p;
    const int plane = K * P;
    float m[4][4];
    for (int e = 0; e < 16; ++e) m[e / 4][e % 4] = LOAD(M, e * plane);
    float a[2][4];  // At M: the rows combined
    for (int s = 0; s < 4; ++s) {
        a[0][s] = m[0][s] + m[1][s] + m[2][s];
        a[1][s] = m[1][s] - m[2][s] - m[3][s];
    }
    const float add = has_bias ? LOAD(bias, bias_off + k) : 0.0f;
    const int at = (n * K + k) * OH * OW;
    Y += Y_off + at;
    R += R_off + at;
    for (int r = 0; r < 2; ++r) {
        float y[2] = {a[r][0] + a[r][1] + a[r][2], a[r][1] - a[r][2] - a[r][3]};  // (At M) A
        const int h = h0 + r;
        for (int s = 0; s < 2; ++s) {
            const int w = w0 + s;
            if (h >= OH || w >= OW) continue;
            float v = y[s] + add;
            if (has_res) v += LOAD(R, h * OW + w);
            STORE(Y, h * OW + w, activate(v, code, act_alpha, act_beta));
        }
    }
}
