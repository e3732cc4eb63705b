/* gemma4.h's generation on a sequence (what `gemma4 run`, `chat` and
 * `generate` use), from a program that includes nothing else of the
 * library:
 *   - greedy g4_sequence_generate on the dense, moe and e2b fixtures = the
 *     ids transformers' greedy search gave (ref.json), drafted or not
 *     (dense-assistant, 1 and 4 drafts a round);
 *   - on the bundled model: greedy = the argmax of g4_sequence_append's
 *     logit rows, one id at a time (first of equal values); a chat's second
 *     turn on the kept sequence evaluates only the new part and gives the
 *     reply a fresh sequence gives; a seeded sampled reply repeats; a
 *     --json reply parses as a JSON object (cJSON) and a --regex reply
 *     matches (POSIX regex); stop tokens, max_tokens and the callback end
 *     a reply;
 *   - g4_detokenizer pieces concatenated = g4_detokenize; g4_reply_content
 *     leaves out the thought channel; g4_vision_mask_parse's names and
 *     message; clear errors for bad calls. */
#include <cjson/cJSON.h>
#include <regex.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemma4.h"
#include "test_util.h"

/* ref.json's section.key ids (malloc'd; section NULL: top level) */
static int32_t *ref_ids(const char *fixture, const char *section, const char *key, int *n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/ref.json", test_fixture(fixture));
    FILE *f = fopen(path, "rb");
    *n = 0;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    size_t got = fread(text, 1, (size_t)size, f);
    fclose(f);
    text[got] = 0;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *sec = section ? cJSON_GetObjectItem(root, section) : root;
    const cJSON *arr = cJSON_GetObjectItem(sec, key);
    int32_t *ids = NULL;
    if (cJSON_IsArray(arr)) {
        *n = cJSON_GetArraySize(arr);
        ids = malloc((size_t)(*n > 0 ? *n : 1) * sizeof *ids);
        for (int i = 0; i < *n; i++) ids[i] = (int32_t)cJSON_GetArrayItem(arr, i)->valueint;
    }
    cJSON_Delete(root);
    return ids;
}

/* the callback's tokens; stops after `stop_after` of them (0: never) */
typedef struct {
    int32_t ids[4096];
    int n;
    int stop_after;
} collected;

static int collect(void *user, int32_t tok) {
    collected *c = user;
    if (c->n < 4096) c->ids[c->n++] = tok;
    return c->stop_after > 0 && c->n >= c->stop_after;
}

static const int32_t no_stop[1] = {0};

/* greedy, no stop ids, max_tokens n_new */
static g4_generate_options greedy(int n_new) {
    g4_generate_options o = {.stop_ids = no_stop, .n_stop = 0};
    g4_params_default(&o.params);
    o.params.max_tokens = n_new;
    return o;
}

static g4_status generate_ids(g4_handle *h, const int32_t *ids, int n, const g4_generate_options *o, collected *out,
                              g4_generate_result *r) {
    g4_sequence_options so = {.n_ctx = n + o->params.max_tokens + 1};
    g4_sequence *s = NULL;
    g4_input *in = NULL;
    g4_status st = g4_sequence_open(h, &so, &s);
    if (st == G4_OK) st = g4_input_ids(h, ids, n, NULL, 0, &in);
    if (st == G4_OK) st = g4_sequence_generate(s, in, o, collect, out, r);
    g4_input_free(in);
    g4_sequence_close(s);
    return st;
}

static int same(const int32_t *a, int n, const int32_t *b, int m) {
    return n == m && (n == 0 || memcmp(a, b, (size_t)n * sizeof *a) == 0);
}

