/* Prefill products of 4-bit affine (MLX) weights on Hopper's warpgroup
 * tensor cores, the codes decoded inside the main loop.
 *
 * The default quantised prefill (cuda_matmul.cu) first writes the weights
 * out as bf16 and then runs cuBLAS on them: for the 31B at 512 tokens that
 * pass costs about a third of the time. Here nothing is written: a block
 * keeps WGMMA_BM weight rows of 4-bit codes and WGMMA_BN tokens of bf16
 * activations in shared memory (cp.async, a ring of stages of WGMMA_BK
 * columns in flight), each thread decodes its part of the weights straight
 * into the register fragments of `wgmma` (A from registers: weights are M,
 * tokens are N), and the activations are read by the tensor cores from
 * shared memory through a 128-byte-swizzled descriptor.
 *
 * Every weight is decoded as the dequantising pass decodes it (s * q + b in
 * float32, rounded to bf16), so this differs from that path only in the
 * order of the float32 sums. One bf16 product (G4_PRECISION_FAST); the
 * exact precision keeps the dequantising path. Needs sm_90a machine code:
 * other targets compile an empty kernel that the planner never picks
 * (g4_cuda_caps.wgmma).
 *
 * Where it stands (H200, pp512; bench/RESULTS.md, issue 25): the MoE
 * experts' grouped product is its default (26B-A4B mlx4 13,808 t/s against
 * 12,506 with the pipelined mma.sync kernel); dense products stay on the
 * dequantising pass, which is faster (31B mlx4 5,092 against 4,074 here),
 * and reach this kernel only through the wgmma=2 test hook. Why: ptxas
 * serialises every wgmma (C7513: registers of a later wgmma's A are defined
 * while an earlier one is in flight), and the block-wide barrier per k tile
 * keeps the two warpgroups in step, so decoding never overlaps the tensor
 * cores. Next: decode into shared memory (both operands from shared memory,
 * the decode of tile k+1 beside the products of tile k), or let the
 * warpgroups ping-pong on per-stage mbarriers instead of __syncthreads. */
#include <string.h>

#include "backend/cuda/cuda_formats.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define G4_WGMMA_DEVICE 1
#else
#define G4_WGMMA_DEVICE 0
#endif

/* A block: two warpgroups of MT m64 tiles of weight rows (BM = 128 MT rows)
 * by NT tokens (the n of one wgmma), k tiles of 64 columns (128 bytes of
 * bf16 activations a token: one swizzle row), in a ring of stages that
 * holds as many as fit in 200 KB (up to 6). The weights are decoded once
 * per block, so their decoding costs 1/NT of an instruction per
 * multiply-add: tokens per block are what keeps it behind the tensor cores. */
enum { WGMMA_BK = 64, WGMMA_THREADS = 256 };
template <int MT> __host__ __device__ constexpr int wgmma_bm() { return 128 * MT; }
template <int NT> __host__ __device__ constexpr int wgmma_x_bytes() { return NT * WGMMA_BK * 2; }
template <int MT> __host__ __device__ constexpr int wgmma_w_bytes() { return wgmma_bm<MT>() * WGMMA_BK / 2; }
template <int MT, int NT> __host__ __device__ constexpr int wgmma_stage_bytes() {
    return wgmma_x_bytes<NT>() + wgmma_w_bytes<MT>(); /* a multiple of 1024 */
}
template <int MT, int NT> __host__ __device__ constexpr int wgmma_stages() {
    return 200 * 1024 / wgmma_stage_bytes<MT, NT>() < 6 ? 200 * 1024 / wgmma_stage_bytes<MT, NT>() : 6;
}
template <int MT, int NT> __host__ __device__ constexpr size_t wgmma_smem() {
    return (size_t)wgmma_stages<MT, NT>() * wgmma_stage_bytes<MT, NT>() + 1024; /* + alignment slack */
}

