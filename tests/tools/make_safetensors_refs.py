#!/usr/bin/env python3
"""Writes what Python `safetensors` reports about the vendored fixtures, for
tests/unit/test_safetensors.c to compare our reader against.

    python3 tests/tools/make_safetensors_refs.py /work/shared/fixtures tests/data/safetensors

For each fixture FOLDER it writes FOLDER.json: every *.safetensors file with
its size, metadata and tensors (name, dtype, shape, CRC-32 of the raw bytes,
the first and last few elements as numbers), plus the index's weight_map for
sharded checkpoints. Bytes come from safetensors.deserialize(); element values
are decoded with numpy (bf16 widened to float32 exactly).

It also writes python_written.safetensors: a small file written by Python
safetensors itself (several dtypes, a 0-d and an empty tensor, metadata) with
python_written.json describing it, so the C test reads a foreign writer's file.
Needs: numpy, safetensors.
"""
import glob
import json
import math
import os
import sys
import zlib

import numpy as np
import safetensors
from safetensors import deserialize, safe_open

FIXTURES = ["dense", "moe", "e2b", "realdims", "dense-mlx8", "moe-mlx4", "moe-mxfp4", "e2b-mlx4", "unified"]
N_VALUES = 3  # leading and trailing elements recorded per tensor

NUMPY_OF = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "u1",
}


def decode(dtype, data):
    """Raw little-endian bytes -> flat numpy array of the element values."""
    if dtype == "BF16":
        bits = np.frombuffer(bytes(data), dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32)
    return np.frombuffer(bytes(data), dtype=NUMPY_OF[dtype])


def json_number(v):
    """Exact JSON for one element: ints stay ints (as strings past 2^53), floats
    are the float64 value of the stored element (repr round-trips exactly),
    non-finite floats become strings."""
    if isinstance(v, (np.integer, int, np.bool_, bool)):
        v = int(v)
        return v if abs(v) <= 2**53 else str(v)
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def describe_file(path):
    with open(path, "rb") as f:
        raw = f.read()
    with safe_open(path, framework="numpy") as h:
        metadata = h.metadata()
        order = list(h.keys())
        specs = {k: (h.get_slice(k).get_dtype(), list(h.get_slice(k).get_shape())) for k in order}
    tensors = []
    for name, info in deserialize(raw):
        dtype, shape = info["dtype"], list(info["shape"])
        assert (dtype, shape) == specs[name], name
        values = decode(dtype, info["data"])
        head = [json_number(x) for x in values[:N_VALUES]]
        tail = [json_number(x) for x in values[max(N_VALUES, len(values) - N_VALUES):]]
        tensors.append({
            "name": name, "dtype": dtype, "shape": shape, "nbytes": len(info["data"]),
            "crc32": zlib.crc32(bytes(info["data"])), "first": head, "last": tail,
            "n_elements": int(len(values)),
        })
    tensors.sort(key=lambda t: t["name"])
    return {"file": os.path.basename(path), "size": len(raw), "metadata": metadata, "tensors": tensors}


def write_compact(path, obj):
    """One tensor per line: small diffs, still plain JSON."""
    text = json.dumps(obj, separators=(",", ":"))
    text = text.replace('},{"name"', '},\n{"name"')
    with open(path, "w") as f:
        f.write(text + "\n")


def make_fixture_refs(src, dst):
    for fixture in FIXTURES:
        folder = os.path.join(src, fixture)
        files = [describe_file(p) for p in sorted(glob.glob(os.path.join(folder, "*.safetensors")))]
        out = {"fixture": fixture, "safetensors_version": safetensors.__version__, "files": files}
        index = os.path.join(folder, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                out["weight_map"] = json.load(f)["weight_map"]
        write_compact(os.path.join(dst, fixture + ".json"), out)
        print(fixture, [(f["file"], len(f["tensors"])) for f in files])


def python_written_tensors():
    """Small tensors of every dtype our reader knows, with values that are
    exact in their type and easy to recognise."""
    f32 = (np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4) - 7.5) / 4
    bf16_values = np.array([[1.0, -2.5, 3.25], [0.0078125, -8589934592.0, 65280.0]], dtype=np.float32)
    bf16_bits = (bf16_values.view(np.uint32) >> 16).astype(np.uint16)  # values are exact in bf16
    return {
        "f32": ("F32", f32),
        "f64": ("F64", np.array([1.0 / 3, -2.0, 1e300], dtype=np.float64)),
        "f16": ("F16", np.array([0.5, -65504.0, 6.103515625e-05, 1.0], dtype=np.float16)),
        "bf16": ("BF16", bf16_bits),
        "i64": ("I64", np.array([-(2**40), 0, 2**40 + 1], dtype=np.int64)),
        "i32": ("I32", np.array([[-2147483648, -1], [0, 2147483647]], dtype=np.int32)),
        "i16": ("I16", np.array([-32768, 12345], dtype=np.int16)),
        "i8": ("I8", np.array([-128, 0, 127], dtype=np.int8)),
        "u32": ("U32", np.array([0, 4294967295, 123456789], dtype=np.uint32)),
        "u16": ("U16", np.array([65535, 1], dtype=np.uint16)),
        "u8": ("U8", np.arange(10, dtype=np.uint8).reshape(2, 5)),
        "bool": ("BOOL", np.array([True, False, True], dtype=np.bool_)),
        "scalar": ("F32", np.array(42.5, dtype=np.float32)),
        "empty": ("I32", np.zeros((0, 3), dtype=np.int32)),
    }


SPEC_DTYPE = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
              "I32": "int32", "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32", "U16": "uint16",
              "U8": "uint8", "BOOL": "bool"}


def serialize_raw(items, metadata):
    """safetensors.serialize for any version: TensorSpec (>= 0.8) or dicts."""
    arrays = {k: np.array(a, order="C", copy=True) for k, (_, a) in items.items()}  # keeps 0-d
    if hasattr(safetensors, "TensorSpec"):
        specs = {k: safetensors.TensorSpec(dtype=SPEC_DTYPE[d], shape=list(arrays[k].shape),
                                           data_ptr=arrays[k].ctypes.data, data_len=arrays[k].nbytes)
                 for k, (d, _) in items.items()}
        return bytes(safetensors.serialize(specs, metadata))
    raw = {k: {"dtype": d, "shape": list(arrays[k].shape), "data": arrays[k].tobytes()}
           for k, (d, _) in items.items()}
    return bytes(safetensors.serialize(raw, metadata))


def make_python_written(dst):
    items = python_written_tensors()
    blob = serialize_raw(items, {"format": "np", "writer": "make_safetensors_refs.py"})
    path = os.path.join(dst, "python_written.safetensors")
    with open(path, "wb") as f:
        f.write(blob)
    desc = describe_file(path)
    # All elements, not just the ends: these tensors are tiny.
    for t in desc["tensors"]:
        dtype, array = items[t["name"]]
        values = decode(dtype, array.tobytes()) if dtype == "BF16" else array.reshape(-1)
        t["values"] = [json_number(x) for x in values]
    write_compact(os.path.join(dst, "python_written.json"), desc)
    print("python_written", len(blob), "bytes")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    os.makedirs(dst, exist_ok=True)
    make_fixture_refs(src, dst)
    make_python_written(dst)


if __name__ == "__main__":
    main()
