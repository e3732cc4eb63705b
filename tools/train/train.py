#!/usr/bin/env python3
"""Trains the bundled Gemma 4 (models/tiny) and its MTP assistant
(models/tiny-assistant) with transformers' own model classes, so the
checkpoints are the reference architecture by construction.

The target has the E2B feature set at a small size: per-layer embeddings,
the last two layers KV-shared (double-wide MLP there), sliding layers with
default RoPE and full layers with proportional RoPE and wider heads, the
final softcap, and (untrained, random) vision and audio towers so the
multimodal paths stay exercised. The assistant is a `gemma4_assistant`
drafter with the centroid LM head of the E2B/E4B drafters, trained on the
target's final-normed hidden states and shared K/V
(../../../shared/SPEC-gemma4-unified-assistant.md, Part B).

Run on the GPU machine (never needed to build or test):
    python3 tools/train/train.py --data .train --out OUT
with .train/ made by get_corpus.sh and models/tiny/tokenizer.json by
make_tokenizer.py. Writes OUT/tiny/ and OUT/tiny-assistant/ (bf16
safetensors, config.json, generation_config.json) and OUT/train_log.json.
"""
import argparse
import copy
import json
import math
import os
import random
import time

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from transformers import Gemma4Config, Gemma4ForConditionalGeneration
from transformers.models.gemma4_assistant.configuration_gemma4_assistant import Gemma4AssistantConfig
from transformers.models.gemma4_assistant.modeling_gemma4_assistant import Gemma4AssistantForCausalLM

VOCAB = 4096
SEQ = 512            # training window, <bos> included
WINDOW = 128         # sliding window of the sliding layers
SPECIAL = dict(image_token_id=1000, boi_token_id=1001, eoi_token_id=1002, audio_token_id=1003,
               boa_token_id=1004, eoa_token_index=1005, video_token_id=1006)
ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}
S, FULL = "sliding_attention", "full_attention"

TEXT = dict(vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, hidden_size=192, intermediate_size=384,
            num_hidden_layers=6, layer_types=[S, S, FULL, S, S, FULL], num_attention_heads=3,
            num_key_value_heads=1, head_dim=64, global_head_dim=128, sliding_window=WINDOW,
            max_position_embeddings=8192, rope_parameters=ROPE, hidden_size_per_layer_input=32,
            num_kv_shared_layers=2, use_double_wide_mlp=True, final_logit_softcapping=30.0,
            hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, attention_k_eq_v=False,
            pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True)
VISION = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=2, head_dim=32, patch_size=16, pooling_kernel_size=3,
              position_embedding_size=128, use_clipped_linears=True, standardize=False)
AUDIO = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, subsampling_conv_channels=[128, 8],
             conv_kernel_size=5, output_proj_dims=64, attention_chunk_size=12, attention_context_left=13,
             attention_context_right=0)
# The drafter: 4 query-only layers S S S F reading the target's K/V (same head sizes and KV heads).
ASSISTANT_TEXT = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                      layer_types=[S, S, S, FULL], num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                      global_head_dim=128, sliding_window=WINDOW, max_position_embeddings=8192,
                      rope_parameters=ROPE, final_logit_softcapping=None, num_kv_shared_layers=4,
                      use_double_wide_mlp=False, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
                      enable_moe_block=False, hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                      pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True)
CENTROIDS, CENTROID_TOP_K, DRAFTS = 64, 8, 3
BOS, TURN, END_TURN = 2, 105, 106
DEVICE_TYPE = ["cuda"]  # autocast device type, set from --device


def log(msg):
    print(time.strftime("%H:%M:%S"), msg, flush=True)


# ---------------------------------------------------------------- data
def chapters(path):
    return [c for c in open(path, encoding="utf-8").read().split("\n\n") if c.strip()]