struct wgmma_args {
    const uint8_t *codes, *scales, *biases;
    size_t row_bytes, scale_row_bytes;
    int scale_dtype, group_size;
    int64_t rows, cols;     /* weight rows (M; per expert when grouped), columns (K, a multiple of WGMMA_BK) */
    const __nv_bfloat16 *x; /* activation rows, cols apart */
    int tokens;             /* dense: N */
    float *out;             /* out[t * ldo + r]; grouped: t is the slot */
    size_t ldo;
    /* grouped (the MoE experts): tile blockIdx.x holds slots sorted[tile_start[tile] + i], i < tile_len[tile],
     * of expert tile_expert[tile], whose row r is weight row expert * expert_stride + row_offset + r; slot s
     * reads activation row s / x_div */
    cuda_groups g;
    int64_t expert_stride, row_offset;
    int x_div;
};

#if G4_WGMMA_DEVICE
__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16 bytes global -> shared; bytes 0 fills the destination with zeros */
__device__ __forceinline__ void copy16(uint32_t dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void copy_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/* shared-memory matrix descriptor: K-major rows of 128 bytes, 128-byte
 * swizzle, 8-row groups 1024 bytes apart */
__device__ __forceinline__ uint64_t x_descriptor(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* d (64 rows x 64 tokens, float32) += a (64 x 16 bf16, registers) * x (16 x 64, shared) */
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

/* d (64 rows x 256 tokens, float32) += a (64 x 16 bf16, registers) * x (16 x 256, shared) */
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], const uint32_t (&a)[4], uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
        "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
        "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "
        "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, "
        "%101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, "
        "%117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

template <int NT> __device__ __forceinline__ void wgmma_m64k16(float (&d)[NT / 2], const uint32_t (&a)[4], uint64_t desc) {
    static_assert(NT == 64 || NT == 256, "an n of wgmma this file writes out");
    if constexpr (NT == 256) wgmma_m64n256k16(d, a, desc);
    else wgmma_m64n64k16(d, a, desc);
}

/* two 4-bit codes (the low byte of v) as s * q + b, rounded to a bf16 pair */
__device__ __forceinline__ uint32_t decode_pair(uint32_t v, float s, float b) {
    const float magic = 8388608.0f;
    const float lo = fmaf(s, __uint_as_float((v & 15u) | 0x4B000000u) - magic, b);
    const float hi = fmaf(s, __uint_as_float(((v >> 4) & 15u) | 0x4B000000u) - magic, b);
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}
#endif

/* G: groups of scales a k tile spans (1 for groups of 64 columns or more, 2
 * for 32, 4 for 16). */
template <int G, int MT, int NT, bool GROUPED>
__global__ void __launch_bounds__(WGMMA_THREADS, 1) wgmma_q4_kernel(wgmma_args a) {
#if G4_WGMMA_DEVICE
    constexpr int BM = wgmma_bm<MT>(), X_BYTES = wgmma_x_bytes<NT>(), STAGE = wgmma_stage_bytes<MT, NT>();
    constexpr int STAGES = wgmma_stages<MT, NT>(), AHEAD = STAGES - 2; /* k tiles copied ahead of the one decoded */
    static_assert(STAGES >= 3, "a stage being read by the tensor cores, one decoded, one landing");
    constexpr int X_CHUNKS = NT * 8 / WGMMA_THREADS, W_CHUNKS = BM * 2 / WGMMA_THREADS; /* 16-byte copies a thread */
    extern __shared__ uint8_t wgmma_smem_raw[];
    /* the swizzle pattern repeats every 1024 bytes: stages start at multiples */
    const uint32_t raw = smem_addr(wgmma_smem_raw);
    const uint32_t base = (raw + 1023u) & ~1023u;
    uint8_t *smem = wgmma_smem_raw + (base - raw);

    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    /* the block's tokens (dense: n0 + i; grouped: the tile's slots) and weight rows */
    int64_t n0 = 0, w_base = 0;
    int n_len = 0;
    const int32_t *slots = NULL;
    if constexpr (GROUPED) {
        const int tile = blockIdx.x;
        if (tile >= *a.g.n_tiles) return;
        slots = a.g.sorted + a.g.tile_start[tile];
        n_len = a.g.tile_len[tile];
        w_base = (int64_t)a.g.tile_expert[tile] * a.expert_stride + a.row_offset;
    } else {
        n0 = (int64_t)blockIdx.x * NT; /* tokens: the fast index, so blocks of one weight tile run together */
        n_len = a.tokens - n0 < NT ? (int)(a.tokens - n0) : NT;
    }
    const int64_t m0 = (int64_t)blockIdx.y * BM;
    const int KT = (int)(a.cols / WGMMA_BK);

    /* this thread's copies: X_CHUNKS 16-byte chunks of activations and W_CHUNKS of codes a stage */
    const __nv_bfloat16 *x_src[X_CHUNKS];
    int x_bytes[X_CHUNKS];
#pragma unroll
    for (int i = 0; i < X_CHUNKS; i++) {
        const int c = tid + i * WGMMA_THREADS, row = c >> 3, ch = c & 7;
        const bool in = row < n_len;
        int64_t src_row = 0;
        if (in) src_row = GROUPED ? slots[row] / a.x_div : n0 + row;
        x_src[i] = a.x + (size_t)src_row * (size_t)a.cols + ch * 8;
        x_bytes[i] = in ? 16 : 0;
    }
    auto load_stage = [&](int kt, int stage) {
        const uint32_t xs = base + (uint32_t)(stage * STAGE), ws = xs + X_BYTES;
        const int64_t k0 = (int64_t)kt * WGMMA_BK;
#pragma unroll
        for (int i = 0; i < X_CHUNKS; i++) {
            const int c = tid + i * WGMMA_THREADS, row = c >> 3, ch = c & 7;
            copy16(xs + (uint32_t)(row * 128 + ((ch ^ (row & 7)) * 16)), x_src[i] + k0, x_bytes[i]);
        }
#pragma unroll
        for (int i = 0; i < W_CHUNKS; i++) {
            const int c = tid + i * WGMMA_THREADS, row = c >> 1, ch = c & 1;
            const int64_t r = m0 + row;
            const bool in = r < a.rows;
            const uint8_t *src = a.codes + (size_t)(w_base + (in ? r : 0)) * a.row_bytes + (size_t)(k0 / 2 + ch * 16);
            copy16(ws + (uint32_t)(row * 32 + ch * 16), src, in ? 16 : 0);
        }
    };

    /* this thread's 2 MT weight rows (block-local): m tile i, upper/lower half h */
    int lrow[MT][2];
    const uint8_t *srow[MT][2], *brow[MT][2];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            lrow[i][h] = wg * 64 * MT + i * 64 + warp * 16 + g + h * 8;
            int64_t r = m0 + lrow[i][h];
            if (r >= a.rows) r = a.rows - 1; /* its codes are zeros; any valid scale row does */
            srow[i][h] = a.scales + (size_t)(w_base + r) * a.scale_row_bytes;
            brow[i][h] = a.biases + (size_t)(w_base + r) * a.scale_row_bytes;
        }

    float acc[MT][NT / 2];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT / 2; j++) acc[i][j] = 0.0f;

    /* Tile kt: its copies waited for, its codes decoded into fragment buffer kt & 1 while the tensor cores
     * still multiply tile kt - 1 (one group in flight), then its 4 k16 steps issued as one group; tile kt + AHEAD
     * is copied into the stage of tile kt - 2, whose products are done. */
