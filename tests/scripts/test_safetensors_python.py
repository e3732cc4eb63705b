#!/usr/bin/env python3
"""Python safetensors reads what g4_st_write wrote.

tests/unit/test_safetensors.c (a ctest fixture set up before this test) writes
$G4_TMP/st_roundtrip.safetensors and st_roundtrip_empty.safetensors; this
script opens them with the reference implementation, which validates the
header strictly (contiguous offsets, sizes, trailing bytes), and checks every
dtype, shape and value. Keep the values in step with check_roundtrip().
Needs: numpy, safetensors (pip).
"""
import json
import os
import sys

import numpy as np
from safetensors import deserialize, safe_open

from checks import check, summary

def bf16_to_f32(raw):
    return (np.frombuffer(bytes(raw), dtype="<u2").astype(np.uint32) << 16).view(np.float32)


def main():
    tmp = os.environ.get("G4_TMP", "/tmp")
    path = os.path.join(tmp, "st_roundtrip.safetensors")
    if not os.path.exists(path):
        print(f"FAIL {path} is missing: test_safetensors writes it (run it first)", file=sys.stderr)
        print("0 passed, 1 failed")
        return 1
    with open(path, "rb") as f:
        raw = f.read()
    header_len = int.from_bytes(raw[:8], "little")
    check(header_len % 8 == 0, "header padded to 8 bytes")

    expected = {
        "u8": ("U8", [3], np.array([1, 2, 255], dtype=np.uint8)),
        "f32": ("F32", [2, 3], np.arange(6, dtype=np.float32) * np.float32(0.5) - np.float32(1.0)),
        "i32": ("I32", [4], np.array([-2147483648, -1, 0, 2147483647], dtype=np.int32)),
        "bf16": ("BF16", [3, 2], np.array([1.0, -2.5, 3.25, 0.0078125, -8589934592.0, 65280.0], np.float32)),
        "scalar": ("F32", [], np.array([42.5], dtype=np.float32)),
        "empty_f32": ("F32", [0, 5], np.zeros(0, dtype=np.float32)),
        "empty_i32": ("I32", [3, 0], np.zeros(0, dtype=np.int32)),
    }
    tensors = dict(deserialize(raw))  # raises on any structural problem
    check(sorted(tensors) == sorted(expected), f"tensor names {sorted(tensors)}")
    for name, (dtype, shape, values) in expected.items():
        t = tensors.get(name)
        if t is None:
            check(False, f"{name} missing")
            continue
        check(t["dtype"] == dtype, f"{name} dtype {t['dtype']}")
        check(list(t["shape"]) == shape, f"{name} shape {t['shape']}")
        if dtype == "BF16":
            got = bf16_to_f32(t["data"])
        else:
            got = np.frombuffer(bytes(t["data"]), dtype=values.dtype.newbyteorder("<"))
        check(got.shape == values.shape and np.array_equal(got, values), f"{name} values {got} != {values}")

    # The numpy front end (what most Python users call) agrees, incl. 0-d/empty.
    with safe_open(path, framework="numpy") as h:
        check(h.metadata() is None, "no __metadata__ written")
        for name in ("f32", "i32", "u8", "scalar", "empty_f32", "empty_i32"):
            a = h.get_tensor(name)
            dtype, shape, values = expected[name]
            check(list(a.shape) == shape, f"numpy {name} shape {a.shape}")
            check(np.array_equal(a.reshape(-1), values), f"numpy {name} values")
        check(h.get_tensor("scalar").ndim == 0, "scalar is 0-d")
    # Every tensor starts at a multiple of its element size.
    data_start = 8 + header_len
    header = json.loads(raw[8:data_start])
    sizes = {"U8": 1, "BF16": 2, "I32": 4, "F32": 4}
    for name, entry in header.items():
        begin = entry["data_offsets"][0]
        check((data_start + begin) % sizes[entry["dtype"]] == 0, f"{name} aligned in the file")

    empty = os.path.join(tmp, "st_roundtrip_empty.safetensors")
    with open(empty, "rb") as f:
        check(deserialize(f.read()) == [], "empty file has no tensors")

    return summary()


if __name__ == "__main__":
    sys.exit(main())
