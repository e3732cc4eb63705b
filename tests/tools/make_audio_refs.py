#!/usr/bin/env python3
"""Reference outputs for the audio tests (tests/unit/test_audio_*.c).

Everything here comes from the reference implementations themselves, not
from re-implementations:
  - decoding: soundfile (libsndfile) read as float32, channels averaged with
    numpy's mean, i.e. what librosa.load(mono=True) and transformers' load_audio
    do;
  - resampling: librosa.resample(res_type="soxr_hq"), which is what
    transformers 5.17's load_audio(sampling_rate=16000) runs (librosa.load);
  - features: transformers 5.17 Gemma4AudioFeatureExtractor and
    Gemma4UnifiedAudioFeatureExtractor with their defaults;
  - token counts: Gemma4Processor._compute_audio_num_tokens and
    replace_audio_token's mask arithmetic (and the unified twins).

Test signals come from synth() below, which uses integer arithmetic only so
that tests/unit/audio_test_util.h regenerates the identical samples in C.

Needs (pip, no torch): transformers==5.17.0 numpy soundfile soxr librosa safetensors
Run from the repository root:  python3 tests/tools/make_audio_refs.py
Writes tests/data/audio/ (small media files and refs.safetensors).
"""
import ast
import math
import os
import struct
import sys
import types

import numpy as np
import soundfile as sf
import librosa
from safetensors.numpy import save_file

import transformers
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
from transformers.models.gemma4_unified.feature_extraction_gemma4_unified import Gemma4UnifiedAudioFeatureExtractor



def processor_methods(module, cls, names):
    """The processor classes cannot be imported without torch (their kwargs
    types need the torchvision image processor), so take the named methods'
    source from the installed transformers file and run it as is."""
    path = os.path.join(os.path.dirname(transformers.__file__), "models", module, f"processing_{module}.py")
    tree = ast.parse(open(path).read())
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    ns = {"math": math, "np": np}
    for node in klass.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            exec(compile(ast.Module([node], []), path, "exec"), ns)
    return types.SimpleNamespace(**{k: ns[k] for k in names})


Gemma4Processor = processor_methods("gemma4", "Gemma4Processor", ["_compute_audio_num_tokens", "replace_audio_token"])
Gemma4UnifiedProcessor = processor_methods("gemma4_unified", "Gemma4UnifiedProcessor", ["_compute_audio_num_tokens"])

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "audio")
refs = {}


