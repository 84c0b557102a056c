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
// C at z * c_batch; gemm_reduce.cl then sums the slices, adds the bias and applies the activation.
// With has_res, R (laid out as C) is added before the activation: a residual connection.
// A batch (or group) index may step at two levels, an outer and an inner one of `heads` steps:
// A's group g lies at (g / a_heads) * a_group + (g % a_heads) * a_head (B's batch alike), so
// that attention's heads are read where a head split left them, (batch, seq, heads, depth),
// with no transpose; one level (heads 1) for every other GEMM.
// Built with C_STRIDES, C is written through strides as A and B are read: element (row, col)
// of batch z at (z / c_heads) * c_batch + (z % c_heads) * c_head + row * c_rs + col * c_cs,
// so that a product lands transposed (attention's heads merged back into the sequence's rows
// as they are computed). Such a build takes K whole (splits 1) and no residual. Without it C
// is packed, (M, N) a batch, c_batch apart.
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
//
// Built with MMA (half operands only), the same GEMM runs on tensor cores: warps of 32
// work-items multiply the half slices staged in local memory with PTX's mma.sync
// (m16n8k16, float accumulators), written inline, which NVIDIA's OpenCL compiler takes;
// loads, splits and the epilogue are the FMA build's. The products of halves are exact in
// float and summed in float: the order of the sums, and the tensor cores' own rounding of
// them, differ from the FMA build.
#ifdef PARTIAL_FLOAT
#define OUT float
#define STORE_OUT(p, i, v) ((p)[i] = (v))
#else
#define OUT DATA
#define STORE_OUT(p, i, v) STORE(p, i, v)
#endif

#ifdef MMA
// The tensor cores' tiling: WARPS_M x WARPS_N warps of 32 work-items, each warp a
// (16 FRAG_M) x (8 FRAG_N) block of C made of m16n8k16 products, over TK-deep slices.
#define THREADS (32 * WARPS_M * WARPS_N)
#define TM (WARPS_M * 16 * FRAG_M)
#define TN (WARPS_N * 8 * FRAG_N)
#ifndef TK
#define TK 32
#endif
#define KPAD 8  // keeps a warp's fragment reads off each other's banks
#else
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

#endif

// The arguments of both builds of gemm (below): the FMA tiling's and, with MMA, the tensor cores'.
#define GEMM_ARGS                                                                                            \
    int M, int N, int K, int groups, int splits, int k_split,                                                \
    __global const DATA* A, int A_off, int a_group, int a_heads, int a_head, int a_rs, int a_cs,             \
    __global const DATA* B, int B_off, int b_batch, int b_heads, int b_head, int b_rs, int b_cs,             \
    int H, int W, int KH, int KW, int OW, int SH, int SW, int PH, int PW, int DH, int DW,                    \
    __global OUT* C, int C_off, int c_batch, int c_heads, int c_head, int c_rs, int c_cs,                    \
    __global const DATA* bias, int bias_off, int has_bias, int bias_group, int bias_rs, int bias_cs,         \
    __global const DATA* R, int R_off, int has_res,                                                          \
    float alpha, float beta, int code, float act_alpha, float act_beta

// Where batch (or group) i lies, at two levels in a HEAD_STEPS build, else at one: the
// divisions cost GEMMs that never need them registers and time (resnet50's convolutions at
// batch 8: 7% more device time with them in every build).
#ifdef HEAD_STEPS
#define BATCH_OFFSET(i, heads, outer, inner) (((i) / (heads)) * (outer) + ((i) % (heads)) * (inner))
#else
#define BATCH_OFFSET(i, heads, outer, inner) ((i) * (outer))
#endif

// Where C's batch z starts, and its element (row, col) from there.
#ifdef C_STRIDES
#define C_BATCH(z) (((z) / c_heads) * c_batch + ((z) % c_heads) * c_head)
#define C_AT(row, col) ((row) * c_rs + (col) * c_cs)
#else
#define C_BATCH(z) ((z) * c_batch)
#define C_AT(row, col) ((row) * N + (col))
#endif