def chat_sample(tok, verses, rng):
    """One user turn (a verse) and the model's reply (the verses after it), as the chat template renders them."""
    i = rng.randrange(len(verses) - 1)
    n = rng.randint(1, 3)
    user, reply = verses[i], " ".join(verses[i + 1:i + 1 + n])
    text = f"<|turn>user\n{user}<turn|>\n<|turn>model\n{reply}<turn|>\n"
    return tok.encode(text, add_special_tokens=False).ids


def token_stream(tok, texts, rng, chat_share):
    """Chapters (each after <bos>) and chat turns made from their verses, shuffled into one id stream."""
    docs = []
    for ch in texts:
        docs.append([BOS] + tok.encode(ch + "\n", add_special_tokens=False).ids)
        verses = ch.split("\n")[1:]
        if len(verses) > 2:
            for _ in range(max(1, int(len(verses) * chat_share))):
                docs.append([BOS] + chat_sample(tok, verses, rng))
    rng.shuffle(docs)
    return torch.tensor([t for d in docs for t in d], dtype=torch.long)


def batch(stream, n, gen, device):
    """n windows of SEQ tokens: <bos> then SEQ-1 ids from a random offset (as `gemma4 perplexity` reads text)."""
    starts = torch.randint(0, len(stream) - SEQ, (n,), generator=gen)
    rows = torch.stack([stream[s:s + SEQ - 1] for s in starts.tolist()])
    bos = torch.full((n, 1), BOS, dtype=torch.long)
    return torch.cat([bos, rows], 1).to(device)


def heldout_windows(tok, path, device):
    ids = tok.encode(open(path, encoding="utf-8").read(), add_special_tokens=False).ids
    n = (len(ids) // (SEQ - 1))
    rows = torch.tensor(ids[:n * (SEQ - 1)]).view(n, SEQ - 1)
    return torch.cat([torch.full((n, 1), BOS, dtype=torch.long), rows], 1).to(device)


# ---------------------------------------------------------------- target
def target_config(attn):
    cfg = Gemma4Config(text_config=copy.deepcopy(TEXT), vision_config=dict(VISION), audio_config=dict(AUDIO),
                       **SPECIAL)
    cfg._attn_implementation = attn
    cfg.text_config._attn_implementation = attn
    return cfg


def lm_loss(model, x):
    logits = model(input_ids=x, use_cache=False).logits.float()
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), x[:, 1:].reshape(-1))


@torch.no_grad()
def eval_loss(model, windows, chunk=16):
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, len(windows), chunk):
        x = windows[i:i + chunk]
        with torch.autocast(DEVICE_TYPE[0], dtype=torch.bfloat16):
            tot += lm_loss(model, x).item() * len(x)
        n += len(x)
    model.train()
    return tot / n


