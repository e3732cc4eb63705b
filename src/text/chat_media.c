/* Placeholder expansion as Gemma4Processor does it (transformers
 * processing_gemma4.py replace_image_token / replace_audio_token /
 * replace_video_token, applied by ProcessorMixin.get_text_with_replacements:
 * a left-to-right scan where the i-th placeholder of a kind takes the i-th
 * replacement of that kind). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "text/chat.h"
#include "text/chat_strbuf.h"

static const char *const placeholder[3] = {"<|image|>", "<|audio|>", "<|video|>"};
static const char *const kind_name[3] = {"image", "audio", "video"};

static void repeat(chat_strbuf *b, const char *s, int n) {
    size_t len = strlen(s);
    if (n > 0 && !chat_strbuf_reserve(b, len * (size_t)n)) return;
    for (int i = 0; i < n; i++) chat_strbuf_append(b, s, len);
}

static g4_status expand_one(chat_strbuf *b, const g4_media_item *it) {
    if (it->n_tokens < 0) return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: negative token count for a %s",
                                         kind_name[it->kind]);
    switch (it->kind) {
    case G4_MEDIA_IMAGE:
        chat_strbuf_puts(b, "<|image>");
        repeat(b, "<|image|>", it->n_tokens);
        chat_strbuf_puts(b, "<image|>");
        break;
    case G4_MEDIA_AUDIO:
        chat_strbuf_puts(b, "<|audio>");
        repeat(b, "<|audio|>", it->n_tokens);
        chat_strbuf_puts(b, "<audio|>");
        break;
    case G4_MEDIA_VIDEO:
        if (it->n_frames < 0 || (it->n_frames > 0 && !it->frame_seconds))
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: a video needs one timestamp per frame");
        for (int f = 0; f < it->n_frames; f++) {
            double s = it->frame_seconds[f];
            if (!(s >= 0) || s > 1e9)
                return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: video frame %d has an invalid timestamp %g", f, s);
            /* f"{int(seconds // 60):02d}:{int(seconds % 60):02d}" */
            char stamp[48];
            snprintf(stamp, sizeof stamp, "%s%02lld:%02d ", f ? " " : "", (long long)floor(s / 60.0),
                     (int)fmod(s, 60.0));
            chat_strbuf_puts(b, stamp);
            chat_strbuf_puts(b, "<|image>");
            repeat(b, "<|video|>", it->n_tokens);
            chat_strbuf_puts(b, "<image|>");
        }
        break;
    default:
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: unknown media kind %d", (int)it->kind);
    }
    return G4_OK;
}

g4_status g4_chat_expand_media(const char *text, size_t len, const g4_media_item *items, size_t n_items,
                               char **out, size_t *out_len) {
    size_t have[3] = {0}, used[3] = {0};
    for (size_t i = 0; i < n_items; i++) {
        if ((unsigned)items[i].kind > G4_MEDIA_VIDEO)
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: media item %zu has an unknown kind", i);
        have[items[i].kind]++;
    }
    chat_strbuf b = {0};
    size_t pos = 0, copied = 0;
    g4_status st = G4_OK;
    while (pos < len) {
        int kind = -1;
        /* an escaped span (G4_TOK_ESCAPED_SPANS): typed text, never a placeholder */
        if (pos + 3 <= len && !memcmp(text + pos, "\xEF\xB7\x90", 3)) {
            const char *close = NULL;
            for (size_t k = pos + 3; k + 3 <= len && !close; k++)
                if (!memcmp(text + k, "\xEF\xB7\x91", 3)) close = text + k;
            pos = close ? (size_t)(close - text) + 3 : len;
            continue;
        }
        if (text[pos] == '<')
            for (int k = 0; k < 3; k++) {
                size_t n = strlen(placeholder[k]);
                if (pos + n <= len && memcmp(text + pos, placeholder[k], n) == 0) kind = k;
            }
        if (kind < 0) {
            pos++;
            continue;
        }
        chat_strbuf_append(&b, text + copied, pos - copied);
        if (used[kind] == have[kind]) {
            st = g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: the prompt has more %s placeholders than the %zu %s(s) given",
                         placeholder[kind], have[kind], kind_name[kind]);
            break;
        }
        /* the used[kind]-th item of this kind */
        size_t seen = 0, idx = 0;
        for (; idx < n_items; idx++)
            if ((int)items[idx].kind == kind && seen++ == used[kind]) break;
        if ((st = expand_one(&b, &items[idx])) != G4_OK) break;
        used[kind]++;
        pos += strlen(placeholder[kind]);
        copied = pos;
    }
    if (st == G4_OK)
        for (int k = 0; k < 3; k++)
            if (used[k] != have[k]) {
                st = g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: %zu %s(s) given but the prompt has %zu %s placeholders",
                             have[k], kind_name[k], used[k], placeholder[k]);
                break;
            }
    if (st != G4_OK) {
        chat_strbuf_free(&b);
        return st;
    }
    chat_strbuf_append(&b, text + copied, len - copied);
    return chat_strbuf_take(&b, out, out_len);
}