static void check_transformers_greedy(const char *fixture, const char *drafter) {
    int n_prompt = 0, n_want = 0;
    int32_t *prompt = ref_ids(fixture, "text", "prompt_ids", &n_prompt);
    int32_t *want = ref_ids(fixture, "text", "greedy_ids", &n_want);
    CHECK(prompt && want && n_want > 0, "%s: ref.json has the prompt and transformers' greedy ids", fixture);
    if (!prompt || !want) return;
    for (int draft_max = 0; draft_max <= (drafter ? 4 : 0); draft_max += drafter ? (draft_max ? 3 : 1) : 1) {
        g4_open_options oo = {.device = "cpu", .threads = 1, .exact = 1, .kv_type = "f32", .sequences_only = 1};
        char dir[1024];
        if (draft_max) {
            snprintf(dir, sizeof dir, "%s", test_fixture(drafter));
            oo.draft = dir;
            oo.draft_max = draft_max;
        }
        g4_handle *h = NULL;
        g4_status st = g4_open(test_fixture(fixture), &oo, &h);
        CHECK(st == G4_OK, "%s: g4_open: %s", fixture, g4_error_message());
        if (st != G4_OK) continue;
        collected got = {0};
        g4_generate_options o = greedy(n_want);
        g4_generate_result r;
        st = generate_ids(h, prompt, n_prompt, &o, &got, &r);
        CHECK(st == G4_OK && same(got.ids, got.n, want, n_want),
              "%s%s%s: greedy g4_sequence_generate = transformers' %d ids (%s; got %d)", fixture,
              draft_max ? " drafted by " : "", draft_max ? drafter : "", n_want, g4_error_message(), got.n);
        CHECK(r.n_prompt == n_prompt && r.n_generated == n_want && !r.hit_stop && !r.stopped,
              "%s: the result counts %d prompt ids, %d generated", fixture, r.n_prompt, r.n_generated);
        if (draft_max) {
            CHECK(r.drafted && r.draft_max == draft_max && r.draft.rounds > 0 && r.draft.accepted <= r.draft.drafted &&
                      r.draft.accepted + r.draft.rounds >= n_want - 1,
                  "%s: %d drafts a round ran: %ld rounds, %ld of %ld drafts kept", fixture, draft_max, r.draft.rounds,
                  r.draft.accepted, r.draft.drafted);
            printf("%s drafted by %s, %d a round: %ld rounds, %ld/%ld drafts kept\n", fixture, drafter, draft_max,
                   r.draft.rounds, r.draft.accepted, r.draft.drafted);
        } else {
            CHECK(!r.drafted, "%s: no drafter, no drafting", fixture);
        }
        g4_close(h);
    }
    free(prompt);
    free(want);
}

/* index of the largest value, the first of equal ones */
static int32_t argmax(const float *row, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (row[i] > row[best]) best = i;
    return best;
}

static const char *tiny_model(void) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/../models/tiny", test_fixture(""));
    return path;
}

static void check_argmax_reference(g4_handle *h) {
    g4_model_info info;
    g4_get_model_info(h, &info);
    const int32_t prompt[] = {2, 818, 506, 4034, 1091, 1114};
    const int n_prompt = 6, n_new = 24;
    g4_sequence_options so = {.n_ctx = n_prompt + n_new + 1};
    g4_sequence *s = NULL;
    float *row = malloc((size_t)info.vocab_size * sizeof *row);
    int32_t want[64];
    int n_want = 0;
    g4_status st = g4_sequence_open(h, &so, &s);
    if (st == G4_OK) st = g4_sequence_append(s, prompt, n_prompt, G4_ROWS_LAST, row);
    while (st == G4_OK && n_want < n_new) {
        want[n_want] = argmax(row, info.vocab_size);
        if (++n_want < n_new) st = g4_sequence_append(s, &want[n_want - 1], 1, G4_ROWS_LAST, row);
    }
    g4_sequence_close(s);
    free(row);
    CHECK(st == G4_OK && n_want == n_new, "the argmax reference ran: %s", g4_error_message());
    collected got = {0};
    g4_generate_options o = greedy(n_new);
    g4_generate_result r;
    st = generate_ids(h, prompt, n_prompt, &o, &got, &r);
    CHECK(st == G4_OK && same(got.ids, got.n, want, n_want),
          "bundled model: greedy g4_sequence_generate = the argmax of g4_sequence_append's rows (%d ids)", got.n);

    /* the model's stop ids end the reply before the stop token; the callback ends it after its token */
    g4_generate_options stops = greedy(n_new);
    stops.stop_ids = &want[5];
    stops.n_stop = 1;
    collected until = {0};
    st = generate_ids(h, prompt, n_prompt, &stops, &until, &r);
    int first = 0;
    while (want[first] != want[5]) first++;
    CHECK(st == G4_OK && r.hit_stop && same(until.ids, until.n, want, first),
          "a stop id ends the reply before it: %d ids (want %d)", until.n, first);
    collected three = {.stop_after = 3};
    st = generate_ids(h, prompt, n_prompt, &o, &three, &r);
    CHECK(st == G4_OK && r.stopped && r.n_generated == 3 && same(three.ids, 3, want, 3),
          "the callback ends the reply after its token: %d generated", r.n_generated);
    g4_generate_options few = greedy(7);
    collected seven = {0};
    st = generate_ids(h, prompt, n_prompt, &few, &seven, &r);
    CHECK(st == G4_OK && seven.n == 7 && same(seven.ids, 7, want, 7) && !r.hit_stop, "max_tokens 7 gives 7 ids");

    /* the streamed pieces are the whole text */
    const g4_tokenizer *t = g4_model_tokenizer(h);
    g4_detokenizer *d = NULL;
    char streamed[8192];
    size_t used = 0;
    st = g4_detokenizer_new(t, 1, &d);
    for (int i = 0; st == G4_OK && i < n_want; i++) {
        const char *piece;
        size_t len;
        st = g4_detokenizer_push(d, want[i], &piece, &len);
        if (st == G4_OK && used + len < sizeof streamed) memcpy(streamed + used, piece, len), used += len;
    }
    const char *piece;
    size_t len;
    if (st == G4_OK) st = g4_detokenizer_flush(d, &piece, &len);
    if (st == G4_OK && used + len < sizeof streamed) memcpy(streamed + used, piece, len), used += len;
    g4_detokenizer_free(d);
    char *whole = NULL;
    size_t whole_len = 0;
    g4_status st2 = g4_detokenize(t, want, (size_t)n_want, 1, &whole, &whole_len);
    CHECK(st == G4_OK && st2 == G4_OK && used == whole_len && memcmp(streamed, whole, used) == 0,
          "g4_detokenizer's pieces = g4_detokenize (%zu bytes)", whole_len);
    g4_free(whole);
}

