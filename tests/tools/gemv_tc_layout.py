# Emulates the fragment layouts of the tensor-core GEMV (src/backend/cuda/cuda_gemv_tc.cu, gemv_tc_tokens_kernel and
# its pre-passes) for one warp and one 16-row tile, with PTX's mma.m16n8k16 operand layouts, against a float64 GEMV:
# 4- and 8-bit affine codes, groups of 32/64/128, 1..8 tokens. A check for layout changes without a GPU (about a
# minute; numpy): python3 tests/tools/gemv_tc_layout.py; prints rel_rms per case and "bad 0".
import numpy as np, sys
rng = np.random.default_rng(1)

def h2(u32):  # uint32 -> two fp16 (low, high) as float64
    lo = np.array([u32 & 0xFFFF], dtype=np.uint16).view(np.float16)[0]
    hi = np.array([(u32 >> 16) & 0xFFFF], dtype=np.uint16).view(np.float16)[0]
    return float(lo), float(hi)

def pack(a, b):
    return int(np.array([a], np.float16).view(np.uint16)[0]) | (int(np.array([b], np.float16).view(np.uint16)[0]) << 16)

def prepare(x, BITS, gc):  # x: cols (one token) -> list of blocks: (frags[FRAGS] of 4 u32, sums[8])
    BC = 128 if BITS == 4 else 64
    FR = 32 if BITS == 4 else 16
    nb = (len(x) + BC - 1) // BC
    out = []
    for blk in range(nb):
        xs = np.zeros(BC, np.float32)
        seg = x[blk*BC:(blk+1)*BC]; xs[:len(seg)] = seg
        peak = np.max(np.abs(xs))
        e = 0
        if peak > 0:
            m, e = np.frexp(peak); e -= 15
        down = np.float32(2.0 ** -e)
        sums = [0.0]*8; sums[4] = 2.0 ** e
        for s in range(BC // gc): sums[s] = float(np.sum(xs[s*gc:(s+1)*gc], dtype=np.float64))
        frags = []
        for lane in range(FR):
            regs = []
            for j in range(4):
                if BITS == 4:
                    c, h, u = lane >> 3, (lane >> 2) & 1, lane & 3
                    k = 32*c + 8*u + [0, 2, 1, 3][j]; k2 = k + 4
                else:
                    c, h, v = lane >> 2, (lane >> 1) & 1, lane & 1
                    k = 16*c + 4*(2*v + (j >> 1)) + (j & 1); k2 = k + 2
                a = np.float32(xs[k] * down); b = np.float32(xs[k2] * down)
                ha, hb = np.float16(a), np.float16(b)
                if h == 1: ha, hb = np.float16(a - np.float32(ha)), np.float16(b - np.float32(hb))
                regs.append(pack(ha, hb))
            frags.append(regs)
        out.append((frags, sums))
    return out

def mma(D, A, B):  # A[lane] 4 regs, B[lane] 2 regs, D[lane] 4 floats (in place), PTX m16n8k16 layouts
    Am = np.zeros((16, 16)); Bm = np.zeros((16, 8))
    for lane in range(32):
        g, c = lane >> 2, lane & 3
        for i, (r, k) in enumerate([(g, 2*c), (g+8, 2*c), (g, 2*c+8), (g+8, 2*c+8)]):
            Am[r, k], Am[r, k+1] = h2(A[lane][i])
        for i, k in enumerate([2*c, 2*c+8]):
            Bm[k, g], Bm[k+1, g] = h2(B[lane][i])
    Dm = Am @ Bm
    for lane in range(32):
        g, c = lane >> 2, lane & 3
        D[lane][0] += Dm[g, 2*c]; D[lane][1] += Dm[g, 2*c+1]; D[lane][2] += Dm[g+8, 2*c]; D[lane][3] += Dm[g+8, 2*c+1]

def run(BITS, gs, n, cols, NT=8):
    rows = 16
    BC = 128 if BITS == 4 else 64; FR = 32 if BITS == 4 else 16
    q = rng.integers(0, 1 << BITS, size=(rows, cols))
    ng = cols // gs
    s = rng.uniform(0.001, 0.01, size=(rows, ng)); b = -s * ((1 << BITS) - 1) * 0.5
    X = rng.uniform(0.05, 2, size=(n, cols)) * rng.choice([-1, 1], size=(n, cols))
    X = X.astype(np.float32)
    want = np.array([[np.sum((s[r, np.arange(cols)//gs] * q[r] + b[r, np.arange(cols)//gs]) * X[t]) for r in range(rows)] for t in range(n)])
    # packed rows
    if BITS == 4:
        data = [bytes([(q[r, 2*i] | (q[r, 2*i+1] << 4)) for i in range(cols//2)]) for r in range(rows)]
    else:
        data = [bytes([q[r, i] for i in range(cols)]) for r in range(rows)]
    gc = min(gs, BC); slots = BC // gc; per_mma = 4 // slots
    prep = [prepare(X[t], BITS, gc) for t in range(n)]
    nb = len(prep[0])
    acc_lo = np.zeros((32, NT)); acc_hi = np.zeros((32, NT))
    for blk in range(nb):
        A0 = [[None]*4 for _ in range(32)]; A1 = [[None]*4 for _ in range(32)]
        for lane in range(32):
            g, c = lane >> 2, lane & 3
            def words(r):
                bs = data[r][blk*64 + 16*c: blk*64 + 16*c + 16]
                if blk*BC + (BC//4)*c >= cols or len(bs) < 16: return [0]*4
                return [int.from_bytes(bs[4*u:4*u+4], 'little') for u in range(4)]
            wl, wh = words(g), words(g + 8)
            for u in range(4):
                if BITS == 4:
                    def dec(w):
                        t = w >> 8
                        return [w & 0x000F000F, t & 0x000F000F, w & 0x00F000F0, t & 0x00F000F0]
                    pl, ph = dec(wl[u]), dec(wh[u])
                    A0[lane][u] = [pl[0], ph[0], pl[1], ph[1]]; A1[lane][u] = [pl[2], ph[2], pl[3], ph[3]]
                else:
                    pl = [wl[u] & 0x00FF00FF, (wl[u] >> 8) & 0x00FF00FF]; ph = [wh[u] & 0x00FF00FF, (wh[u] >> 8) & 0x00FF00FF]
                    A0[lane][u] = [pl[0], ph[0], pl[1], ph[1]]
        for j in range(NT):
            if j * per_mma >= n: break
            d = [[0.0]*4 for _ in range(32)]; e = [[0.0]*4 for _ in range(32)]
            def bfr(lane):
                g, c = lane >> 2, lane & 3
                my_slot = c * (BC // 4) // gc
                b_col = g >> 1; b_tok = b_col // slots
                bt = j * per_mma + b_tok
                act = (b_col % slots == my_slot) and bt < n
                idx = (c * 2 + (g & 1)) * (FR // 8)
                return [prep[bt][blk][0][idx + u] if act else [0, 0, 0, 0] for u in range(FR // 8)]
            xf = [bfr(l) for l in range(32)]
            if BITS == 4:
                for u in range(4):
                    mma(d, [A0[l][u] for l in range(32)], [xf[l][u][0:2] for l in range(32)])
                    mma(e, [A1[l][u] for l in range(32)], [xf[l][u][2:4] for l in range(32)])
            else:
                for v in range(2):
                    mma(d, [A0[l][2*v] for l in range(32)], [xf[l][v][0:2] for l in range(32)])
                    mma(d, [A0[l][2*v+1] for l in range(32)], [xf[l][v][2:4] for l in range(32)])
            for lane in range(32):
                g, c = lane >> 2, lane & 3
                o_slot, o_tok = c % slots, c // slots
                ot = j * per_mma + o_tok
                if ot >= n: continue
                sums = prep[ot][blk][1]
                up = sums[4] * (2.0**24 if BITS == 8 else 2.0**20)
                if BITS == 8:
                    vlo, vhi = d[lane][0] + d[lane][1], d[lane][2] + d[lane][3]
                else:
                    vlo = (d[lane][0] + d[lane][1]) * 16 + e[lane][0] + e[lane][1]
                    vhi = (d[lane][2] + d[lane][3]) * 16 + e[lane][2] + e[lane][3]
                slot_col = blk * BC + o_slot * gc
                if slot_col >= cols: continue
                grp = slot_col // gs
                acc_lo[lane][j] += s[g, grp] * vlo * up + b[g, grp] * sums[o_slot]
                acc_hi[lane][j] += s[g+8, grp] * vhi * up + b[g+8, grp] * sums[o_slot]
    got = np.full((n, rows), np.nan)
    for j in range(NT):
        if j * per_mma >= n: break
        for lane in range(32):
            g, c = lane >> 2, lane & 3
            if c % slots: continue
            ot = j * per_mma + c // slots
            if ot >= n: continue
            lanes = [lane + i for i in range(slots)]
            got[ot][g] = sum(acc_lo[l][j] for l in lanes); got[ot][g+8] = sum(acc_hi[l][j] for l in lanes)
    err = np.sqrt(np.mean((got - want)**2) / np.mean(want**2))
    print(f"bits {BITS} gs {gs} n {n} cols {cols}: rel_rms {err:.2e}")
    return err

bad = 0
for BITS in (4, 8):
    for gs in (32, 64, 128):
        for n, cols in ((1, 256), (3, 384), (5, 160 if gs == 32 else 384), (8, 256)):
            if cols % gs: continue
            bad += run(BITS, gs, n, cols) > 1e-5
print("bad", bad)
sys.exit(1 if bad else 0)
