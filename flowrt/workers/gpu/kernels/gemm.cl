// Batched, tiled, register-blocked GEMM: C[b] = act(alpha * A[b] @ B[b] + beta * bias[b]).
//
// A work-group of 16x16 work-items computes a 64x64 tile of C; each work-item a 4x4 block
// (rows lr + 16 i, columns lc + 16 j), so every value loaded into local memory is used 4 times
// from registers. A and B are read through (row, column) strides, so transposed operands and
// im2col columns need no copy. Batch b reads A (and the bias) at group b % groups: the groups
// of a grouped convolution share one weight tensor, and a plain GEMM has groups = 1.
// Each matrix is a buffer and the offset of its first element in it (see common.cl).

#define TM 64
#define TN 64
#define TK 16
#define WG 16
#define WPT 4

__kernel __attribute__((reqd_work_group_size(WG, WG, 1)))
void gemm(int M, int N, int K, int groups,
          __global const float* A, int A_off, int a_group, int a_rs, int a_cs,
          __global const float* B, int B_off, int b_batch, int b_rs, int b_cs,
          __global float* C, int C_off, int c_batch,
          __global const float* bias, int bias_off, int has_bias, int bias_group, int bias_rs, int bias_cs,
          float alpha, float beta, int code, float act_alpha, float act_beta) {
    __local float As[TK][TM];
    __local float Bs[TK][TN];
    const int lc = get_local_id(0), lr = get_local_id(1);
    const int col0 = get_group_id(0) * TN, row0 = get_group_id(1) * TM;
    const int batch = get_global_id(2), group = batch % groups;
    const int tid = lr * WG + lc;
    A += A_off + group * a_group;
    B += B_off + batch * b_batch;
    C += C_off + batch * c_batch;
    bias += bias_off;

    float acc[WPT][WPT];
    for (int i = 0; i < WPT; ++i)
        for (int j = 0; j < WPT; ++j) acc[i][j] = 0.0f;

    for (int t = 0; t < K; t += TK) {
        for (int l = 0; l < (TM * TK) / (WG * WG); ++l) {
            int e = tid + l * WG * WG;
            int m = e / TK, k = e % TK;
            int gr = row0 + m, gk = t + k;
            As[k][m] = (gr < M && gk < K) ? A[gr * a_rs + gk * a_cs] : 0.0f;
        }
        for (int l = 0; l < (TN * TK) / (WG * WG); ++l) {
            int e = tid + l * WG * WG;
            int k = e / TN, n = e % TN;
            int gc = col0 + n, gk = t + k;
            Bs[k][n] = (gc < N && gk < K) ? B[gk * b_rs + gc * b_cs] : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < TK; ++k) {
            float a[WPT], b[WPT];
            for (int i = 0; i < WPT; ++i) a[i] = As[k][lr + WG * i];
            for (int j = 0; j < WPT; ++j) b[j] = Bs[k][lc + WG * j];
            for (int i = 0; i < WPT; ++i)
                for (int j = 0; j < WPT; ++j) acc[i][j] = mad(a[i], b[j], acc[i][j]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (int i = 0; i < WPT; ++i) {
        int row = row0 + lr + WG * i;
        if (row >= M) continue;
        for (int j = 0; j < WPT; ++j) {
            int col = col0 + lc + WG * j;
            if (col >= N) continue;
            float v = alpha * acc[i][j];
            if (has_bias) v += beta * bias[group * bias_group + row * bias_rs + col * bias_cs];
            C[row * N + col] = activate(v, code, act_alpha, act_beta);
        }
    }
}