// Where a work-group's operands and result lie: batch z / splits, K slice z % splits.
#define GEMM_START                                                                       \
    const int z = get_global_id(2), batch = z / splits, group = batch % groups;          \
    const int k0 = (z % splits) * k_split, k1 = min(K, k0 + k_split);                    \
    const int a_k_fast = a_cs == 1 || a_rs != 1, b_k_fast = b_rs == 1 && b_cs != 1;      \
    A += A_off + BATCH_OFFSET(group, a_heads, a_group, a_head);                          \
    B += B_off + BATCH_OFFSET(batch, b_heads, b_batch, b_head);                          \
    C += C_off + C_BATCH(z);                                                             \
    R += R_off + z * c_batch; /* read only when splits == 1, where z is the batch */     \
    bias += bias_off;

// C's element (row, col) from its sum v: the epilogue when K is whole, else the raw partial.
#define STORE_RESULT(row, col, value)                                                    \
    do {                                                                                 \
        float v = (value);                                                               \
        if (splits == 1) {                                                               \
            v *= alpha;                                                                  \
            if (has_bias) v += beta * LOAD(bias, group * bias_group + (row) * bias_rs + (col) * bias_cs); \
            if (has_res) v += LOAD(R, (row) * N + (col));                                \
            v = activate(v, code, act_alpha, act_beta);                                  \
        }                                                                                \
        STORE_OUT(C, C_AT(row, col), v);                                                 \
    } while (0)

// Element e of a TK-deep slice, as (index along the tile, index along K): walking K first
// when that is the contiguous dim, so that neighbouring work-items read neighbouring floats.
#define SLICE_POS(e, k_fast, len, i, k) \
    do { if (k_fast) { i = (e) / TK; k = (e) % TK; } else { k = (e) / (len); i = (e) % (len); } } while (0)

// A slice's values on their way from global memory: floats, or a half's bits for the tensor cores.
#ifdef MMA
#ifndef HALF_STORAGE
#error "the tensor cores multiply half operands: MMA needs HALF_STORAGE"
#endif
#define STAGED ushort
#define LOAD_STAGED(p, i) (((__global const ushort*)(p))[i])
#else
#define STAGED float
#define LOAD_STAGED(p, i) LOAD(p, i)
#endif
#define A_LOADS (TM * TK / THREADS)
#define B_LOADS (TN * TK / THREADS)
#if THREADS % TN != 0
#error "a work-item's B loads must stay in one column: THREADS must be a multiple of TN"
#endif