def cosine_lr(step, steps, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def train_target(args, tok, device, record):
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    stream = token_stream(tok, chapters(os.path.join(args.data, "train.txt")), rng, args.chat_share)
    held = heldout_windows(tok, os.path.join(args.data, "heldout.txt"), device)
    log(f"train stream {len(stream)} tokens, held-out {held.numel()} tokens")
    model = Gemma4ForConditionalGeneration(target_config("sdpa")).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    n_text = sum(p.numel() for n, p in model.named_parameters() if "language_model" in n)
    log(f"target: {n_params} parameters ({n_text} in the text decoder)")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=True)
    best, best_state, curve = float("inf"), None, []
    t0 = time.time()
    steps = args.steps
    for step in range(args.steps):
        if step == 20:  # fit the schedule into the time budget, measured on the first steps
            torch.cuda.synchronize() if DEVICE_TYPE[0] == "cuda" else None
            steps = min(args.steps, int(args.budget_s / ((time.time() - t0) / 20)))
            log(f"{(time.time() - t0) / 20 * 1000:.1f} ms a step: {steps} steps")
        if step >= steps:
            break
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, steps, args.lr, 40)
        x = batch(stream, args.batch, gen, device)
        with torch.autocast(DEVICE_TYPE[0], dtype=torch.bfloat16):
            loss = lm_loss(model, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % args.eval_every == 0 or step + 1 == steps:
            v = eval_loss(model, held)
            curve.append({"step": step + 1, "train_loss": loss.item(), "heldout_loss": v,
                          "heldout_ppl": math.exp(v), "s": round(time.time() - t0, 1)})
            log(f"step {step + 1}: train {loss.item():.3f} held-out {v:.3f} (ppl {math.exp(v):.2f})")
            if v < best:
                best, best_state = v, {k: t.detach().clone() for k, t in model.state_dict().items()}
    model.load_state_dict(best_state)
    record["target"] = {"parameters": n_params, "text_parameters": n_text, "steps": steps,
                        "batch": args.batch, "seq": SEQ, "lr": args.lr, "curve": curve,
                        "best_heldout_loss": best, "train_tokens": len(stream), "train_s": time.time() - t0}
    return model.eval()


def save(model, out, generation):
    model.to(torch.bfloat16).save_pretrained(out)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(generation, f, indent=2)
    model.float()


# ---------------------------------------------------------------- assistant
def balanced_clusters(emb, k, iters=10):
    """Token ids ordered by cluster (k equal clusters of V/k tokens, by cosine k-means on the target embeddings):
    the assistant's `token_ordering`."""
    v = F.normalize(emb.float(), dim=-1)
    size = v.shape[0] // k
    gen = torch.Generator(device="cpu").manual_seed(0)
    cent = v[torch.randperm(v.shape[0], generator=gen)[:k].to(v.device)]
    for _ in range(iters):
        sim = v @ cent.T                                   # [V, k]
        order = sim.max(1).values.argsort(descending=True)
        assign = torch.full((v.shape[0],), -1, dtype=torch.long, device=v.device)
        room = torch.full((k,), size, dtype=torch.long, device=v.device)
        ranked = sim.argsort(1, descending=True)
        for t in order.tolist():                           # greedy: best free cluster for each token
            for c in ranked[t].tolist():
                if room[c] > 0:
                    assign[t] = c
                    room[c] -= 1
                    break
        cent = F.normalize(torch.stack([v[assign == c].mean(0) for c in range(k)]), dim=-1)
    return torch.cat([(assign == c).nonzero().flatten() for c in range(k)])


def draft_masks(lq, lk, device):
    """Additive masks of the drafter's training queries: query i is position p = i + 1; it sees the target's
    keys 0..p-1 on full layers and the last WINDOW + 1 of them on sliding layers (the transformers semantics)."""
    q = torch.arange(lq, device=device)[:, None]
    k = torch.arange(lk, device=device)[None, :]
    full = k <= q
    sliding = full & (k >= q - WINDOW)
    neg = torch.finfo(torch.float32).min
    as_add = lambda m: torch.zeros(m.shape, device=device).masked_fill(~m, neg)[None, None]  # noqa: E731
    return {FULL: as_add(full), S: as_add(sliding)}


def target_features(target, x):
    lm = target.model.language_model
    o = lm(input_ids=x, use_cache=False, return_shared_kv_states=True)
    emb = lm.embed_tokens(x)                               # scaled by sqrt(d), the drafter's input embedding
    skv = {k: (v[0].float(), v[1].float()) for k, v in o.shared_kv_states.items()}
    return emb.float(), o.last_hidden_state.float(), skv


def drafter_steps(asst, emb, hidden, skv, masks, steps):
    """Unrolled drafting with teacher forcing: step k at query i (position p = i + 1) feeds the embedding of
    token p + k - 1 (step 1: the accepted token at p) and the previous step's projected state (step 1: the
    target's hidden at p - 1); it predicts token p + k."""
    lq = hidden.shape[1] - 1 - steps
    pos = torch.arange(1, lq + 1, device=emb.device)[None].expand(emb.shape[0], -1)
    h = hidden[:, :lq]
    outs = []
    for k in range(1, steps + 1):
        x = asst.pre_projection(torch.cat([emb[:, k:k + lq], h], -1))
        m = {key: val[:, :, :lq] for key, val in masks.items()}
        ha = asst.model(inputs_embeds=x, attention_mask=m, position_ids=pos, shared_kv_states=skv,
                        use_cache=False).last_hidden_state
        outs.append(ha)
        h = asst.post_projection(ha)
    return outs, lq


def assistant_loss(asst, outs, x, lq, cluster_of):
    e = asst.lm_head.weight if asst.lm_head is not None else asst.model.embed_tokens.weight
    total, accs = 0.0, []
    for k, ha in enumerate(outs, start=1):
        target = x[:, 1 + k:1 + k + lq]
        logits = ha @ e.T
        total = total + F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))
        c = asst.masked_embedding.centroids(ha)
        total = total + 0.5 * F.cross_entropy(c.reshape(-1, CENTROIDS), cluster_of[target].reshape(-1))
        accs.append((logits.argmax(-1) == target).float().mean().item())
    return total, accs


