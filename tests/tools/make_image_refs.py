#!/usr/bin/env python3
"""Writes tests/data/image/: small test images and what the reference stack
makes of them, for tests/unit/test_image_*.c.

  decode/     images in every PNG/JPEG/WebP flavour we support (and broken
              ones), with `transformers.image_utils.load_image`'s RGB for each
              (PIL open + ImageOps.exif_transpose + convert("RGB")).
  resize/     source PNGs; resize_pil.txt lists PIL.Image.resize(BICUBIC)
              results (raw bytes in resize_pil.bin, or a CRC-32
              for the large ones).
  resize_torchvision.{txt,bin}  the same cases through torchvision's
              resize(BICUBIC, antialias=True) on uint8 tensors, and
  resize_pil12.{txt,bin}  PIL.Image.resize under Pillow 12 (before Pillow 13
              made tall downscales run the vertical pass first); both written
              with --torch on a machine with torch and Pillow 12 (the GPU
              machine: torch 2.11, torchvision 0.26, Pillow 12.3). The rest
              needs only Pillow 13, numpy and transformers, no torch.
  target_sizes.txt  get_aspect_ratio_preserving_size from transformers.
  preprocess_pil.txt Gemma4ImageProcessorPil end to end (checksums).

Usage: python3 tests/tools/make_image_refs.py [--torch]   (from the repo root)
Needs: pip install pillow numpy transformers  (torch + torchvision for --torch)
"""
import io
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image, ImageOps

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "image")
OUT = os.path.normpath(OUT)
RNG = np.random.RandomState(20240611)


def crc(data: bytes) -> str:
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


# ---------------------------------------------------------------- test images
def picture(w, h, seed=0):
    """Gradients, noise and saturated blocks: bicubic over/undershoot is
    exercised at the block edges."""
    rs = np.random.RandomState(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x * 7 + y * 13) % 256)], -1)
    img = img.astype(np.int32) + rs.randint(-40, 41, size=(h, w, 3))
    if w >= 4 and h >= 4:
        img[h // 4: h // 2, w // 4: w // 2] = [255, 0, 255]
        img[h // 2: 3 * h // 4, w // 2: 3 * w // 4] = [0, 255, 0]
    return np.clip(img, 0, 255).astype(np.uint8)


# ---------------------------------------------------------------- raw PNG writer
def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bytes(w, h, color_type, depth, rows, before=(), after=(), interlace=False, palette=None, after_plte=()):
    """rows: list of h packed scanlines (no filter byte). Interlacing only for
    byte-aligned pixels (depth >= 8)."""
    ihdr = struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, 1 if interlace else 0)
    if interlace:
        chans = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color_type]
        bpp = chans * depth // 8
        raw = b""
        for x0, y0, dx, dy in [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
                               (0, 1, 1, 2)]:
            for y in range(y0, h, dy):
                line = b"".join(rows[y][x * bpp:(x + 1) * bpp] for x in range(x0, w, dx))
                if line:
                    raw += b"\0" + line
    else:
        raw = b"".join(b"\0" + r for r in rows)
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
    for c in before:
        out += c
    if palette is not None:
        out += chunk(b"PLTE", bytes(palette))
    for c in after_plte:
        out += c
    out += chunk(b"IDAT", zlib.compress(raw, 9))
    for c in after:
        out += c
    return out + chunk(b"IEND", b"")


def pack_rows(samples, depth):
    """samples: [h][n] ints -> packed scanlines at `depth` bits (big-endian for 16)."""
    rows = []
    for r in samples:
        if depth == 16:
            rows.append(b"".join(struct.pack(">H", int(v)) for v in r))
        elif depth == 8:
            rows.append(bytes(int(v) for v in r))
        else:
            bits = "".join(format(int(v), f"0{depth}b") for v in r)
            bits += "0" * (-len(bits) % 8)
            rows.append(bytes(int(bits[i:i + 8], 2) for i in range(0, len(bits), 8)))
    return rows