// Fill ra and rb with the slice of K from t: A's TM rows, and B's TN columns (with IMPLICIT,
// gathered from the image; B_POS gives where each lands in the tile).
#define LOAD_A(t)                                                                        \
    for (int l = 0; l < A_LOADS; ++l) {                                                  \
        int m, k;                                                                        \
        SLICE_POS(tid + l * THREADS, a_k_fast, TM, m, k);                                \
        int gr = row0 + m, gk = (t) + k;                                                 \
        ra[l] = (gr < M && gk < k1) ? LOAD_STAGED(A, gr * a_rs + gk * a_cs) : 0;         \
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
#define IMPLICIT_START                                                                   \
    const int b_col = tid % TN, k_row = tid / TN, kcells = KCELLS;                       \
    const int out_pixel = col0 + b_col, in_columns = out_pixel < N;                      \
    const int ih0 = (out_pixel / OW) * SH - PH, iw0 = (out_pixel % OW) * SW - PW;
#define LOAD_SLICE(t)                                                                    \
    LOAD_A(t)                                                                            \
    for (int l = 0; l < B_LOADS; ++l) {                                                  \
        int gk = (t) + k_row + l * (THREADS / TN);                                       \
        int c = gk / kcells, cell = gk - c * kcells, kh = cell / KWIDTH;                 \
        int ih = ih0 + kh * DH, iw = iw0 + (cell - kh * KWIDTH) * DW;                    \
        rb[l] = (in_columns && gk < k1 && (uint)ih < (uint)H && (uint)iw < (uint)W)      \
                    ? LOAD_STAGED(B, (c * H + ih) * W + iw) : 0;                         \
    }
#define B_POS(l, n, k) do { n = b_col; k = k_row + (l) * (THREADS / TN); } while (0)
#else
#define IMPLICIT_START
#define LOAD_SLICE(t)                                                                    \
    LOAD_A(t)                                                                            \
    for (int l = 0; l < B_LOADS; ++l) {                                                  \
        int n, k;                                                                        \
        SLICE_POS(tid + l * THREADS, b_k_fast, TN, n, k);                                \
        int gc = col0 + n, gk = (t) + k;                                                 \
        rb[l] = (gc < N && gk < k1) ? LOAD_STAGED(B, gk * b_rs + gc * b_cs) : 0;         \
    }
#define B_POS(l, n, k) SLICE_POS(tid + (l) * THREADS, b_k_fast, TN, n, k)
#endif

// Stage the slice of K from t, held in ra and rb, in local memory (As and Bs) once every
// work-item is done with the previous one, then start loading the next. LAYOUT(tile, i, k)
// is where element (i, k) of a tile goes: K_MAJOR for the FMA build, K_MINOR for the tensor
// cores' (K contiguous, as their fragments are read).
#define K_MAJOR(tile, i, k) tile[k][i]
#define K_MINOR(tile, i, k) tile[i][k]
#define STAGE_SLICE(t, LAYOUT)                                                           \
    barrier(CLK_LOCAL_MEM_FENCE);                                                        \
    for (int l = 0; l < A_LOADS; ++l) {                                                  \
        int m, k;                                                                        \
        SLICE_POS(tid + l * THREADS, a_k_fast, TM, m, k);                                \
        LAYOUT(As, m, k) = ra[l];                                                        \
    }                                                                                    \
    for (int l = 0; l < B_LOADS; ++l) {                                                  \
        int n, k;                                                                        \
        B_POS(l, n, k);                                                                  \
        LAYOUT(Bs, n, k) = rb[l];                                                        \
    }                                                                                    \
    barrier(CLK_LOCAL_MEM_FENCE);                                                        \
    if ((t) + TK < k1) {                                                                 \
        LOAD_SLICE((t) + TK)                                                             \
    }

#ifdef MMA
// D += A B on one warp's 16 x 8 block over 16 of K (PTX's mma.sync m16n8k16, f16 inputs,
// f32 accumulators). A work-item holds, of A, rows g and g + 8 (g = lane / 4) at columns
// 2t, 2t + 1 and 2t + 8, 2t + 9 (t = lane % 4), two halves a register; of B, rows 2t, 2t + 1
// and 2t + 8, 2t + 9 at column g; of D, rows g and g + 8 at columns 2t and 2t + 1.
// Built without TENSOR_CORES (a device without them: PoCL's, in the tests), the warp's
// product is computed from the same fragments through local memory, so the fragment layout
// the kernel relies on is checked everywhere.
#ifdef TENSOR_CORES
#define WARP_MMA(d, a, b)                                                                           \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "                          \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                       \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                              \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
#else
float half_bits(uint bits) {
    ushort h = (ushort)bits;
    return vload_half(0, (const half*)&h);
}
// Element (row, k) of the warp's A is in lane (row % 8) * 4 + (k % 8) / 2, register
// (row >= 8) + 2 (k >= 8), half k % 2; element (k, col) of B in lane col * 4 + (k % 8) / 2,
// register k >= 8, half k % 2.
#define WARP_MMA(d, a, b)                                                                           \
    do {                                                                                       \
        for (int r = 0; r < 4; ++r) fragments[warp][lane][r] = a[r];                           \
        for (int r = 0; r < 2; ++r) fragments[warp][lane][4 + r] = b[r];                       \
        barrier(CLK_LOCAL_MEM_FENCE);                                                          \
        for (int r = 0; r < 4; ++r) {                                                          \
            int row = g + 8 * (r >> 1), col = 2 * t + (r & 1);                                 \
            float sum = 0.0f;                                                                  \
            for (int k = 0; k < 16; ++k) {                                                     \
                uint av = fragments[warp][(row % 8) * 4 + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)]; \
                uint bv = fragments[warp][col * 4 + (k % 8) / 2][4 + (k >= 8)];                 \
                sum += half_bits(av >> (16 * (k % 2))) * half_bits(bv >> (16 * (k % 2)));       \
            }                                                                                  \
            d[r] += sum;                                                                       \
        }                                                                                      \
        barrier(CLK_LOCAL_MEM_FENCE);                                                          \
    } while (0)
