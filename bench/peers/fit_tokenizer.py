#!/usr/bin/env python3
"""Copies the Gemma tokenizer files into a checkpoint folder, without the
added tokens whose ids lie past the model's vocabulary (the Gemma 3 files add
<image_soft_token> at 262144, also through tokenizer_config's image_token;
Gemma 4's embedding has 262144 rows, and llama.cpp checks that the two agree).

    fit_tokenizer.py TOKENIZER_DIR CHECKPOINT_DIR"""
import json
import os
import sys

src, dst = sys.argv[1], sys.argv[2]
config = json.load(open(os.path.join(dst, "config.json")))
vocab = config.get("text_config", config)["vocab_size"]
tok = json.load(open(os.path.join(src, "tokenizer.json")))
tok["added_tokens"] = [a for a in tok["added_tokens"] if a["id"] < vocab]
tok["model"]["vocab"] = {k: i for k, i in tok["model"]["vocab"].items() if i < vocab}
json.dump(tok, open(os.path.join(dst, "tokenizer.json"), "w"), ensure_ascii=False)
cfg = json.load(open(os.path.join(src, "tokenizer_config.json")))
cfg["added_tokens_decoder"] = {k: v for k, v in cfg.get("added_tokens_decoder", {}).items() if int(k) < vocab}
# special tokens named by string (image_token, extra_special_tokens) that the
# vocabulary lacks: transformers would append them as new ids
known = set(tok["model"]["vocab"]) | {a["content"] for a in tok["added_tokens"]}
for key in [k for k, v in cfg.items() if isinstance(v, str) and k.endswith("_token") and v not in known]:
    del cfg[key]
extra = cfg.get("extra_special_tokens", {})
cfg["extra_special_tokens"] = {k: v for k, v in extra.items() if v in known}
json.dump(cfg, open(os.path.join(dst, "tokenizer_config.json"), "w"), ensure_ascii=False)