def exif_bytes(orientation, big_endian=False):
    e = Image.Exif()
    e[0x0112] = orientation
    data = e.tobytes()
    if big_endian:  # hand-made big-endian TIFF with one SHORT entry
        data = b"Exif\0\0" + b"MM\0*" + struct.pack(">I", 8) + struct.pack(">H", 1) + \
            struct.pack(">HHIHH", 0x0112, 3, 1, orientation, 0) + struct.pack(">I", 0)
    return data


def xmp_text(orientation, attribute=True):
    body = (f'tiff:Orientation="{orientation}"' if attribute else "")
    inner = "" if attribute else f"<tiff:Orientation>{orientation}</tiff:Orientation>"
    return ('<?xpacket begin="" id="W5M0MpCehiHzreSzNTczkc9d"?><x:xmpmeta xmlns:x="adobe:ns:meta/">'
            '<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><rdf:Description '
            f'xmlns:tiff="http://ns.adobe.com/tiff/1.0/" {body}>{inner}</rdf:Description></rdf:RDF>'
            '</x:xmpmeta><?xpacket end="w"?>')


# ---------------------------------------------------------------- decode cases
def decode_cases():
    """(name, bytes, must_fail) triples."""
    cases = []
    W, H = 23, 17
    rs = np.random.RandomState(5)

    def add(name, data, bad=False):
        cases.append((name, data, bad))

    def pil_save(img, fmt, **kw):
        b = io.BytesIO()
        img.save(b, fmt, **kw)
        return b.getvalue()

    pic = picture(W, H, 1)
    rgb = Image.fromarray(pic, "RGB")
    # --- PNG: every colour type and bit depth
    for depth in (1, 2, 4, 8, 16):
        s = rs.randint(0, 1 << depth, size=(H, W))
        if depth == 16:  # mostly small values, as PIL's I;16 -> RGB clips at 255
            s = np.where(rs.rand(H, W) < 0.6, rs.randint(0, 300, size=(H, W)), s)
        add(f"png_grey{depth}.png", png_bytes(W, H, 0, depth, pack_rows(s, depth)))
    for depth in (8, 16):
        s = rs.randint(0, 1 << depth, size=(H, W * 2))
        add(f"png_greyalpha{depth}.png", png_bytes(W, H, 4, depth, pack_rows(s, depth)))
        s = rs.randint(0, 1 << depth, size=(H, W * 3))
        add(f"png_rgb{depth}.png", png_bytes(W, H, 2, depth, pack_rows(s, depth)))
        s = rs.randint(0, 1 << depth, size=(H, W * 4))
        add(f"png_rgba{depth}.png", png_bytes(W, H, 6, depth, pack_rows(s, depth)))
        add(f"png_rgba{depth}_interlaced.png", png_bytes(W, H, 6, depth, pack_rows(s, depth), interlace=True))
    s = rs.randint(0, 256, size=(H, W * 3))
    add("png_rgb8_interlaced.png", png_bytes(W, H, 2, 8, pack_rows(s, 8), interlace=True))
    for depth in (1, 2, 4, 8):
        n = 1 << depth
        pal = rs.randint(0, 256, size=3 * n).tolist()
        s = rs.randint(0, n, size=(H, W))
        add(f"png_palette{depth}.png", png_bytes(W, H, 3, depth, pack_rows(s, depth), palette=pal))
    # palette with transparency (tRNS), and indices past a short PLTE
    pal = rs.randint(0, 256, size=3 * 16).tolist()
    s = rs.randint(0, 16, size=(H, W))
    trns = chunk(b"tRNS", bytes(rs.randint(0, 256, size=16).tolist()))
    add("png_palette_trns.png", png_bytes(W, H, 3, 8, pack_rows(s, 8), palette=pal, after_plte=[trns]))
    s = rs.randint(0, 256, size=(H, W))
    add("png_palette_short.png", png_bytes(W, H, 3, 8, pack_rows(s, 8), palette=pal))  # 16 entries, indices to 255
    s = rs.randint(0, 256, size=(H, W * 3))
    add("png_rgb_trns.png", png_bytes(W, H, 2, 8, pack_rows(s, 8), before=[chunk(b"tRNS", struct.pack(">HHH", 1, 2, 3))]))
    add("png_gamma_srgb.png", png_bytes(W, H, 2, 8, pack_rows(s, 8), before=[chunk(b"gAMA", struct.pack(">I", 100000)),
                                                                                  chunk(b"sRGB", b"\0")]))
    # PIL-written PNGs (zlib streams and filters of a real encoder)
    add("png_pil_rgb.png", pil_save(rgb, "PNG", optimize=True))
    add("png_pil_la.png", pil_save(Image.fromarray(np.dstack([pic[..., 0], pic[..., 1]]), "LA"), "PNG"))
    # --- orientation (an asymmetric picture, so every transpose shows)
    small = Image.fromarray(picture(7, 4, 2), "RGB")
    small_np = np.array(small)
    for o in range(1, 9):
        add(f"orient{o}_exif.png", pil_save(small, "PNG", exif=exif_bytes(o)))
        add(f"orient{o}_exif.webp", pil_save(small, "WEBP", lossless=True, exif=exif_bytes(o)))
        add(f"orient{o}_exif.jpg", pil_save(small, "JPEG", quality=95, exif=exif_bytes(o)))
    add("orient6_exif_bigendian.jpg", pil_save(small, "JPEG", quality=95, exif=exif_bytes(6, big_endian=True)))
    add("orient8_xmp_attr.jpg", pil_save(small, "JPEG", quality=95, xmp=xmp_text(8).encode()))
    add("orient5_xmp_element.jpg", pil_save(small, "JPEG", quality=95, xmp=xmp_text(5, attribute=False).encode()))
    add("orient3_exif_beats_xmp.jpg", pil_save(small, "JPEG", quality=95, exif=exif_bytes(3),
                                               xmp=xmp_text(6).encode()))
    rows = pack_rows(small_np.reshape(4, -1), 8)
    add("orient7_xmp.png", png_bytes(7, 4, 2, 8, rows, before=[
        chunk(b"iTXt", b"XML:com.adobe.xmp\0\0\0\0\0" + xmp_text(7).encode())]))
    raw = exif_bytes(6)[6:]
    profile = f"\nexif\n{len(raw):8}\n{raw.hex()}\n".encode()
    add("orient6_rawprofile.png", png_bytes(7, 4, 2, 8, rows, before=[chunk(b"tEXt", b"Raw profile type exif\0" + profile)]))
    add("orient6_exif_after_idat.png", png_bytes(7, 4, 2, 8, rows, after=[chunk(b"eXIf", raw)]))
    # --- JPEG
    add("jpeg_420.jpg", pil_save(rgb, "JPEG", quality=90, subsampling=2))
    add("jpeg_422.jpg", pil_save(rgb, "JPEG", quality=90, subsampling=1))
    add("jpeg_444.jpg", pil_save(rgb, "JPEG", quality=90, subsampling=0))
    add("jpeg_progressive.jpg", pil_save(rgb, "JPEG", quality=85, progressive=True))
    add("jpeg_optimized_q30.jpg", pil_save(rgb, "JPEG", quality=30, optimize=True))
    add("jpeg_restart.jpg", pil_save(rgb, "JPEG", quality=90, restart_marker_blocks=1))
    add("jpeg_grey.jpg", pil_save(rgb.convert("L"), "JPEG", quality=90))
    cmyk = Image.fromarray(rs.randint(0, 256, size=(H, W, 4)).astype(np.uint8), "CMYK")
    add("jpeg_cmyk.jpg", pil_save(cmyk, "JPEG", quality=90))
    big = Image.fromarray(picture(61, 45, 3), "RGB")
    add("jpeg_420_odd.jpg", pil_save(big, "JPEG", quality=75))
    j = pil_save(rgb, "JPEG", quality=90)
    add("jpeg_extraneous_bytes.jpg", j[:-2] + b"\x12\x34\x56\x78" + j[-2:])  # libjpeg warns; PIL decodes
    add("bad_jpeg_no_eoi.jpg", j[:-2], True)  # PIL: "image file is truncated"
    # --- WebP
    add("webp_lossy.webp", pil_save(rgb, "WEBP", quality=80))
    add("webp_lossless.webp", pil_save(rgb, "WEBP", lossless=True))
    rgba = np.dstack([pic, rs.randint(0, 256, size=(H, W)).astype(np.uint8)])
    rgba[0:5, 0:5, 3] = 0
    add("webp_lossless_alpha.webp", pil_save(Image.fromarray(rgba, "RGBA"), "WEBP", lossless=True, exact=True))
    add("webp_lossy_alpha.webp", pil_save(Image.fromarray(rgba, "RGBA"), "WEBP", quality=80))
    frames = [Image.fromarray(picture(W, H, 10 + i), "RGB") for i in range(2)]
    b = io.BytesIO()
    frames[0].save(b, "WEBP", save_all=True, append_images=frames[1:], duration=100, lossless=True)
    add("webp_animated.webp", b.getvalue())
    # --- format from the bytes, not the name
    add("png_named.jpg", pil_save(rgb, "PNG"))
    add("jpeg_named.webp", pil_save(rgb, "JPEG", quality=90))
    # --- must fail
    good_png, good_jpg, good_webp = pil_save(rgb, "PNG"), pil_save(big, "JPEG", quality=90), pil_save(big, "WEBP")
    add("bad_empty.png", b"", True)
    add("bad_one_byte.jpg", b"\xff", True)
    add("bad_png_signature_only.png", good_png[:8], True)
    add("bad_png_truncated_header.png", good_png[:20], True)
    add("bad_png_truncated_half.png", good_png[:len(good_png) // 2], True)
    add("bad_png_truncated_end.png", good_png[:-13], True)
    c = bytearray(good_png)
    i = c.find(b"IDAT")
    c[i + 10] ^= 0xFF
    add("bad_png_crc.png", bytes(c), True)
    add("bad_png_bomb.png", png_bytes(1, 1, 2, 8, [b"\0\0\0"]).replace(
        chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)),
        chunk(b"IHDR", struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0))), True)
    add("bad_png_bomb_line.png", png_bytes(1, 1, 0, 8, [b"\0"]).replace(
        chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)),
        chunk(b"IHDR", struct.pack(">IIBBBBB", 200000000, 1, 8, 0, 0, 0, 0))), True)
    add("bad_png_zero_width.png", png_bytes(1, 1, 2, 8, [b"\0\0\0"]).replace(
        chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)),
        chunk(b"IHDR", struct.pack(">IIBBBBB", 0, 1, 8, 2, 0, 0, 0))), True)
    add("bad_jpeg_truncated_header.jpg", good_jpg[:100], True)
    add("bad_jpeg_truncated_data.jpg", good_jpg[:int(len(good_jpg) * 0.7)], True)
    jp = bytearray(good_jpg)
    k = jp.find(b"\xff\xc0")
    jp[k + 5:k + 9] = struct.pack(">HH", 65000, 65000)  # SOF0 height, width
    add("bad_jpeg_bomb.jpg", bytes(jp), True)
    add("bad_webp_truncated.webp", good_webp[:len(good_webp) // 2], True)
    add("bad_webp_header_only.webp", good_webp[:12], True)
    vp8l = b"RIFF" + struct.pack("<I", 4 + 8 + 6) + b"WEBP" + b"VP8L" + struct.pack("<I", 6) + b"\x2f" + \
        struct.pack("<I", (16382) | (16382 << 14)) + b"\0\0"
    add("bad_webp_bomb.webp", vp8l, True)
    add("bad_random.bin", bytes(rs.randint(0, 256, size=300).tolist()), True)
    add("bad_text.png", b"this is not an image\n", True)
    add("bad_gif.gif", pil_save(rgb.convert("P"), "GIF"), True)
    add("bad_bmp.bmp", pil_save(rgb, "BMP"), True)
    return cases


def write_decode():
    from transformers.image_utils import load_image

    d = os.path.join(OUT, "decode")
    os.makedirs(d, exist_ok=True)
    lines = ["# name width height crc32-of-rgb   (load_image's RGB is in name.rgb, e.g. x.png.rgb) | name FAIL"]
    for name, data, bad in decode_cases():
        path = os.path.join(d, name)
        with open(path, "wb") as f:
            f.write(data)
        try:
            img = load_image(path)
            arr = np.asarray(img.convert("RGB"), dtype=np.uint8)
            ok = True
        except Exception as e:  # noqa: BLE001 - any PIL error counts as a failure to decode
            ok, err = False, e
        if name.startswith(("bad_gif", "bad_bmp")):  # PIL reads them; we refuse them by design
            lines.append(f"{name} UNSUPPORTED")
            continue
        if bad and not ok:
            lines.append(f"{name} FAIL")
            continue
        if bad:  # damaged, but PIL still reads it: the decoder must give the same pixels
            print(f"note: PIL decodes {name}")
        if not ok:
            raise SystemExit(f"{name}: PIL failed: {err}")
        with open(path + ".rgb", "wb") as f:
            f.write(arr.tobytes())
        lines.append(f"{name} {arr.shape[1]} {arr.shape[0]} {crc(arr.tobytes())}")
    with open(os.path.join(OUT, "decode_cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    # One data URI, as the server receives images.
    import base64
    with open(os.path.join(d, "png_pil_rgb.png"), "rb") as f:
        uri = "data:image/png;base64," + base64.encodebytes(f.read()).decode()
    with open(os.path.join(d, "png_pil_rgb.uri"), "w") as f:
        f.write(uri)


# ---------------------------------------------------------------- resize cases
RESIZE_SOURCES = [(1, 1), (1, 7), (7, 1), (2, 3), (5, 4), (13, 11), (37, 29), (64, 48), (100, 75), (255, 3),
                  (3, 255), (200, 150), (2, 500)]
STORE_LIMIT = 64 * 64  # outputs with more pixels are kept as checksums


def resize_targets(w, h):
    t = {(w, h), (w + 1, h), (w, h + 1), (2 * w, 2 * h), (3 * w + 1, 2 * h + 3), (max(1, w // 2), max(1, h // 2)),
         (max(1, w // 3), max(1, (2 * h) // 5)), (max(1, w - 1), h + 5), (1, 1), (48, 48), (96, 48), (17, 31),
         (max(1, (w * 7) // 10), max(1, (h * 13) // 10))}
    if w * h >= 10000:
        t |= {(432, 336), (336, 432), (768, 768)}
    if (w, h) == (2, 500):
        t |= {(48, 13440), (48, 2304), (1, 500)}
    if (w, h) == (255, 3):
        t |= {(4032, 48), (255, 1)}
    return sorted(t)


def source_image(w, h):
    return picture(w, h, seed=w * 1000 + h)


def write_resize_sources():
    d = os.path.join(OUT, "resize")
    os.makedirs(d, exist_ok=True)
    for w, h in RESIZE_SOURCES:
        Image.fromarray(source_image(w, h), "RGB").save(os.path.join(d, f"src_{w}x{h}.png"))


def write_resize(kind):
    if kind in ("pil", "pil12"):
        def resize(arr, w, h):
            return np.asarray(Image.fromarray(arr, "RGB").resize((w, h), Image.Resampling.BICUBIC))
    else:
        import torch
        from torchvision.transforms.v2 import functional as tvF

        def resize(arr, w, h):
            t = torch.from_numpy(arr).permute(2, 0, 1).contiguous()
            out = tvF.resize(t, [h, w], interpolation=tvF.InterpolationMode.BICUBIC, antialias=True)
            assert out.dtype == torch.uint8
            return out.permute(1, 2, 0).contiguous().numpy()
    blob = bytearray()
    lines = [f"# {kind}: source.png out_width out_height offset(-1: checksum only) crc32"]
    for w, h in RESIZE_SOURCES:
        src = np.asarray(Image.open(os.path.join(OUT, "resize", f"src_{w}x{h}.png")).convert("RGB"))
        for tw, th in resize_targets(w, h):
            try:
                out = np.ascontiguousarray(resize(src, tw, th), dtype=np.uint8)
            except Exception as e:  # noqa: BLE001 - torch asserts on some 1x1 outputs
                lines.append(f"# ERROR src_{w}x{h}.png {tw} {th} {str(e)[:60]}")
                continue
            assert out.shape == (th, tw, 3)
            data = out.tobytes()
            off = -1
            if tw * th <= STORE_LIMIT:
                off = len(blob)
                blob += data
            lines.append(f"src_{w}x{h}.png {tw} {th} {off} {crc(data)}")
    with open(os.path.join(OUT, f"resize_{kind}.bin"), "wb") as f:
        f.write(bytes(blob))
    with open(os.path.join(OUT, f"resize_{kind}.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    if kind != "pil":
        import PIL
        import torch
        with open(os.path.join(OUT, f"resize_{kind}.txt"), "a") as f:
            f.write(f"# torch {torch.__version__} pillow {PIL.__version__} "
                    f"cpu {torch.backends.cpu.get_cpu_capability()}\n")


# ---------------------------------------------------------------- sizes and tokens
def write_target_sizes():
    from transformers.models.gemma4.image_processing_pil_gemma4 import get_aspect_ratio_preserving_size

    sides = [1, 2, 3, 5, 7, 10, 16, 31, 47, 48, 49, 63, 64, 95, 96, 97, 100, 127, 200, 224, 299, 336, 447, 448,
             449, 480, 512, 640, 720, 768, 799, 896, 1000, 1023, 1080, 1280, 1920, 2000, 2048, 3000, 4000, 4096,
             6000, 10000, 16383, 65535]
    pairs = [(h, w) for h in sides for w in sides]
    rs = np.random.RandomState(7)
    pairs += [(int(a), int(b)) for a, b in rs.randint(1, 5000, size=(400, 2))]
    pairs += [(1, 2000), (2000, 1), (1, 100000), (100000, 1), (3, 7000), (7000, 3), (47, 48), (48, 47)]
    lines = ["# height width max_soft_tokens target_height target_width   (0 0: transformers raises)"]
    n_err = 0
    for budget in (1, 2, 3, 70, 140, 280, 560, 1120):
        for h, w in pairs:
            try:
                th, tw = get_aspect_ratio_preserving_size(h, w, 16, budget * 9, 3)
            except ValueError:
                th = tw = 0
                n_err += 1
            lines.append(f"{h} {w} {budget} {th} {tw}")
    with open(os.path.join(OUT, "target_sizes.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("target sizes:", len(lines) - 1, "cases,", n_err, "errors")


def write_preprocess():
    """Gemma4ImageProcessorPil on decoded test images (load_image + processor)."""
    from transformers.image_utils import load_image
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    names = ["decode/png_pil_rgb.png", "decode/jpeg_420_odd.jpg", "decode/orient6_exif.jpg",
             "resize/src_200x150.png", "resize/src_2x500.png", "resize/src_255x3.png", "resize/src_1x1.png"]
    lines = ["# image max_soft_tokens n_soft_tokens n_valid_rows crc32(pixel_values f32) crc32(position_ids i32)"]
    for budget in (70, 140, 280, 560, 1120):
        ip = Gemma4ImageProcessorPil(max_soft_tokens=budget)
        for name in names:
            img = load_image(os.path.join(OUT, name))
            out = ip(images=[img], return_tensors="np")
            pv = np.ascontiguousarray(out["pixel_values"][0], dtype=np.float32)
            pos = np.ascontiguousarray(out["image_position_ids"][0]).astype(np.int32)
            n = int(out["num_soft_tokens_per_image"][0])
            valid = int((pos[:, 0] >= 0).sum())
            lines.append(f"{name} {budget} {n} {valid} {crc(pv.tobytes())} {crc(pos.tobytes())}")
    with open(os.path.join(OUT, "preprocess_pil.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    os.makedirs(OUT, exist_ok=True)
    if "--torch" in sys.argv:
        write_resize("torchvision")
        import PIL
        if int(PIL.__version__.split(".")[0]) < 13:
            write_resize("pil12")
        return
    write_decode()
    write_resize_sources()
    write_resize("pil")
    write_target_sizes()
    write_preprocess()


if __name__ == "__main__":
    main()