#endif

// With MMA: C's TM x TN tile on the tensor cores. Each slice of A and B is staged in local
// memory as half bits, K contiguous (B transposed), and read as the warps' fragments.
__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void gemm(GEMM_ARGS) {
    __local ushort As[TM][TK + KPAD] __attribute__((aligned(16)));
    __local ushort Bs[TN][TK + KPAD] __attribute__((aligned(16)));
    const int tid = get_local_id(0), lane = tid % 32, warp = tid / 32;
    const int g = lane / 4, t = lane % 4;
    const int warp_row = (warp / WARPS_N) * 16 * FRAG_M, warp_col = (warp % WARPS_N) * 8 * FRAG_N;
    const int col0 = get_group_id(0) * TN, row0 = get_group_id(1) * TM;
#ifndef TENSOR_CORES
    __local uint fragments[WARPS_M * WARPS_N][32][6];
#endif
    GEMM_START
    IMPLICIT_START

    float acc[FRAG_M][FRAG_N][4];
    for (int i = 0; i < FRAG_M; ++i)
        for (int j = 0; j < FRAG_N; ++j)
            for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;

    STAGED ra[A_LOADS], rb[B_LOADS];  // the next slice, on its way from global memory
    LOAD_SLICE(k0)
    for (int s = k0; s < k1; s += TK) {
        STAGE_SLICE(s, K_MINOR)
#ifdef TENSOR_CORES
#pragma unroll
#endif
        for (int kk = 0; kk < TK; kk += 16) {
            uint a[FRAG_M][4], b[FRAG_N][2];
            for (int i = 0; i < FRAG_M; ++i)
                for (int r = 0; r < 4; ++r)
                    a[i][r] = *(__local const uint*)&As[warp_row + 16 * i + g + 8 * (r & 1)][kk + 2 * t + 8 * (r >> 1)];
            for (int j = 0; j < FRAG_N; ++j)
                for (int r = 0; r < 2; ++r)
                    b[j][r] = *(__local const uint*)&Bs[warp_col + 8 * j + g][kk + 2 * t + 8 * r];
            for (int i = 0; i < FRAG_M; ++i)
                for (int j = 0; j < FRAG_N; ++j) WARP_MMA(acc[i][j], a[i], b[j]);
        }
    }

    for (int i = 0; i < FRAG_M; ++i)
        for (int j = 0; j < FRAG_N; ++j)
            for (int r = 0; r < 4; ++r) {
                int row = row0 + warp_row + 16 * i + g + 8 * (r >> 1);
                int col = col0 + warp_col + 8 * j + 2 * t + (r & 1);
                if (row < M && col < N) STORE_RESULT(row, col, acc[i][j][r]);
            }
}
#else
__kernel __attribute__((reqd_work_group_size(RN, RM, 1)))
void gemm(GEMM_ARGS) {
    __local float As[TK][TM + PAD] __attribute__((aligned(16)));
    __local float Bs[TK][TN + PAD] __attribute__((aligned(16)));
    const int lc = get_local_id(0), lr = get_local_id(1);
    const int col0 = get_group_id(0) * TN, row0 = get_group_id(1) * TM;
    const int tid = lr * RN + lc;
    GEMM_START
    IMPLICIT_START

    float acc[WPTM][WPTN];
    for (int i = 0; i < WPTM; ++i)
        for (int j = 0; j < WPTN; ++j) acc[i][j] = 0.0f;

    STAGED ra[A_LOADS], rb[B_LOADS];  // the next slice, on its way from global memory
    LOAD_SLICE(k0)
    for (int t = k0; t < k1; t += TK) {
        STAGE_SLICE(t, K_MAJOR)
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

    for (int i = 0; i < WPTM; ++i) {
        int row = row0 + ROW(i);
        if (row >= M) continue;
        for (int j = 0; j < WPTN; ++j) {
            int col = col0 + COL(j);
            if (col < N) STORE_RESULT(row, col, acc[i][j]);
        }
    }
}
#endif
