# Emulates the tensor-core prefill attention (src/backend/cuda/cuda_attention_tc.cu, attention_tc_kernel) for one
# KV head: the shared-memory layouts and index arithmetic of every stage as the kernel writes them, each warp's
# mma.m16n8k16 fragments with PTX's operand layouts (as tests/tools/gemv_tc_layout.py), fp16 rounding of the hi/lo
# parts, float32 rounding of every float32 operation, and the tensor core's accumulation modelled pessimistically as
# truncation (round toward zero) of each mma's result to float32 (rn: round to nearest instead). Compared with float64
# attention (what the CPU backend computes) as rel_rms, the test's measure.
# Variants, to justify the design's choices numerically:
#   kernel      the kernel: fp16 hi/lo with power-of-two scales, 3 products, fresh accumulator per k-step / tile
#   inplace     the same, but the mma accumulate straight into the running sums (truncation against the total)
#   bf16        bf16 hi/lo (no scales needed), 3 products, fresh accumulators
#   two         fp16 hi/lo but only q_hi k_hi + q_lo k_hi (and p_hi v_hi + p_lo v_hi): 2 products
#   f32         a plain float32 attention (numpy float32 dot products, the CUDA-core kernel's precision class)
# No GPU, numpy only (a few minutes): python3 tests/tools/attention_tc_layout.py; prints rel_rms per case and variant
# and "bad N" (kernel variant above 2e-6 on any case, or any layout mismatch).
import numpy as np, sys

rng = np.random.default_rng(7)
BN, WARPS, THREADS, P_EXP, V_START = 32, 8, 256, 14, 100
lanes = np.arange(32); G_ = lanes >> 2; TIG = lanes & 3


def f32(x):
    return np.asarray(x, np.float64).astype(np.float32).astype(np.float64)


def f16(x):
    return np.asarray(x, np.float64).astype(np.float16).astype(np.float64)


def bf16(x):  # round to nearest even, via float32 bits
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def rz32(x):  # float64 -> float32 toward zero
    y = np.asarray(x, np.float64).astype(np.float32)
    over = np.abs(y.astype(np.float64)) > np.abs(x)
    y[over] = np.nextafter(y[over], np.float32(0))
    return y.astype(np.float64)


class Emu:
    def __init__(s, variant, rounding):
        s.variant, s.rz = variant, rounding == 'rz'
        s.half = bf16 if variant == 'bf16' else f16

    def split(s, x):  # x (float32 values) -> hi, lo
        x = f32(x)
        hi = s.half(x)
        lo = s.half(f32(x - hi))
        return hi, lo

    def mma(s, t4, a, b):  # t4 (32,4); a: 4 (lo,hi) pairs of (32,); b: 2 pairs; PTX m16n8k16 layouts
        A = np.zeros((16, 16)); B = np.zeros((16, 8)); C = np.zeros((16, 8))
        for reg, (r, k) in enumerate([(G_, 2 * TIG), (G_ + 8, 2 * TIG), (G_, 2 * TIG + 8), (G_ + 8, 2 * TIG + 8)]):
            A[r, k], A[r, k + 1] = a[reg]
        for reg, k in enumerate([2 * TIG, 2 * TIG + 8]):
            B[k, G_], B[k + 1, G_] = b[reg]
        cells = [(G_, 2 * TIG), (G_, 2 * TIG + 1), (G_ + 8, 2 * TIG), (G_ + 8, 2 * TIG + 1)]
        for reg, (r, n) in enumerate(cells):
            C[r, n] = t4[:, reg]
        R = C + A @ B
        R = rz32(R) if s.rz else f32(R)
        for reg, (r, n) in enumerate(cells):
            t4[:, reg] = R[r, n]

    def products(s, t4, a, b):  # a[part], b[part]
        if s.variant != 'two':
            s.mma(t4, a[1], b[0])
            s.mma(t4, a[0], b[1])
            s.mma(t4, a[0], b[0])
        else:
            s.mma(t4, a[1], b[0])
            s.mma(t4, a[0], b[0])