#pragma unroll
    for (int s = 0; s < AHEAD; s++) {
        if (s < KT) load_stage(s, s);
        copy_commit();
    }
    /* two fragment buffers, used by alternate tiles: each tile's body is written out twice (a runtime index into
     * registers that the tensor cores read asynchronously would not stay registers) */
    uint32_t frag0[4][MT][4], frag1[4][MT][4]; /* [k16 step][m tile][register] */
    auto tile = [&](int kt, uint32_t (&frag)[4][MT][4]) {
        const int stage = kt % STAGES;
        /* this tile's scales and biases, loaded while its copies land */
        float sc[MT][2][G], bi[MT][2][G];
        const int64_t g0 = (int64_t)kt * WGMMA_BK / a.group_size;
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int q = 0; q < G; q++) {
                    sc[i][h][q] = load_group_param(srow[i][h], a.scale_dtype, g0 + q);
                    bi[i][h][q] = load_group_param(brow[i][h], a.scale_dtype, g0 + q);
                }
        copy_wait<AHEAD - 1>();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* cp.async writes -> wgmma reads */
        __syncthreads(); /* every copy of tile kt landed; every product of tile kt - 2 is done */
        if (kt + AHEAD < KT) load_stage(kt + AHEAD, (kt + AHEAD) % STAGES);
        copy_commit();

        const uint32_t xs = base + (uint32_t)(stage * STAGE);
        const uint8_t *ws = smem + stage * STAGE + X_BYTES;