def synth_int(n, rate, seed=0):
    """int16-range integers: a triangle wave sweeping 200 Hz..3 kHz every 5 s,
    a stepped envelope (x1..x4 every 1/8 s) and hashed noise."""
    k = np.arange(seed, seed + n, dtype=np.uint64)
    f = 200 + (k * 2800 // (rate * 5)) % 2800
    inc = (f << np.uint64(32)) // np.uint64(rate)
    phase = np.cumsum(inc, dtype=np.uint64) & np.uint64(0xFFFFFFFF)
    p = (phase >> np.uint64(16)).astype(np.int64)
    tri = np.where(p < 32768, p, 65535 - p)
    env = 1 + (k // np.uint64(rate // 8)).astype(np.int64) % 4
    h = (k * np.uint64(0x9E3779B1)) & np.uint64(0xFFFFFFFF)
    h ^= h >> np.uint64(15)
    h = (h * np.uint64(0x85EBCA77)) & np.uint64(0xFFFFFFFF)
    h ^= h >> np.uint64(13)
    noise = (h >> np.uint64(20)).astype(np.int64)
    s = np.floor_divide((tri - 16384) * env, 4) + noise - 2048
    return np.clip(s, -32768, 32767).astype(np.int16)


def synth(n, rate, seed=0):
    return synth_int(n, rate, seed).astype(np.float32) / np.float32(32768.0)


def mono_like_librosa(y):
    """soundfile float32 [frames, channels] -> librosa.to_mono."""
    return y if y.ndim == 1 else librosa.to_mono(np.ascontiguousarray(y.T))


def put(name, arr):
    refs[name] = np.ascontiguousarray(arr)


# ---------------------------------------------------------------- features
fe = Gemma4AudioFeatureExtractor()


def features(wave):
    out = fe([wave], return_tensors="np")
    return out["input_features"][0], out["input_features_mask"][0]


def put_features(prefix, wave):
    f, m = features(wave)
    put(prefix + ".mask", m.astype(np.uint8))
    put(prefix + ".row_sums", f.astype(np.float64).sum(axis=1))
    put(prefix + ".col_sums", f.astype(np.float64).sum(axis=0))
    if f.shape[0] <= 100:
        put(prefix + ".features", f)
    else:  # a few frames from the start, middle and end
        t = f.shape[0]
        rows = np.unique(np.r_[0:4, t // 2 - 2:t // 2 + 2, t - 4:t]).astype(np.int32)
        put(prefix + ".rows", rows)
        put(prefix + ".features", f[rows])
    return f, m


put("window", fe.window)
put("mel_filter_sums", fe.mel_filters.sum(axis=0))
nz = fe.mel_filters != 0
put("mel_filter_ranges", np.stack([nz.argmax(axis=0), 257 - nz[::-1].argmax(axis=0)], axis=1).astype(np.int32))

# Lengths at 16 kHz, from nothing to past the 30 s cap.
LENGTHS = [1, 100, 160, 161, 320, 321, 481, 1600, 4000, 16000, 16001, 80000, 160000, 479999, 480000, 496000]
put("lengths", np.array(LENGTHS, dtype=np.int64))
for n in LENGTHS:
    put_features(f"len{n}", synth(n, 16000))

# ---------------------------------------------------------------- token counts
proc = types.SimpleNamespace(feature_extractor=fe, audio_seq_length=750, boa_token="", eoa_token="", audio_token="x")
rng = np.random.RandomState(5)
counts_n = list(range(0, 1200)) + sorted(set(rng.randint(1200, 520000, size=150).tolist())) + [479999, 480000, 480001, 600000, 10**7]
rows = []
for n in counts_n:
    formula = Gemma4Processor._compute_audio_num_tokens(proc, np.zeros(n), 16000)
    if n <= 600000 and n > 0:  # what the processor puts in the prompt: the subsampled mask
        m = fe([np.zeros(n, np.float32)], return_tensors="np")["input_features_mask"][0]
        prompt = len(Gemma4Processor.replace_audio_token(proc, {"input_features_mask": [m]}, 0))
    else:
        prompt = -1
    rows.append((n, formula, prompt))
put("token_counts", np.array(rows, dtype=np.int32))

ufe = Gemma4UnifiedAudioFeatureExtractor()
uproc = types.SimpleNamespace(feature_extractor=ufe)
urows = []
for n in [1, 639, 640, 641, 1280, 16000, 20800, 480000, 480001]:
    m = ufe([synth(n, 16000)], return_tensors="np")["input_features_mask"][0]
    urows.append((n, Gemma4UnifiedProcessor._compute_audio_num_tokens(uproc, np.zeros(n), 16000), int(m.sum())))
put("unified_token_counts", np.array(urows, dtype=np.int32))
put("unified.n1000.frames", ufe([synth(1000, 16000)], return_tensors="np")["input_features"][0])

# ---------------------------------------------------------------- resampling
for rate, seconds in [(44100, 0.5), (8000, 0.5), (22050, 0.25), (48000, 0.25), (1000, 0.5), (768000, 0.02)]:
    x = synth(int(rate * seconds), rate)
    put(f"rs{rate}.out", librosa.resample(x, orig_sr=rate, target_sr=16000))

# 31 s sources: transformers keeps the first 30 s (480000 samples at 16 kHz).
for rate in [44100, 8000, 16000]:
    x = synth(31 * rate, rate)
    y = librosa.resample(x, orig_sr=rate, target_sr=16000)
    put(f"long{rate}.n16k", np.array([len(y)], dtype=np.int64))
    kept = y[:480000]
    put(f"long{rate}.head", kept[:256])
    put(f"long{rate}.tail", kept[-256:])
    put(f"long{rate}.sums", np.array([kept.astype(np.float64).sum(), (kept.astype(np.float64) ** 2).sum()]))
    put_features(f"long{rate}", y)  # the extractor itself truncates at 480000

# ---------------------------------------------------------------- files
os.makedirs(OUT, exist_ok=True)


def multichannel(n, rate, channels):
    return np.stack([synth_int(n, rate, seed=1000 * c) for c in range(channels)], axis=1)


def add_file(name, data, rate, fmt, subtype, endian="FILE"):
    path = os.path.join(OUT, name)
    sf.write(path, data, rate, format=fmt, subtype=subtype, endian=endian)
    y, sr = sf.read(path, dtype="float32", always_2d=True)
    put(f"file.{name}.mono", mono_like_librosa(y))
    put(f"file.{name}.info", np.array([sr, y.shape[1]], dtype=np.int64))
    if sr != 16000:  # transformers 5.17 load_audio == librosa.load(path, sr=16000)
        put(f"file.{name}.load16k", transformers.audio_utils.load_audio(path, sampling_rate=16000))


def scaled(ints, dtype):
    return ints.astype(np.float64) / 32768.0 if dtype == "float" else ints


# PCM WAV variants, written from integers (or exact floats) so soundfile adds no rounding of its own.
add_file("u8_mono_8k.wav", synth_int(800, 8000), 8000, "WAV", "PCM_U8")
add_file("s16_stereo_16k.wav", multichannel(1600, 16000, 2), 16000, "WAV", "PCM_16")
add_file("s24_3ch_22k.wav", multichannel(1100, 22050, 3).astype(np.int32) * 65536 + 0x1234, 22050, "WAV", "PCM_24")
add_file("s32_mono_16k.wav", synth_int(1600, 16000).astype(np.int32) * 65536 + 0x5A5A, 16000, "WAV", "PCM_32")
add_file("f32_stereo_44k.wav", scaled(multichannel(2205, 44100, 2), "float"), 44100, "WAV", "FLOAT")
add_file("f64_mono_16k.wav", scaled(synth_int(1600, 16000), "float") * 1.25, 16000, "WAV", "DOUBLE")
add_file("ext_s16_4ch_48k.wav", multichannel(2400, 48000, 4), 48000, "WAVEX", "PCM_16")
add_file("ext_f32_6ch_16k.wav", scaled(multichannel(800, 16000, 6), "float"), 16000, "WAVEX", "FLOAT")
add_file("rifx_s16_stereo_16k.wav", multichannel(1600, 16000, 2), 16000, "WAV", "PCM_16", endian="BIG")
add_file("rifx_f32_mono_16k.wav", scaled(synth_int(800, 16000), "float"), 16000, "WAV", "FLOAT", endian="BIG")
add_file("ulaw_mono_8k.wav", synth_int(800, 8000), 8000, "WAV", "ULAW")
add_file("rf64_s16_stereo_16k.wav", multichannel(800, 16000, 2), 16000, "RF64", "PCM_16")
add_file("imaadpcm_mono_16k.wav", synth_int(1600, 16000), 16000, "WAV", "IMA_ADPCM")
# Compressed: half a second each.
add_file("flac_mono_16k.flac", synth_int(8000, 16000), 16000, "FLAC", "PCM_16")
add_file("vorbis_stereo_16k.ogg", multichannel(8000, 16000, 2), 16000, "OGG", "VORBIS")
add_file("opus_mono_16k.opus", synth_int(8000, 16000), 16000, "OGG", "OPUS")
add_file("mp3_mono_16k.mp3", synth_int(8000, 16000), 16000, "MP3", "MPEG_LAYER_III")
add_file("aiff_s16_mono_16k.aiff", synth_int(1600, 16000), 16000, "AIFF", "PCM_16")

save_file(refs, os.path.join(OUT, "refs.safetensors"),
          metadata={"transformers": transformers.__version__, "numpy": np.__version__,
                    "soundfile": sf.__version__, "libsndfile": sf.__libsndfile_version__,
                    "librosa": librosa.__version__})
print(f"wrote {len(refs)} references to {OUT} (transformers {transformers.__version__}, numpy {np.__version__})")