/* one chat turn on s: the reply's ids into out */
static g4_status chat_turn(g4_handle *h, g4_sequence *s, const char *messages, const g4_generate_options *o,
                           collected *out, g4_generate_result *r, g4_input_info *info) {
    g4_input *in = NULL;
    g4_status st = g4_input_chat(h, messages, NULL, 0, NULL, 0, &in);
    if (st == G4_OK) g4_input_get_info(in, info);
    if (st == G4_OK) st = g4_sequence_generate(s, in, o, collect, out, r);
    g4_input_free(in);
    return st;
}

static void check_chat(g4_handle *h) {
    g4_sequence_options so = {.n_ctx = 512};
    g4_sequence *s = NULL, *fresh = NULL;
    g4_status st = g4_sequence_open(h, &so, &s);
    if (st == G4_OK) st = g4_sequence_open(h, &so, &fresh);
    CHECK(st == G4_OK, "two sequences: %s", g4_error_message());
    if (st != G4_OK) return;
    g4_generate_options o = {0}; /* the model's stop ids */
    g4_params_default(&o.params);
    o.params.max_tokens = 16;
    collected first = {0};
    g4_generate_result r1, r2, r3;
    g4_input_info i1, i2, i3;
    st = chat_turn(h, s, "[{\"role\":\"user\",\"content\":\"And God said\"}]", &o, &first, &r1, &i1);
    CHECK(st == G4_OK && first.n > 0 && r1.n_prompt == i1.n_ids, "first turn: %d ids evaluated, %d generated (%s)",
          r1.n_prompt, first.n, g4_error_message());
    char *content = NULL;
    st = g4_reply_content(h, first.ids, (size_t)first.n, i1.starts_in_reasoning, &content);
    CHECK(st == G4_OK && content, "g4_reply_content: %s", g4_error_message());
    if (st != G4_OK) return;
    cJSON *msgs = cJSON_Parse("[{\"role\":\"user\",\"content\":\"And God said\"}]");
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "role", "assistant");
    cJSON_AddStringToObject(a, "content", content);
    cJSON_AddItemToArray(msgs, a);
    cJSON *u = cJSON_CreateObject();
    cJSON_AddStringToObject(u, "role", "user");
    cJSON_AddStringToObject(u, "content", "Who is the king of glory?");
    cJSON_AddItemToArray(msgs, u);
    char *conversation = cJSON_PrintUnformatted(msgs);
    cJSON_Delete(msgs);
    g4_free(content);
    collected second = {0}, cold = {0};
    st = chat_turn(h, s, conversation, &o, &second, &r2, &i2);
    CHECK(st == G4_OK && r2.n_prompt > 0 && r2.n_prompt < i2.n_ids - i1.n_ids / 2,
          "second turn on the kept sequence evaluates %d of its %d ids", r2.n_prompt, i2.n_ids);
    st = chat_turn(h, fresh, conversation, &o, &cold, &r3, &i3);
    CHECK(st == G4_OK && r3.n_prompt == i3.n_ids && same(second.ids, second.n, cold.ids, cold.n),
          "the kept sequence's reply = a fresh sequence's (%d ids)", cold.n);
    free(conversation);
    g4_sequence_close(s);
    g4_sequence_close(fresh);
}

static char *reply_text(g4_handle *h, const collected *c) {
    char *text = NULL;
    size_t len = 0;
    if (g4_detokenize(g4_model_tokenizer(h), c->ids, (size_t)c->n, 1, &text, &len) != G4_OK) return NULL;
    return text;
}