#pragma unroll
        for (int i = 0; i < MT; i++) {
            /* the codes of this thread's two rows: 32 bytes each (8 words of 8 columns) */
            uint32_t code[2][8];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint4 *p = reinterpret_cast<const uint4 *>(ws + lrow[i][h] * 32);
                const uint4 lo = p[0], hi = p[1];
                code[h][0] = lo.x, code[h][1] = lo.y, code[h][2] = lo.z, code[h][3] = lo.w;
                code[h][4] = hi.x, code[h][5] = hi.y, code[h][6] = hi.z, code[h][7] = hi.w;
            }
#pragma unroll
            for (int s = 0; s < 4; s++) {
                const int q = s * G / 4;
                /* word 2s: columns 16s..16s+7, word 2s+1: 16s+8..; this thread's pair is byte t */
                frag[s][i][0] = decode_pair(code[0][2 * s] >> (8 * t), sc[i][0][q], bi[i][0][q]);
                frag[s][i][1] = decode_pair(code[1][2 * s] >> (8 * t), sc[i][1][q], bi[i][1][q]);
                frag[s][i][2] = decode_pair(code[0][2 * s + 1] >> (8 * t), sc[i][0][q], bi[i][0][q]);
                frag[s][i][3] = decode_pair(code[1][2 * s + 1] >> (8 * t), sc[i][1][q], bi[i][1][q]);
            }
        }
        const uint64_t desc = x_descriptor(xs);
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; s++)
#pragma unroll
            for (int i = 0; i < MT; i++)
                /* 16 columns further on: 32 bytes, 2 in the descriptor's 16-byte units */
                wgmma_m64k16<NT>(acc[i], frag[s][i], desc + (uint64_t)(2 * s));
        wgmma_commit();
        wgmma_wait<1>(); /* tile kt - 1's products are done: its fragments and stage are free */
    };
    for (int kt = 0; kt < KT; kt += 2) {
        tile(kt, frag0);
        if (kt + 1 < KT) tile(kt + 1, frag1);
    }
    wgmma_wait<0>();

    /* accumulator j of m tile i: row 16 warp + g (+8 for j & 2), token 8 (j / 4) + 2 t (+1 for j & 1) */
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT / 2; j++) {
            const int64_t r = m0 + lrow[i][(j >> 1) & 1];
            const int tok = 8 * (j >> 2) + 2 * t + (j & 1);
            if (r >= a.rows || tok >= n_len) continue;
            const int64_t dst = GROUPED ? (int64_t)slots[tok] : n0 + tok;
            a.out[(size_t)dst * a.ldo + (size_t)r] = acc[i][j];
        }
#endif
}

