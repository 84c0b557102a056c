// The end of a split-K GEMM (gemm.cl with splits > 1), a program of its own so that a build
// of it compiles no GEMM: C[b] = act(alpha * sum of P's slices of batch b + beta * bias + R[b]),
// one work-item per element of C (P holds batch b's `splits` slices of M x N at b * splits).
__kernel void gemm_reduce(int M, int N, int groups, int splits, int total,
                          __global const float* P, int P_off, __global DATA* C, int C_off, int c_batch,
                          __global const DATA* bias, int bias_off, int has_bias, int bias_group,
                          int bias_rs, int bias_cs, __global const DATA* R, int R_off, int has_res,
                          float alpha, float beta, int code, float act_alpha, float act_beta) {
    int i = get_global_id(0);
    if (i >= total) return;
    const int mn = M * N, batch = i / mn, e = i % mn;
    P += P_off + batch * splits * mn + e;
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) sum += P[s * mn];
    float v = alpha * sum;
    if (has_bias)
        v += beta * LOAD(bias, bias_off + (batch % groups) * bias_group + (e / N) * bias_rs + (e % N) * bias_cs);
    if (has_res) v += LOAD(R, R_off + batch * c_batch + e);
    STORE(C, C_off + batch * c_batch + e, activate(v, code, act_alpha, act_beta));
}