def exponent(peak, none, cap):
    if not (peak > 0 and np.isfinite(peak)):
        return none
    e = np.frexp(peak)[1]
    return int(max(-126, min(cap, 15 - e)))


def ld32(arr, idx):
    return (arr[idx], arr[idx + 1])


def attention_tc(emu, q, kpool, vpool, slot_of, ranges, seq, G, n_heads, kvh, scale, D, DMAX, BM):
    """One KV head's output rows [t][h][d] for tokens of q [n_tokens][n_heads][D]; kpool/vpool [slot][D] (this head)."""
    n_tokens = q.shape[0]
    out = np.full((n_tokens, n_heads, D), np.nan)
    MW = BM // 16; DW = WARPS // MW; QN = BN // 8 // DW; NT = DMAX // 8 // DW; TPR = THREADS // BM; KPT = BN // TPR
    LDP, LDS, ldq, D4, dn = BN + 8, BN + 4, D + 8, D // 4, D // 8
    total_rows = n_tokens * G
    tid = np.arange(THREADS); srow = tid // TPR; spart = tid % TPR
    fresh = emu.variant != 'inplace'

    def q_row(gr):
        return q[gr // G, kvh * G + gr % G]

    for first_row in range(0, total_rows, BM):
        last_row = min(first_row + BM, total_rows) - 1
        Qs = np.zeros(2 * BM * ldq)
        kv_halves = max(2 * BN * ldq, 2 * D * LDP)
        KV = np.zeros(kv_halves); Ss = np.zeros(BM * LDS); Ps = np.zeros(2 * BM * LDP)
        row_alpha = np.zeros(BM); row_l = np.zeros(BM)
        peak = max(np.max(np.abs(q_row(gr))) for gr in range(first_row, last_row + 1))
        eq = exponent(peak, 0, 126); q_up = 2.0 ** eq; q_down = 2.0 ** -eq
        for i in range(BM * D4):
            r, d = i // D4, (i % D4) * 4
            v = q_row(first_row + r)[d:d + 4] if first_row + r <= last_row else np.zeros(4)
            hi, lo = emu.split(f32(v * q_up))
            Qs[r * ldq + d:r * ldq + d + 4] = hi
            Qs[(BM + r) * ldq + d:(BM + r) * ldq + d + 4] = lo
        s_t = np.where(first_row + srow <= last_row, (first_row + srow) // G, -1)
        s_lo = np.array([ranges[t][0] if t >= 0 else 1 for t in s_t])
        s_hi = np.array([ranges[t][1] if t >= 0 else 0 for t in s_t])
        t_first, t_last = first_row // G, last_row // G
        run_start = t_first
        while run_start <= t_last:
            s = seq[run_start]; run_end = run_start + 1
            while run_end <= t_last and seq[run_end] == s:
                run_end += 1
            spans = [ranges[t] for t in range(run_start, run_end) if ranges[t][0] <= ranges[t][1]]
            lo_u = min(r[0] for r in spans) if spans else 1
            hi_u = max(r[1] for r in spans) if spans else 0
            s_active = (s_t >= run_start) & (s_t < run_end)
            m = np.full(THREADS, -np.inf); l = np.zeros(THREADS)
            ev = V_START
            acc = np.zeros((WARPS, NT, 32, 4))
            any_keys = lo_u <= hi_u
            tile_lo = lo_u
            while any_keys and tile_lo <= hi_u:
                slots = [slot_of(s, tile_lo + j) if tile_lo + j <= hi_u else -1 for j in range(BN)]
                kt = np.array([kpool[sl] if sl >= 0 else np.zeros(D) for sl in slots])
                vt = np.array([vpool[sl] if sl >= 0 else np.zeros(D) for sl in slots])
                pk, pv = np.max(np.abs(kt)), np.max(np.abs(vt))
                ek = exponent(pk, 0, 126); k_up = 2.0 ** ek
                for i in range(BN * D4):
                    j, d = i // D4, (i % D4) * 4
                    hi, lo = emu.split(f32(kt[j, d:d + 4] * k_up))
                    KV[j * ldq + d:j * ldq + d + 4] = hi
                    KV[(BN + j) * ldq + d:(BN + j) * ldq + d + 4] = lo
                # S = Q K^T
                for warp in range(WARPS):
                    mt, wd = warp % MW, warp // MW
                    sacc = np.zeros((QN, 32, 4))
                    qa = (mt * 16 + G_) * ldq + 2 * TIG
                    for k0 in range(0, D, 16):
                        a = []
                        for part in range(2):
                            pa = qa + part * BM * ldq + k0
                            a.append([ld32(Qs, pa), ld32(Qs, pa + 8 * ldq), ld32(Qs, pa + 8), ld32(Qs, pa + 8 * ldq + 8)])
                        for i in range(QN):
                            n = (wd + DW * i) * 8 + G_
                            b = []
                            for part in range(2):
                                pb = (part * BN + n) * ldq + k0 + 2 * TIG
                                b.append([ld32(KV, pb), ld32(KV, pb + 8)])
                            if fresh:
                                t4 = np.zeros((32, 4))
                                emu.products(t4, a, b)
                                sacc[i] = f32(sacc[i] + t4)
                            else:
                                emu.products(sacc[i], a, b)
                    for i in range(QN):
                        col = (wd + DW * i) * 8 + 2 * TIG; row = mt * 16 + G_
                        Ss[row * LDS + col] = sacc[i][:, 0]; Ss[row * LDS + col + 1] = sacc[i][:, 1]
                        Ss[(row + 8) * LDS + col] = sacc[i][:, 2]; Ss[(row + 8) * LDS + col + 1] = sacc[i][:, 3]
                # softmax, thread by thread (vectorised over the 256 threads)
                sf = f32(f32(scale * q_down) * 2.0 ** -ek)
                sv = np.zeros((THREADS, KPT))
                for i in range(KPT):
                    j = spart * KPT + i; pos = tile_lo + j
                    valid = s_active & (pos <= hi_u) & (pos >= s_lo) & (pos <= s_hi)
                    sv[:, i] = np.where(valid, f32(Ss[srow * LDS + j] * sf), -np.inf)
                tmax = sv.max(axis=1)
                o = 1
                while o < TPR:
                    tmax = np.maximum(tmax, tmax[tid ^ o]); o <<= 1
                m_new = np.maximum(m, tmax)
                with np.errstate(invalid='ignore'):
                    pr = np.where(np.isneginf(m_new)[:, None], 0.0,
                                  f32(np.exp(np.float32(sv - m_new[:, None]))))
                ssum = np.zeros(THREADS)
                for i in range(KPT):
                    ssum = f32(ssum + pr[:, i])
                o = 1
                while o < TPR:
                    ssum = f32(ssum + ssum[tid ^ o]); o <<= 1
                with np.errstate(invalid='ignore'):
                    alpha = np.where(s_active, np.where(np.isneginf(m), 0.0, f32(np.exp(np.float32(m - m_new)))), 1.0)
                l = np.where(s_active, f32(f32(l * alpha) + ssum), l)
                m = np.where(s_active, m_new, m)
                for i in range(0, KPT, 2):
                    j = spart * KPT + i
                    hi0, lo0 = emu.split(pr[:, i] * 2.0 ** P_EXP)
                    hi1, lo1 = emu.split(pr[:, i + 1] * 2.0 ** P_EXP)
                    Ps[srow * LDP + j] = hi0; Ps[srow * LDP + j + 1] = hi1
                    Ps[(BM + srow) * LDP + j] = lo0; Ps[(BM + srow) * LDP + j + 1] = lo1
                first = spart == 0
                row_alpha[srow[first]] = alpha[first]; row_l[srow[first]] = l[first]
                ev_new = min(ev, exponent(pv, V_START, V_START))
                v_change = 0.0 if ev_new - ev < -126 else 2.0 ** (ev_new - ev)
                ev = ev_new; v_up = 2.0 ** ev
                for i in range((BN // 2) * D4):
                    j, d = 2 * (i % (BN // 2)), (i // (BN // 2)) * 4
                    for c in range(4):
                        hi, lo = emu.split(f32(np.array([vt[j, d + c], vt[j + 1, d + c]]) * v_up))
                        KV[(d + c) * LDP + j:(d + c) * LDP + j + 2] = hi
                        KV[(D + d + c) * LDP + j:(D + d + c) * LDP + j + 2] = lo
                # O = O alpha + P V
                for warp in range(WARPS):
                    mt, wd = warp % MW, warp // MW
                    r0 = mt * 16 + G_
                    f0 = f32(row_alpha[r0] * v_change); f1 = f32(row_alpha[r0 + 8] * v_change)
                    a = []
                    for ks in range(BN // 16):
                        aa = []
                        for part in range(2):
                            pa = (part * BM + r0) * LDP + ks * 16 + 2 * TIG
                            aa.append([ld32(Ps, pa), ld32(Ps, pa + 8 * LDP), ld32(Ps, pa + 8), ld32(Ps, pa + 8 * LDP + 8)])
                        a.append(aa)
                    for i in range(NT):
                        nt = wd + DW * i
                        if nt >= dn:
                            continue
                        if not fresh:
                            acc[warp, i][:, 0:2] = f32(acc[warp, i][:, 0:2] * f0[:, None])
                            acc[warp, i][:, 2:4] = f32(acc[warp, i][:, 2:4] * f1[:, None])
                        t4 = np.zeros((32, 4)) if fresh else acc[warp, i]
                        for ks in range(BN // 16):
                            b = []
                            for part in range(2):
                                pb = (part * D + nt * 8 + G_) * LDP + ks * 16 + 2 * TIG
                                b.append([ld32(KV, pb), ld32(KV, pb + 8)])
                            emu.products(t4, a[ks], b)
                        if fresh:  # fmaf: one rounding
                            acc[warp, i][:, 0:2] = f32(acc[warp, i][:, 0:2] * f0[:, None] + t4[:, 0:2])
                            acc[warp, i][:, 2:4] = f32(acc[warp, i][:, 2:4] * f1[:, None] + t4[:, 2:4])
                tile_lo += BN
            out_f = 2.0 ** -(ev + P_EXP)
            for warp in range(WARPS):
                mt, wd = warp % MW, warp // MW
                for half in range(2):
                    for ln in range(32):
                        r = mt * 16 + G_[ln] + 8 * half; gr = first_row + r
                        if gr > last_row:
                            continue
                        t = gr // G
                        if t < run_start or t >= run_end:
                            continue
                        lr = row_l[r] if any_keys else 0.0
                        for i in range(NT):
                            nt = wd + DW * i
                            if nt < dn:
                                col = nt * 8 + 2 * TIG[ln]
                                for c in range(2):
                                    out[t, kvh * G + gr % G, col + c] = f32(f32(acc[warp, i][ln, 2 * half + c] * out_f) / lr) if lr > 0 else 0.0
            run_start = run_end
    return out


def reference(q, kpool, vpool, slot_of, ranges, seq, G, n_heads, kvh, scale, D, dtype):
    n_tokens = q.shape[0]
    out = np.zeros((n_tokens, n_heads, D))
    for t in range(n_tokens):
        lo, hi = ranges[t]
        if lo > hi:
            continue
        sl = [slot_of(seq[t], p) for p in range(lo, hi + 1)]
        K = kpool[sl].astype(dtype); V = vpool[sl].astype(dtype)
        for h in range(kvh * G, kvh * G + G):
            s = (K @ q[t, h].astype(dtype)) * dtype(scale)
            p = np.exp(s - s.max()); p = p / p.sum()
            out[t, h] = p @ V
    return out


def rel_rms(got, want):
    return float(np.sqrt(np.sum((got - want) ** 2) / np.sum(want ** 2)))


def case(label, D, G, n_tokens, first_pos, window, bs, ring, bidir=False, empty=False, two_seqs=False, scale=1.0,
         variants=('kernel',), bm=64):
    DMAX = 128 if D <= 128 else 256 if D <= 256 else 512
    BM = 32 if DMAX > 256 else bm
    total = first_pos + n_tokens
    n_slots = (total // bs + 4) * bs * 2
    perm = rng.permutation(n_slots // bs)
    stride = total // bs + 2

    def slot_of(s, p):  # ring: logical block wraps (as kv_slot); sequences use disjoint blocks
        lb = p // bs
        lb = lb % ring if ring else lb
        return perm[s * stride + lb] * bs + p % bs

    mag = lambda shape: rng.uniform(0.01, 2.0, shape) * rng.choice([-1, 1], shape)
    kpool = f32(mag((n_slots, D))); vpool = f32(mag((n_slots, D)))
    q = f32(mag((n_tokens, G, D)))
    seq = [0] * n_tokens
    if two_seqs:
        seq = [0] * (n_tokens // 2) + [1] * (n_tokens - n_tokens // 2)
    ranges = []
    for t in range(n_tokens):
        p = first_pos + t if seq[t] == 0 else first_pos + t - n_tokens // 2
        ranges.append([max(0, p - window + 1), p])
    if bidir:
        for t in range(2, 6):
            ranges[t][1] = first_pos + 5
    if empty:
        ranges[-1][0] = ranges[-1][1] + 1
    if ring:  # only positions a ring still holds: the last ring * bs (the test's chunks fit)
        for r in ranges:
            assert r[1] - r[0] < ring * bs
    want = reference(q, kpool, vpool, slot_of, ranges, seq, G, G, 0, scale, D, np.float64)
    res = {}
    for v in variants:
        if v == 'f32':
            got = reference(q, kpool, vpool, slot_of, ranges, seq, G, G, 0, scale, D, np.float32)
        else:
            name, rounding = (v.split(':') + ['rz'])[:2]
            got = attention_tc(Emu(name, rounding), q, kpool, vpool, slot_of, ranges, seq, G, G, 0, scale, D, DMAX, BM)
        res[v] = rel_rms(got, want) if np.all(np.isfinite(got)) else float('inf')
    print(f"{label:48s} " + "  ".join(f"{k} {e:.2e}" for k, e in res.items()), flush=True)
    return res


if __name__ == '__main__':
    bad = 0
    quick = len(sys.argv) > 1 and sys.argv[1] == 'quick'
    allv = ('kernel', 'kernel:rn', 'inplace', 'bf16', 'two', 'f32')
    cases = [
        # label, D, G, tokens, first position, window, block size, ring blocks, kwargs
        ("layouts: D 64, G 4, causal, 64 rows per block", 64, 4, 40, 0, 1 << 30, 16, 0, {}),
        ("layouts: D 64, G 4, causal, 32 rows per block", 64, 4, 40, 0, 1 << 30, 16, 0, dict(bm=32)),
        ("layouts: D 80, G 2, two sequences, empty row", 80, 2, 40, 30, 1 << 30, 16, 0, dict(two_seqs=True, empty=True)),
        ("image block, sliding 16, ring, 32 rows", 64, 2, 40, 20, 16, 16, 4, dict(bidir=True, bm=32)),
        ("image block, sliding 16, ring, 64 rows", 144, 2, 40, 20, 16, 16, 4, dict(bidir=True)),
        ("D 256 G 2 (window 64, ring), 32 rows per block", 256, 2, 40, 100, 64, 16, 8, dict(bm=32)),
        ("31B sliding-like D 256 G 2 (window 64, ring)", 256, 2, 48, 100, 64, 16, 8, dict(variants=allv)),
        ("31B global-like D 512 G 8", 512, 8, 36, 60, 1 << 30, 16, 0, dict(variants=allv)),
        ("E2B sliding-like D 256 G 8, scale 1/16", 256, 8, 40, 150, 512, 16, 0, dict(scale=0.0625, variants=allv)),
    ]
    if quick:
        cases = cases[:6]
    for label, D, G, n, fp, w, bs, ring, kw in cases:
        res = case(label, D, G, n, fp, w, bs, ring, **kw)
        if not res['kernel'] <= 2e-6:
            bad += 1
    print("bad", bad)
    sys.exit(1 if bad else 0)