/* The kernel has sm_90a code in this build and the device runs it. */
int cuda_wgmma_available(void) {
    cudaFuncAttributes attr;
    if (cudaFuncGetAttributes(&attr, wgmma_q4_kernel<1, 1, 256, false>) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return attr.binaryVersion == 90;
}

template <int G, int MT, int NT, bool GROUPED> static void launch_wgmma(cuda_ctx *c, const wgmma_args &a, dim3 grid) {
    constexpr size_t smem = wgmma_smem<MT, NT>();
    static unsigned configured; /* the opt-in above 48 KB, once per kernel and device */
    if (!cuda_done_on_device(&configured, c)) {
        if (!cuda_check(c, cudaFuncSetAttribute(wgmma_q4_kernel<G, MT, NT, GROUPED>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                        "cudaFuncSetAttribute"))
            return;
        cuda_mark_device(&configured, c);
    }
    wgmma_q4_kernel<G, MT, NT, GROUPED><<<grid, WGMMA_THREADS, smem, c->stream>>>(a);
    cuda_launched(c, GROUPED ? "wgmma_q4 (grouped)" : "wgmma_q4");
}

template <int MT, int NT, bool GROUPED> static void launch_groups(cuda_ctx *c, const wgmma_args &a, dim3 grid) {
    switch (a.group_size) {
    case 16: launch_wgmma<4, MT, NT, GROUPED>(c, a, grid); break;
    case 32: launch_wgmma<2, MT, NT, GROUPED>(c, a, grid); break;
    default: launch_wgmma<1, MT, NT, GROUPED>(c, a, grid); break;
    }
}

static wgmma_args args_of(const g4_matrix *w, float *out, size_t ldo, const __nv_bfloat16 *x) {
    wgmma_args a;
    memset(&a, 0, sizeof a);
    a.codes = (const uint8_t *)w->data;
    a.scales = (const uint8_t *)w->scales;
    a.biases = (const uint8_t *)w->biases;
    a.row_bytes = w->row_bytes;
    a.scale_row_bytes = w->scale_row_bytes;
    a.scale_dtype = dev_matrix_of(w).scale_dtype;
    a.group_size = w->group_size;
    a.rows = w->rows;
    a.cols = w->cols;
    a.x = x;
    a.out = out;
    a.ldo = ldo;
    a.x_div = 1;
    return a;
}

void cuda_wgmma_q4_gemm(cuda_ctx *c, float *out, size_t ldo, const __nv_bfloat16 *x, int n_tokens,
                        const g4_matrix *w) {
    wgmma_args a = args_of(w, out, ldo, x);
    a.tokens = n_tokens;
    /* 128 weight rows by 256 tokens */
    const dim3 grid(cuda_blocks((size_t)n_tokens, 256), cuda_blocks((size_t)w->rows, wgmma_bm<1>()));
    launch_groups<1, 256, false>(c, a, grid);
}

void cuda_wgmma_q4_grouped(cuda_ctx *c, float *out, size_t ldo, const __nv_bfloat16 *x, int x_div,
                           const g4_matrix *w, int64_t rows, int64_t expert_stride, int64_t row_offset,
                           const cuda_groups *g) {
    wgmma_args a = args_of(w, out, ldo, x);
    a.rows = rows;
    a.g = *g;
    a.expert_stride = expert_stride;
    a.row_offset = row_offset;
    a.x_div = x_div > 0 ? x_div : 1;
    /* tiles of CUDA_MMA_GROUP_BM (64) slots; weight rows by 128 (the 26B's 704-row experts: 6 blocks, no 256-row
     * block two-thirds empty) */
    static_assert(CUDA_MMA_GROUP_BM == 64, "a tile of slots is one n64 wgmma");
    const dim3 grid((unsigned)g->max_tiles, cuda_blocks((size_t)rows, wgmma_bm<1>()));
    launch_groups<1, CUDA_MMA_GROUP_BM, true>(c, a, grid);
}