static void check_sampling_and_constraints(g4_handle *h) {
    const char *chat = "[{\"role\":\"user\",\"content\":\"Describe Abraham\"}]";
    g4_input *in = NULL;
    g4_status st = g4_input_chat(h, chat, NULL, 0, NULL, 0, &in);
    CHECK(st == G4_OK, "g4_input_chat: %s", g4_error_message());
    if (st != G4_OK) return;
    g4_sequence_options so = {.n_ctx = 256};
    static collected runs[3];
    for (int k = 0; k < 3; k++) {
        g4_generate_options o = {0};
        g4_params_model_default(h, &o.params);
        o.params.max_tokens = 16;
        o.params.seed = k == 2 ? 99 : 5;
        g4_sequence *s = NULL;
        st = g4_sequence_open(h, &so, &s);
        if (st == G4_OK) st = g4_sequence_generate(s, in, &o, collect, &runs[k], NULL);
        g4_sequence_close(s);
        CHECK(st == G4_OK && runs[k].n > 0, "sampled reply %d: %s", k, g4_error_message());
    }
    CHECK(same(runs[0].ids, runs[0].n, runs[1].ids, runs[1].n), "one seed, one reply (%d ids)", runs[0].n);
    CHECK(!same(runs[0].ids, runs[0].n, runs[2].ids, runs[2].n), "another seed, another reply");

    for (int k = 0; k < 2; k++) {
        g4_generate_options o = {0};
        g4_params_model_default(h, &o.params);
        o.params.max_tokens = 96;
        o.params.seed = 11 + k;
        if (k == 0) o.params.json_object = 1;
        else o.params.regex = "[A-Z][a-z]{1,8} [0-9]{1,2}:[0-9]{1,2}";
        g4_sequence *s = NULL;
        g4_sequence_options wide = {.n_ctx = 512};
        collected got = {0};
        g4_generate_result r;
        st = g4_sequence_open(h, &wide, &s);
        if (st == G4_OK) st = g4_sequence_generate(s, in, &o, collect, &got, &r);
        g4_sequence_close(s);
        char *text = st == G4_OK ? reply_text(h, &got) : NULL;
        CHECK(st == G4_OK && text && r.hit_stop, "constrained reply %d ends complete: %s", k,
              st == G4_OK ? (text ? text : "?") : g4_error_message());
        if (!text) continue;
        if (k == 0) {
            cJSON *j = cJSON_Parse(text);
            CHECK(cJSON_IsObject(j), "json_object: the reply parses as a JSON object: %s", text);
            cJSON_Delete(j);
        } else {
            regex_t re;
            regcomp(&re, "^[A-Z][a-z]{1,8} [0-9]{1,2}:[0-9]{1,2}$", REG_EXTENDED | REG_NOSUB);
            CHECK(regexec(&re, text, 0, NULL, 0) == 0, "regex: POSIX regexec matches the reply '%s'", text);
            regfree(&re);
        }
        g4_free(text);
    }
    g4_generate_options two = {0};
    g4_params_default(&two.params);
    two.params.json_object = 1;
    two.params.regex = "a";
    g4_sequence *s = NULL;
    collected none = {0};
    st = g4_sequence_open(h, &so, &s);
    if (st == G4_OK) st = g4_sequence_generate(s, in, &two, collect, &none, NULL);
    CHECK(st == G4_ERR_INVALID_ARGUMENT && strstr(g4_error_message(), "at most one"), "two constraints refused: %s",
          g4_error_message());
    g4_sequence_close(s);
    g4_input_free(in);
}

static void check_reply_content(g4_handle *h) {
    const char *said = "<|channel>thought\nHe was old.<channel|>Abraham was a patriarch.<turn|>";
    int32_t *ids = NULL;
    size_t n = 0;
    g4_status st = g4_tokenize(g4_model_tokenizer(h), said, strlen(said), 0, &ids, &n);
    char *content = NULL;
    if (st == G4_OK) st = g4_reply_content(h, ids, n, 0, &content);
    CHECK(st == G4_OK && content && !strcmp(content, "Abraham was a patriarch."),
          "g4_reply_content leaves out the thought: '%s'", content ? content : g4_error_message());
    g4_free(content);
    g4_free(ids);
}

