#include "runtime/prompt.h"

#include <stdlib.h>
#include <string.h>

#include "media/audio_features.h"
#include "media/audio_resample.h"
#include "media/image_patches.h"
#include "model/audio_tower.h"
#include "model/unified_embedders.h"
#include "model/vision_tower.h"

/* One encoded media item: its soft tokens in backend memory. */
typedef struct {
    g4_media_kind kind;
    float *soft;
    int n_soft;
} encoded_media;

/* The budget whose token count for an h x w image is `tokens`, or 0. */
static int budget_giving(int h, int w, int tokens) {
    static const int budgets[] = {70, 140, 280, 560, 1120};
    for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; i++) {
        int count;
        if (g4_image_soft_token_count(h, w, budgets[i], &count) == G4_OK && count == tokens) return budgets[i];
    }
    return 0;
}

/* want_tokens > 0: the prompt already holds that many placeholders for this
 * image (pre-expanded ids); without an explicit budget, pick the one that
 * gives it. */
static g4_status encode_image(g4_context *c, const g4_media_input *in, int want_tokens, encoded_media *out) {
    const g4_model *m = c->model;
    if (!m->vision && !m->unified)
        return g4_fail(G4_ERR_UNSUPPORTED, "%s: this model has no vision tower", in->label ? in->label : "image");
    g4_image img = {0};
    g4_status st = g4_image_decode_memory(in->data, in->size, NULL, &img);
    if (st != G4_OK) return g4_fail_context(st, "%s", in->label ? in->label : "image");
    int budget = in->max_soft_tokens > 0 ? in->max_soft_tokens : c->image_tokens;
    if (in->max_soft_tokens <= 0 && want_tokens > 0) {
        int inferred = budget_giving(img.height, img.width, want_tokens);
        if (inferred) budget = inferred;
    }
    if (!g4_image_soft_tokens_supported(budget)) {
        g4_image_free(&img);
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "image token budget %d is not one of 70, 140, 280, 560, 1120", budget);
    }
    g4_image_patches p = {0};
    if (m->unified) {
        /* the 12B's processor exists only with the torchvision backend */
        st = g4_image_preprocess_unified(&img, budget, G4_IMAGE_BACKEND_TORCHVISION, &p);
        if (st == G4_OK)
            st = g4_unified_vision_encode(m, p.pixel_values, p.positions, p.rows, NULL, NULL, &out->soft, &out->n_soft);
    } else {
        st = g4_image_preprocess_gemma4(&img, budget, c->image_backend, &p);
        if (st == G4_OK) st = g4_vision_encode(m, p.pixel_values, p.positions, p.rows, &out->soft, &out->n_soft);
    }
    g4_image_free(&img);
    if (st == G4_OK && out->n_soft != p.n_soft_tokens)
        st = g4_fail(G4_ERR_INTERNAL, "vision tower gave %d soft tokens for an image of %d", out->n_soft,
                     p.n_soft_tokens);
    g4_image_patches_free(&p);
    if (st != G4_OK) return g4_fail_context(st, "%s", in->label ? in->label : "image");
    out->kind = G4_MEDIA_IMAGE;
    return G4_OK;
}

/* gemma4_unified: one soft token per 640 raw samples. */
static g4_status encode_unified_audio(g4_context *c, const g4_media_input *in, encoded_media *out, int *truncated) {
    g4_audio a = {0};
    float *frames = NULL;
    int n_frames = 0;
    g4_status st = g4_audio_load_memory(in->data, in->size, in->label ? in->label : "audio", &a);
    if (st == G4_OK) {
        if (a.truncated) *truncated = 1;
        st = g4_unified_audio_frames(a.samples, a.n_samples, &frames, &n_frames);
    }
    if (st == G4_OK) st = g4_unified_audio_encode(c->model, frames, n_frames, &out->soft);
    out->n_soft = st == G4_OK ? n_frames : 0;
    free(frames);
    g4_audio_free(&a);
    if (st != G4_OK) return g4_fail_context(st, "%s", in->label ? in->label : "audio");
    out->kind = G4_MEDIA_AUDIO;
    return G4_OK;
}

