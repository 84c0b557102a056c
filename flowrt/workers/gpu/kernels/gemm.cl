// Batched, tiled, register-blocked GEMM: C[b] = act(alpha * A[b] @ B[b] + beta * bias[b]).
//
// A work-group computes a TM x TN tile of C, each of its (TN / WPTN) x (TM / WPTM) work-items
// a WPTM x WPTN block (rows lr + RM i, columns lc + RN j), so every value staged in local
// memory is used WPTN or WPTM times from registers. The tile sizes are build options: the host
// builds one program per tiling (gemm.py's TILINGS) and picks one per shape. Each step of K
// stages a TK-deep slice of A and B in local memory while the next slice's loads are already in
// flight to registers.
//
// A and B are read through (row, column) strides, so transposed operands and im2col columns
// need no copy; the loads walk whichever dim is contiguous. Batch b reads A (and the bias) at
// group b % groups: the groups of a grouped convolution share one weight tensor, and a plain
// GEMM has groups = 1. With splits > 1, K is cut into `splits` slices of k_split: work-group z
// of dim 2 computes slice z % splits of batch z / splits and writes its raw partial product to
// C at z * c_batch; gemm_reduce then sums the slices, adds the bias and applies the activation.
// With has_res, R (laid out as C) is added before the activation: a residual connection.
// Each matrix is a buffer and the offset of its first element in it (see common.cl).
//
// Built with IMPLICIT, B is the column matrix of a 2-D convolution, read from the NCHW image
// itself (implicit GEMM: no im2col pass writes it out): element (k, n) of batch b is input
// channel k / (KH KW) of image b's group at kernel cell k % (KH KW) under output pixel n, or 0
// in the padding; b_batch is one group's channels, H x W each. Without it the geometry
// arguments are unused.
//
// Operands are DATA (common.cl: half with HALF_STORAGE), staged and multiplied in float. C is
// DATA too, except a split K's partial products, which a PARTIAL_FLOAT build writes as float.
#ifdef PARTIAL_FLOAT
#define OUT float
#define STORE_OUT(p, i, v) ((p)[i] = (v))
#else
#define OUT DATA
#define STORE_OUT(p, i, v) STORE(p, i, v)
#endif

#ifndef TM
#define TM 64
#endif
#ifndef TN
#define TN 64
#endif
#ifndef WPTM
#define WPTM 4
#endif
#ifndef WPTN
#define WPTN 4
#endif
#ifndef TK
#define TK 16
#endif
#define RM (TM / WPTM)  // work-items along the rows: local dim 1
#define RN (TN / WPTN)  // along the columns: local dim 0
#define THREADS (RM * RN)
#define A_LOADS (TM * TK / THREADS)
#define B_LOADS (TN * TK / THREADS)
#ifdef BLOCKED
// Each work-item owns WPTM consecutive rows and WPTN consecutive columns of the tile, read from
// local memory as vectors (a 128-bit load for four values): a third of the loads per
// multiply-add of rows and columns RM and RN apart. Rows of local memory stay 16-byte aligned.
#define PAD 4
#define ROW(i) (lr * WPTM + (i))
#define COL(j) (lc * WPTN + (j))
#if WPTM % 4 == 0
#define VA 4
#define AVEC float4
#else
#define VA 2
#define AVEC float2
#endif
#if WPTN % 4 == 0
#define VB 4
#define BVEC float4
#else
#define VB 2
#define BVEC float2
#endif
#else
#define PAD 1
#define ROW(i) (lr + RM * (i))
#define COL(j) (lc + RN * (j))
#endif
#if THREADS % TN != 0
#error "a work-item's B loads must stay in one column: THREADS must be a multiple of TN"
#endif

// Element e of a TK-deep slice, as (index along the tile, index along K): walking K first
// when that is the contiguous dim, so that neighbouring work-items read neighbouring floats.
#define SLICE_POS(e, k_fast, len, i, k) \
    do { if (k_fast) { i = (e) / TK; k = (e) % TK; } else { k = (e) / (len); i = (e) % (len); } } while (0)

