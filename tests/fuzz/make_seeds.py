#!/usr/bin/env python3
"""Writes the small seed corpora under tests/fuzz/corpus/ from the fixtures
and real configs (run from the repository root):

    python3 tests/fuzz/make_seeds.py /work/shared/fixtures

fuzz_safetensors: real fixture headers (names, dtypes, metadata) with every
shape shrunk so the data stays tiny, plus the Python-written test file.
fuzz_st_index: the moe fixture's index and a two-shard one.
fuzz_config: fixture and release configs covering each form (per_layer_config,
global_head_dim, MoE, MLX quantization with overrides, unified, audio)."""
import json
import os
import shutil
import struct
import sys

OUT = "tests/fuzz/corpus"
SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
         "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}


def shrunk_safetensors(path, keep):
    """The file's header with at most `keep` tensors, each shape cut to <= 2
    per dimension, laid out contiguously; data bytes are a counting pattern."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    out, offset = {}, 0
    if "__metadata__" in header:
        out["__metadata__"] = header.pop("__metadata__")
    for name in sorted(header)[:keep]:
        e = header[name]
        shape = [min(d, 2) for d in e["shape"]]
        count = 1
        for d in shape:
            count *= d
        nbytes = count * SIZES[e["dtype"]]
        out[name] = {"dtype": e["dtype"], "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(out, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + bytes(i & 255 for i in range(offset))


def write(target, name, blob):
    os.makedirs(os.path.join(OUT, target), exist_ok=True)
    with open(os.path.join(OUT, target, name), "wb") as f:
        f.write(blob)


def main():
    fixtures = sys.argv[1]
    for fixture, keep in [("dense", 12), ("moe-mxfp4", 12), ("e2b-mlx4", 8), ("unified", 8)]:
        write("fuzz_safetensors", fixture, shrunk_safetensors(os.path.join(fixtures, fixture, "model.safetensors"), keep))
    write("fuzz_safetensors", "ref-dense", shrunk_safetensors(os.path.join(fixtures, "dense", "ref.safetensors"), 10))
    shutil.copy("tests/data/safetensors/python_written.safetensors", os.path.join(OUT, "fuzz_safetensors", "python_written"))

    with open(os.path.join(fixtures, "moe", "model.safetensors.index.json"), "rb") as f:
        write("fuzz_st_index", "moe", f.read())
    write("fuzz_st_index", "two_shards", json.dumps({"metadata": {"total_size": 32}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}).encode())

    for fixture in ["dense", "e2b", "moe-mxfp4", "unified"]:
        with open(os.path.join(fixtures, fixture, "config.json"), "rb") as f:
            write("fuzz_config", "fixture-" + fixture, f.read())
    for name in ["gemma-4-E2B-it.config.json", "gemma-4-26B-A4B-it.config.json",
                 "mlx/mlx-community_gemma-4-e4b-it-4bit.config.json", "gemma-4-12B-it.config.PARTIAL.json"]:
        with open(os.path.join("tests/data/hub", name), "rb") as f:
            write("fuzz_config", "hub-" + os.path.basename(name).replace(".config.json", ""), f.read())


if __name__ == "__main__":
    main()