def train_assistant(args, tok, target, device, record):
    torch.manual_seed(1)
    rng = random.Random(1)
    gen = torch.Generator().manual_seed(1)
    stream = token_stream(tok, chapters(os.path.join(args.data, "train.txt")), rng, args.chat_share)
    for p in target.parameters():
        p.requires_grad_(False)
    cfg = Gemma4AssistantConfig(text_config=copy.deepcopy(ASSISTANT_TEXT), backbone_hidden_size=TEXT["hidden_size"],
                                use_ordered_embeddings=True, num_centroids=CENTROIDS,
                                centroid_intermediate_top_k=CENTROID_TOP_K, tie_word_embeddings=True)
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    asst = Gemma4AssistantForCausalLM(cfg).to(device)
    ordering = balanced_clusters(target.model.language_model.embed_tokens.weight.detach(), CENTROIDS).to(device)
    with torch.no_grad():
        asst.masked_embedding.token_ordering.copy_(ordering)
    cluster_of = torch.empty(VOCAB, dtype=torch.long, device=device)
    cluster_of[ordering] = torch.arange(VOCAB, device=device) // (VOCAB // CENTROIDS)
    n_params = sum(p.numel() for p in asst.parameters())
    log(f"assistant: {n_params} parameters")
    opt = torch.optim.AdamW(asst.parameters(), lr=args.asst_lr, betas=(0.9, 0.95), weight_decay=0.05)
    masks = draft_masks(SEQ - 1 - DRAFTS, SEQ, device)
    t0, curve = time.time(), []
    steps = args.asst_steps
    for step in range(args.asst_steps):
        if step == 20:
            torch.cuda.synchronize() if DEVICE_TYPE[0] == "cuda" else None
            steps = min(args.asst_steps, int(args.asst_budget_s / ((time.time() - t0) / 20)))
            log(f"assistant: {(time.time() - t0) / 20 * 1000:.1f} ms a step: {steps} steps")
        if step >= steps:
            break
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, steps, args.asst_lr, 50)
        x = batch(stream, args.asst_batch, gen, device)
        with torch.no_grad():
            emb, hidden, skv = target_features(target, x)
        outs, lq = drafter_steps(asst, emb, hidden, skv, masks, DRAFTS)
        loss, accs = assistant_loss(asst, outs, x, lq, cluster_of)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(asst.parameters(), 1.0)
        opt.step()
        if (step + 1) % 100 == 0 or step + 1 == steps:
            curve.append({"step": step + 1, "loss": loss.item(), "teacher_forced_top1": accs,
                          "s": round(time.time() - t0, 1)})
            log(f"assistant step {step + 1}: loss {loss.item():.3f} top-1 per step {[round(a, 3) for a in accs]}")
    record["assistant"] = {"parameters": n_params, "steps": steps, "batch": args.asst_batch,
                           "curve": curve, "train_s": time.time() - t0}
    asst.generation_config.num_assistant_tokens = DRAFTS
    asst.generation_config.num_assistant_tokens_schedule = "constant"
    return asst.eval()