static g4_status encode_audio(g4_context *c, const g4_media_input *in, encoded_media *out, int *truncated) {
    const g4_model *m = c->model;
    if (m->unified) return encode_unified_audio(c, in, out, truncated);
    if (!m->audio)
        return g4_fail(G4_ERR_UNSUPPORTED, "%s: this model has no audio tower (only E2B and E4B hear)",
                       in->label ? in->label : "audio");
    g4_audio a = {0};
    g4_status st = g4_audio_load_memory(in->data, in->size, in->label ? in->label : "audio", &a);
    float *features = NULL;
    uint8_t *mask = NULL;
    int n_frames = 0;
    if (st == G4_OK) {
        if (a.truncated) *truncated = 1;
        st = g4_audio_log_mel(a.samples, a.n_samples, &features, &mask, &n_frames);
    }
    if (st == G4_OK && n_frames > 0) st = g4_audio_encode(m, features, mask, n_frames, &out->soft, &out->n_soft);
    if (st == G4_OK && out->n_soft == 0)
        st = g4_fail(G4_ERR_INVALID_ARGUMENT, "%s is too short to give any audio token", in->label ? in->label : "audio");
    free(features);
    free(mask);
    g4_audio_free(&a);
    if (st != G4_OK) return g4_fail_context(st, "%s", in->label ? in->label : "audio");
    out->kind = G4_MEDIA_AUDIO;
    return G4_OK;
}

static void release_encoded(g4_context *c, encoded_media *e, int n) {
    for (int i = 0; i < n; i++)
        if (e[i].soft) c->backend->ops->release(c->backend, e[i].soft);
}

/* Places every item's soft tokens at the rows of its placeholders, in
 * order; takes ownership of ids. */
static g4_status assemble(g4_context *c, int32_t *ids, size_t n_ids, encoded_media *enc, int n_enc, g4_prompt *out) {
    const g4_token_ids *tk = &c->model->config.tokens;
    g4_backend *be = c->backend;
    const int d = c->model->config.text.hidden_size;
    out->ids = ids; /* owned by the prompt from here on, also on failure */
    out->n_ids = (int)n_ids;
    int total = 0;
    for (int i = 0; i < n_enc; i++) total += enc[i].n_soft;
    int n_img_rows = 0, n_aud_rows = 0, want_img = 0, want_aud = 0;
    for (size_t r = 0; r < n_ids; r++) {
        n_img_rows += ids[r] == tk->image_id;
        n_aud_rows += ids[r] == tk->audio_id;
    }
    for (int i = 0; i < n_enc; i++) {
        if (enc[i].kind == G4_MEDIA_IMAGE) want_img += enc[i].n_soft;
        if (enc[i].kind == G4_MEDIA_AUDIO) want_aud += enc[i].n_soft;
    }
    if (n_img_rows != want_img || n_aud_rows != want_aud) {
        return g4_fail(G4_ERR_INVALID_ARGUMENT,
                       "the prompt has %d image and %d audio placeholder tokens but the media give %d and %d "
                       "(placeholder strings typed into the text?)",
                       n_img_rows, n_aud_rows, want_img, want_aud);
    }
    if (total == 0) return G4_OK;
    out->media.rows = malloc((size_t)total * sizeof *out->media.rows);
    out->media.embeds = be->ops->alloc(be, (size_t)total * d * sizeof(float));
    if (!out->media.rows || !out->media.embeds) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    /* walk the prompt; each placeholder takes the next soft token of the next item of its kind */
    int item[2] = {-1, -1}, used[2] = {0, 0}, k = 0;
    for (size_t r = 0; r < n_ids; r++) {
        int kind = ids[r] == tk->image_id ? 0 : ids[r] == tk->audio_id ? 1 : -1;
        if (kind < 0) continue;
        g4_media_kind want = kind == 0 ? G4_MEDIA_IMAGE : G4_MEDIA_AUDIO;
        if (item[kind] < 0 || used[kind] == enc[item[kind]].n_soft) {
            int next = item[kind] + 1;
            while (next < n_enc && enc[next].kind != want) next++;
            item[kind] = next;
            used[kind] = 0;
        }
        const encoded_media *e = &enc[item[kind]];
        be->ops->copy(be, out->media.embeds + (size_t)k * d, e->soft + (size_t)used[kind] * d, (size_t)d * sizeof(float));
        out->media.rows[k++] = (int32_t)r;
        used[kind]++;
    }
    out->media.n = k;
    return G4_OK;
}

static g4_status encode_all(g4_context *c, const g4_media_input *media, int n_media, const int *want_tokens,
                            encoded_media *enc, g4_media_item *items, g4_prompt *out) {
    g4_status st = G4_OK;
    for (int i = 0; st == G4_OK && i < n_media; i++) {
        if (media[i].kind == G4_MEDIA_IMAGE)
            st = encode_image(c, &media[i], want_tokens ? want_tokens[i] : 0, &enc[i]);
        else if (media[i].kind == G4_MEDIA_AUDIO)
            st = encode_audio(c, &media[i], &enc[i], &out->audio_truncated);
        else
            st = g4_fail(G4_ERR_UNSUPPORTED, "video input is not supported yet");
        if (items) {
            items[i].kind = media[i].kind;
            items[i].n_tokens = enc[i].n_soft;
        }
    }
    return st;
}

