"""Writes tests/data/fp8/e4m3_refs.txt: what ml_dtypes' float8_e4m3fn (the
format of PyTorch's torch.float8_e4m3fn and NVIDIA's E4M3) gives for every
byte and for the rounding of float32 values (ties, subnormals, the range's
edges, random values), which test_kv_types checks g4_f32_to_e4m3 and
g4_e4m3_to_f32 against. Values beyond +-448 saturate (CUDA's
__NV_SATFINITE), so only finite in-range inputs are taken from ml_dtypes,
whose cast gives NaN above 464."""
import struct, sys
import numpy as np
import ml_dtypes

e4m3 = ml_dtypes.float8_e4m3fn
rng = np.random.default_rng(7)
out = open(sys.argv[1] if len(sys.argv) > 1 else "tests/data/fp8/e4m3_refs.txt", "w")
out.write("# byte -> float32 bits (ml_dtypes float8_e4m3fn)\n")
for b in range(256):
    v = np.array([b], dtype=np.uint8).view(e4m3).astype(np.float32)[0]
    out.write("d %d %08x\n" % (b, struct.unpack("<I", struct.pack("<f", v))[0]))
vals = set()
codes = np.arange(256, dtype=np.uint8).view(e4m3).astype(np.float32)
finite = sorted(set(float(c) for c in codes if np.isfinite(c) and abs(c) <= 448))
for a, b in zip(finite, finite[1:]):  # every midpoint (ties) and points beside it
    m = np.float32((a + b) / 2)
    vals.update([m, np.nextafter(m, np.float32(-np.inf)), np.nextafter(m, np.float32(np.inf))])
for x in rng.standard_normal(1500).astype(np.float32) * np.float32(4):
    vals.add(x)
for x in (rng.uniform(-448, 448, 300)).astype(np.float32):
    vals.add(x)
for x in (rng.uniform(-0.02, 0.02, 300)).astype(np.float32):
    vals.add(x)
vals.update([np.float32(0), np.float32(-0.0), np.float32(448), np.float32(-448), np.float32(2 ** -9),
             np.float32(2 ** -10), np.float32(2 ** -6), np.float32(447.9)])
out.write("# float32 bits -> byte (round to nearest even)\n")
for x in sorted(vals, key=float):
    x = np.float32(x)
    if not np.isfinite(x) or abs(x) > 448:
        continue
    b = np.array([x], dtype=np.float32).astype(e4m3).view(np.uint8)[0]
    out.write("r %08x %d\n" % (struct.unpack("<I", struct.pack("<f", x))[0], b))