static void check_errors(g4_handle *h) {
    g4_sequence_options so = {.n_ctx = 8};
    g4_sequence *s = NULL;
    g4_status st = g4_sequence_open(h, &so, &s);
    const int32_t long_ids[10] = {2, 5, 6, 7, 8, 9, 10, 11, 12, 13}, bad_ids[3] = {2, 5, 999999};
    g4_input *in = NULL, *bad = NULL;
    if (st == G4_OK) st = g4_input_ids(h, long_ids, 10, NULL, 0, &in);
    g4_generate_options o = greedy(4);
    collected got = {0};
    if (st == G4_OK) st = g4_sequence_generate(s, in, &o, collect, &got, NULL);
    CHECK(st == G4_ERR_LIMIT && strstr(g4_error_message(), "context"), "an input over the context: %s",
          g4_error_message());
    st = g4_input_ids(h, bad_ids, 3, NULL, 0, &bad);
    if (st == G4_OK) st = g4_sequence_generate(s, bad, &o, collect, &got, NULL);
    CHECK(st == G4_ERR_INVALID_ARGUMENT && strstr(g4_error_message(), "999999") &&
              strstr(g4_error_message(), "outside the vocabulary"),
          "an id outside the vocabulary: %s", g4_error_message());
    g4_generate_options neg = greedy(4);
    neg.n_stop = -1;
    st = g4_sequence_generate(s, bad, &neg, collect, &got, NULL);
    CHECK(st == G4_ERR_INVALID_ARGUMENT, "n_stop -1 refused: %s", g4_error_message());
    st = g4_sequence_generate(s, bad, &o, NULL, NULL, NULL);
    CHECK(st == G4_ERR_INVALID_ARGUMENT, "no callback refused: %s", g4_error_message());
    g4_input *chat = NULL;
    st = g4_input_chat(h, "[{\"role\": \"user\", \"content\": \"x\"", NULL, 0, NULL, 0, &chat);
    CHECK(st == G4_ERR_INVALID_ARGUMENT && strstr(g4_error_message(), "not valid JSON") && !chat,
          "malformed messages: %s", g4_error_message());
    st = g4_input_chat(h, "[{\"role\": \"wizard\", \"content\": \"x\"}]", NULL, 0, NULL, 0, &chat);
    CHECK(st == G4_ERR_INVALID_ARGUMENT && strstr(g4_error_message(), "messages[0].role"), "unknown role: %s",
          g4_error_message());
    st = g4_input_text(h, "<bos><|image|>", 14, NULL, 0, &chat);
    CHECK(st != G4_OK && strstr(g4_error_message(), "placeholder"), "a placeholder without an image: %s",
          g4_error_message());
    g4_input_free(in);
    g4_input_free(bad);
    g4_sequence_close(s);
}

static void check_vision_mask_names(void) {
    static const struct {
        const char *name;
        g4_vision_mask want;
    } names[] = {{NULL, G4_VISION_MASK_DEFAULT},
                 {"default", G4_VISION_MASK_DEFAULT},
                 {"causal", G4_VISION_MASK_CAUSAL},
                 {"all-layers", G4_VISION_MASK_ALL_LAYERS}};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        g4_vision_mask got = (g4_vision_mask)-1;
        g4_status st = g4_vision_mask_parse(names[k].name, "--vision-mask", &got);
        CHECK(st == G4_OK && got == names[k].want, "vision mask '%s'", names[k].name ? names[k].name : "(null)");
    }
    g4_vision_mask got;
    g4_status st = g4_vision_mask_parse("sideways", "--vision-mask", &got);
    CHECK(st == G4_ERR_INVALID_ARGUMENT &&
              !strcmp(g4_error_message(), "--vision-mask must be default, all-layers or causal, got 'sideways'"),
          "a bad name, in the caller's words: %s", g4_error_message());
    st = g4_vision_mask_parse("All-Layers", NULL, &got);
    CHECK(st == G4_ERR_INVALID_ARGUMENT &&
              !strcmp(g4_error_message(), "vision_mask must be default, all-layers or causal, got 'All-Layers'"),
          "names are case-sensitive: %s", g4_error_message());
}

int main(void) {
    check_vision_mask_names();
    check_transformers_greedy("dense", "dense-assistant");
    check_transformers_greedy("moe", NULL);
    check_transformers_greedy("e2b", NULL);
    g4_open_options oo = {.device = "cpu", .threads = 1, .exact = 1, .kv_type = "f32", .sequences_only = 1};
    g4_handle *h = NULL;
    g4_status st = g4_open(tiny_model(), &oo, &h);
    CHECK(st == G4_OK, "the bundled model: %s", g4_error_message());
    if (st == G4_OK) {
        check_argmax_reference(h);
        check_chat(h);
        check_sampling_and_constraints(h);
        check_reply_content(h);
        check_errors(h);
        g4_close(h);
    }
    return test_finish();
}