static g4_status build(g4_context *c, const char *text, size_t len, int flags, size_t max_ids,
                       const g4_media_input *media, int n_media, g4_prompt *out) {
    if (!c->tokenizer)
        return g4_fail(G4_ERR_UNSUPPORTED, "%s has no tokenizer.json: text prompts need one", c->dir);
    encoded_media *enc = calloc((size_t)(n_media > 0 ? n_media : 1), sizeof *enc);
    g4_media_item *items = calloc((size_t)(n_media > 0 ? n_media : 1), sizeof *items);
    g4_status st = (enc && items) ? encode_all(c, media, n_media, NULL, enc, items, out)
                                  : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    char *expanded = NULL;
    size_t expanded_len = 0;
    if (st == G4_OK) st = g4_chat_expand_media(text, len, items, (size_t)n_media, &expanded, &expanded_len);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (st == G4_OK) st = g4_tokenizer_encode_max(c->tokenizer, expanded, expanded_len, flags, max_ids, &ids, &n_ids);
    if (st == G4_OK) st = assemble(c, ids, n_ids, enc, n_media, out);
    if (st == G4_OK) {
        out->text = expanded;
        expanded = NULL;
    }
    free(expanded);
    release_encoded(c, enc, n_media);
    free(enc);
    free(items);
    if (st != G4_OK) g4_prompt_free(c, out);
    return st;
}

g4_status g4_prompt_from_messages(g4_context *c, const cJSON *messages, const cJSON *tools,
                                  const g4_prompt_options *opt, const g4_media_input *media, int n_media,
                                  g4_prompt *out) {
    memset(out, 0, sizeof *out);
    g4_prompt_options o = {0};
    if (opt) o = *opt;
    char *text = NULL;
    size_t len = 0;
    g4_status st = g4_chat_render(c->chat.variant, messages, tools, &o.chat, &text, &len);
    if (st != G4_OK) return st;
    out->starts_in_reasoning = g4_chat_prompt_opens_reasoning(text, len);
    int reasoning = out->starts_in_reasoning;
    int flags = o.escaped_spans ? G4_TOK_ESCAPED_SPANS : 0;
    st = build(c, text, len, flags, o.max_ids > 0 ? (size_t)o.max_ids : 0, media, n_media, out);
    out->starts_in_reasoning = reasoning;
    free(text);
    return st;
}

g4_status g4_prompt_from_text(g4_context *c, const char *text, size_t len, const g4_media_input *media, int n_media,
                              g4_prompt *out) {
    memset(out, 0, sizeof *out);
    return build(c, text, len, 0, 0, media, n_media, out);
}

g4_status g4_prompt_from_ids(g4_context *c, const int32_t *ids, int n_ids, const g4_media_input *media, int n_media,
                             g4_prompt *out) {
    memset(out, 0, sizeof *out);
    encoded_media *enc = calloc((size_t)(n_media > 0 ? n_media : 1), sizeof *enc);
    int32_t *copy = malloc((size_t)(n_ids > 0 ? n_ids : 1) * sizeof *copy);
    int *want = calloc((size_t)(n_media > 0 ? n_media : 1), sizeof *want);
    /* the i-th run of image placeholders belongs to the i-th image */
    const int32_t image_id = c->model->config.tokens.image_id;
    for (int r = 0, img = 0; want && r < n_ids; r++) {
        if (ids[r] != image_id || (r > 0 && ids[r - 1] == image_id)) continue;
        while (img < n_media && media[img].kind != G4_MEDIA_IMAGE) img++;
        if (img == n_media) break;
        int e = r;
        while (e < n_ids && ids[e] == image_id) e++;
        want[img++] = e - r;
    }
    g4_status st = (enc && copy && want) ? encode_all(c, media, n_media, want, enc, NULL, out)
                                         : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    free(want);
    if (st == G4_OK) {
        memcpy(copy, ids, (size_t)n_ids * sizeof *copy);
        st = assemble(c, copy, (size_t)n_ids, enc, n_media, out);
        copy = NULL;
    }
    free(copy);
    release_encoded(c, enc, n_media);
    free(enc);
    if (st != G4_OK) g4_prompt_free(c, out);
    return st;
}

void g4_prompt_free(g4_context *c, g4_prompt *p) {
    free(p->ids);
    free(p->text);
    free(p->media.rows);
    if (p->media.embeds) c->backend->ops->release(c->backend, p->media.embeds);
    memset(p, 0, sizeof *p);
}