__kernel __attribute__((reqd_work_group_size(RN, RM, 1)))
void gemm(int M, int N, int K, int groups, int splits, int k_split,
          __global const DATA* A, int A_off, int a_group, int a_rs, int a_cs,
          __global const DATA* B, int B_off, int b_batch, int b_rs, int b_cs,
          int H, int W, int KH, int KW, int OW, int SH, int SW, int PH, int PW, int DH, int DW,
          __global OUT* C, int C_off, int c_batch,
          __global const DATA* bias, int bias_off, int has_bias, int bias_group, int bias_rs, int bias_cs,
          __global const DATA* R, int R_off, int has_res,
          float alpha, float beta, int code, float act_alpha, float act_beta) {
    __local float As[TK][TM + PAD] __attribute__((aligned(16)));
    __local float Bs[TK][TN + PAD] __attribute__((aligned(16)));
    const int lc = get_local_id(0), lr = get_local_id(1);
    const int col0 = get_group_id(0) * TN, row0 = get_group_id(1) * TM;
    const int z = get_global_id(2), batch = z / splits, group = batch % groups;
    const int k0 = (z % splits) * k_split, k1 = min(K, k0 + k_split);
    const int tid = lr * RN + lc;
    const int a_k_fast = a_cs == 1 || a_rs != 1, b_k_fast = b_rs == 1 && b_cs != 1;
    A += A_off + group * a_group;
    B += B_off + batch * b_batch;
    C += C_off + z * c_batch;
    R += R_off + z * c_batch;  // read only when splits == 1, where z is the batch
    bias += bias_off;

    float acc[WPTM][WPTN];
    for (int i = 0; i < WPTM; ++i)
        for (int j = 0; j < WPTN; ++j) acc[i][j] = 0.0f;

    float ra[A_LOADS], rb[B_LOADS];  // the next slice, on its way from global memory
#define LOAD_A(t)                                                                        \
    for (int l = 0; l < A_LOADS; ++l) {                                                  \
        int m, k;                                                                        \
        SLICE_POS(tid + l * THREADS, a_k_fast, TM, m, k);                                \
        int gr = row0 + m, gk = (t) + k;                                                 \
        ra[l] = (gr < M && gk < k1) ? LOAD(A, gr * a_rs + gk * a_cs) : 0.0f;             \
    }
#ifdef IMPLICIT
#ifdef WINDOW_W  // the kernel window built in: its divisions become multiplications
#define KWIDTH WINDOW_W
#define KCELLS (WINDOW_H * WINDOW_W)
#else
#define KWIDTH KW
#define KCELLS (KH * KW)
#endif
    // This work-item loads one column (output pixel) of every slice: rows k_row + l THREADS/TN.
    const int b_col = tid % TN, k_row = tid / TN, kcells = KCELLS;
    const int out_pixel = col0 + b_col, in_columns = out_pixel < N;
    const int ih0 = (out_pixel / OW) * SH - PH, iw0 = (out_pixel % OW) * SW - PW;
#define LOAD_SLICE(t)                                                                    \
    LOAD_A(t)                                                                            \
    for (int l = 0; l < B_LOADS; ++l) {                                                  \
        int gk = (t) + k_row + l * (THREADS / TN);                                       \
        int c = gk / kcells, cell = gk - c * kcells, kh = cell / KWIDTH;                 \
        int ih = ih0 + kh * DH, iw = iw0 + (cell - kh * KWIDTH) * DW;                    \
        rb[l] = (in_columns && gk < k1 && (uint)ih < (uint)H && (uint)iw < (uint)W)      \
                    ? LOAD(B, (c * H + ih) * W + iw) : 0.0f;                             \
    }
#define B_POS(l, n, k) do { n = b_col; k = k_row + (l) * (THREADS / TN); } while (0)
#else
#define LOAD_SLICE(t)                                                                    \
    LOAD_A(t)                                                                            \
    for (int l = 0; l < B_LOADS; ++l) {                                                  \
        int n, k;                                                                        \
        SLICE_POS(tid + l * THREADS, b_k_fast, TN, n, k);                                \
        int gc = col0 + n, gk = (t) + k;                                                 \
        rb[l] = (gc < N && gk < k1) ? LOAD(B, gk * b_rs + gc * b_cs) : 0.0f;             \
    }
#define B_POS(l, n, k) SLICE_POS(tid + (l) * THREADS, b_k_fast, TN, n, k)
#endif

    LOAD_SLICE(k0)
    for (int t = k0; t < k1; t += TK) {
        barrier(CLK_LOCAL_MEM_FENCE);  // every work-item is done with the previous slice
        for (int l = 0; l < A_LOADS; ++l) {
            int m, k;
            SLICE_POS(tid + l * THREADS, a_k_fast, TM, m, k);
            As[k][m] = ra[l];
        }
        for (int l = 0; l < B_LOADS; ++l) {
            int n, k;
            B_POS(l, n, k);
            Bs[k][n] = rb[l];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (t + TK < k1) {
            LOAD_SLICE(t + TK)
        }
#ifdef GPU_DEVICE  // 8% faster on an H100; PoCL's CPU device only compiles longer
#pragma unroll
#endif
        for (int k = 0; k < TK; ++k) {
            float a[WPTM], b[WPTN];
#ifdef BLOCKED
            for (int q = 0; q < WPTM / VA; ++q) {
                AVEC v = *(__local const AVEC*)&As[k][ROW(VA * q)];
                for (int c = 0; c < VA; ++c) a[VA * q + c] = ((const float*)&v)[c];
            }
            for (int q = 0; q < WPTN / VB; ++q) {
                BVEC v = *(__local const BVEC*)&Bs[k][COL(VB * q)];
                for (int c = 0; c < VB; ++c) b[VB * q + c] = ((const float*)&v)[c];
            }
#else
            for (int i = 0; i < WPTM; ++i) a[i] = As[k][ROW(i)];
            for (int j = 0; j < WPTN; ++j) b[j] = Bs[k][COL(j)];
#endif
            for (int i = 0; i < WPTM; ++i)
                for (int j = 0; j < WPTN; ++j) acc[i][j] = mad(a[i], b[j], acc[i][j]);
        }
    }
#undef LOAD_SLICE
#undef LOAD_A
#undef B_POS

    for (int i = 0; i < WPTM; ++i) {
        int row = row0 + ROW(i);
        if (row >= M) continue;
        for (int j = 0; j < WPTN; ++j) {
            int col = col0 + COL(j);
            if (col >= N) continue;
            float v = acc[i][j];
            if (splits == 1) {
                v *= alpha;
                if (has_bias) v += beta * LOAD(bias, group * bias_group + row * bias_rs + col * bias_cs);
                if (has_res) v += LOAD(R, row * N + col);
                v = activate(v, code, act_alpha, act_beta);
            }
            STORE_OUT(C, row * N + col, v);
        }
    }
}

// The end of a split-K GEMM: C[b] = act(alpha * sum of P's slices of batch b + beta * bias + R[b]),
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