@torch.no_grad()
def speculative_acceptance(target, asst, tok, data, device, n_prompts=6, new_tokens=48):
    """The clean algorithm of the spec (B5) with transformers' own drafter forward and full target recomputes:
    greedy, DRAFTS drafts a round. Returns accepted drafts per round and per-position acceptance."""
    text = open(os.path.join(data, "heldout.txt"), encoding="utf-8").read().split("\n\n")
    lm = target.model.language_model
    rounds, accepted, per_pos = 0, 0, [0] * DRAFTS
    reached = [0] * DRAFTS
    for i in range(n_prompts):
        ids = [BOS] + tok.encode(text[i][:200], add_special_tokens=False).ids
        x = torch.tensor([ids], device=device)
        o = lm(input_ids=x, use_cache=False, return_shared_kv_states=True)
        t = int(target.lm_head(o.last_hidden_state[0, -1]).argmax())
        out = list(ids)
        while len(out) - len(ids) < new_tokens:
            p = len(out)
            h = o.last_hidden_state[:, p - 1:p]
            skv = {k: (v[0][:, :, :p], v[1][:, :, :p]) for k, v in o.shared_kv_states.items()}
            tokn, drafts = t, []
            for _ in range(DRAFTS):
                e = lm.embed_tokens(torch.tensor([[tokn]], device=device))
                d = asst(inputs_embeds=torch.cat([e, h], -1), position_ids=torch.tensor([[p]], device=device),
                         shared_kv_states=skv, use_cache=False)
                tokn = int(d.logits[0, -1].argmax())
                drafts.append(tokn)
                h = d.last_hidden_state
            seq = torch.tensor([out + [t] + drafts], device=device)
            o = lm(input_ids=seq, use_cache=False, return_shared_kv_states=True)
            pred = target.lm_head(o.last_hidden_state[0, p:p + DRAFTS + 1]).argmax(-1).tolist()
            n = 0
            while n < DRAFTS and drafts[n] == pred[n]:
                n += 1
            for k in range(DRAFTS):
                if k <= n and k < DRAFTS:
                    reached[k] += 1
                    per_pos[k] += int(k < n)
            out += [t] + drafts[:n]
            t = pred[n]
            rounds += 1
            accepted += n
            o = lm(input_ids=torch.tensor([out], device=device), use_cache=False, return_shared_kv_states=True)
    return {"rounds": rounds, "mean_accepted_drafts": accepted / rounds,
            "tokens_per_target_pass": (accepted + rounds) / rounds,
            "per_position_acceptance": [per_pos[k] / max(1, reached[k]) for k in range(DRAFTS)]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=".train")
    ap.add_argument("--tokenizer", default="models/tiny/tokenizer.json")
    ap.add_argument("--out", default="out")
    ap.add_argument("--steps", type=int, default=450)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--chat-share", type=float, default=0.1)
    ap.add_argument("--asst-steps", type=int, default=800)
    ap.add_argument("--asst-batch", type=int, default=32)
    ap.add_argument("--asst-lr", type=float, default=2e-3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget-s", type=float, default=240, help="training time of the target")
    ap.add_argument("--asst-budget-s", type=float, default=120, help="training time of the assistant")
    args = ap.parse_args()
    device = args.device
    DEVICE_TYPE[0] = device.split(":")[0]
    torch.backends.cuda.matmul.allow_tf32 = True
    tok = Tokenizer.from_file(args.tokenizer)
    record = {"args": vars(args)}
    target = train_target(args, tok, device, record)
    gen_cfg = {"bos_token_id": 2, "do_sample": True, "eos_token_id": [1, 106], "pad_token_id": 0,
               "temperature": 0.8, "top_k": 40, "top_p": 0.95}
    save(target, os.path.join(args.out, "tiny"), gen_cfg)
    asst = train_assistant(args, tok, target, device, record)
    record["speculative"] = speculative_acceptance(target, asst, tok, args.data, device)
    log(f"speculative: {record['speculative']}")
    save(asst, os.path.join(args.out, "tiny-assistant"),
         {"num_assistant_tokens": DRAFTS, "num_assistant_tokens_schedule": "constant"})
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
