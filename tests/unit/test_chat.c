/* The chat format against transformers' own rendering of the official Gemma
 * 4 templates (tests/data/chat/cases.json, written by
 * tests/tools/render_chat_cases.py): every case with the small (E2B), large
 * (31B) and 12B template, byte for byte; cases the template rejects must
 * fail; cases the C code deliberately does not support must fail clearly.
 * Also: template-variant recognition, media placeholder expansion against
 * Gemma4Processor, tool-call / reply parsing against the template's own
 * rendering of known calls. */
#include <cjson/cJSON.h>

#include "base/file.h"
#include "test_util.h"
#include "text/chat.h"

static const char *data_path(const char *rel) {
    static char buf[4][1024];
    static int k;
    const char *root = getenv("G4_TEST_DATA");
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/chat/%s", root ? root : "tests/data", rel);
    return b;
}

static cJSON *load_json(const char *path) {
    char *text;
    size_t len;
    if (g4_read_file(path, 64u << 20, &text, &len) != G4_OK) return NULL;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    return j;
}

static void show_diff(const char *name, const char *variant, const char *got, const char *want) {
    size_t i = 0;
    while (got[i] && got[i] == want[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "  %s/%s differs at byte %zu:\n   got  ...%.80s\n   want ...%.80s\n", name, variant, i, got + from,
            want + from);
}

static void test_render_cases(const cJSON *doc) {
    static const struct {
        const char *key;
        g4_chat_variant variant;
    } variants[] = {{"small", G4_CHAT_SMALL}, {"large", G4_CHAT_LARGE}, {"12b", G4_CHAT_LARGE}};
    const cJSON *cases = cJSON_GetObjectItem(doc, "cases");
    const cJSON *c;
    int n_cases = 0, n_rendered = 0, n_errors = 0, n_unsupported = 0;
    cJSON_ArrayForEach(c, cases) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        g4_chat_options opt = {0};
        opt.add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
        opt.enable_thinking = cJSON_IsTrue(cJSON_GetObjectItem(c, "enable_thinking"));
        opt.preserve_thinking = cJSON_IsTrue(cJSON_GetObjectItem(c, "preserve_thinking"));
        int unsupported = cJSON_IsTrue(cJSON_GetObjectItem(c, "c_unsupported"));
        const cJSON *expected = cJSON_GetObjectItem(c, "expected");
        n_cases++;
        for (size_t v = 0; v < 3; v++) {
            const cJSON *want = cJSON_GetObjectItem(expected, variants[v].key);
            char *got = NULL;
            size_t got_len = 0;
            g4_status st = g4_chat_render(variants[v].variant, cJSON_GetObjectItem(c, "messages"),
                                          cJSON_GetObjectItem(c, "tools"), &opt, &got, &got_len);
            if (unsupported) {
                CHECK(st == G4_ERR_UNSUPPORTED, "%s/%s: expected a clear 'unsupported' error, got %s", name,
                      variants[v].key, g4_status_name(st));
                if (st != G4_OK && v == 0) printf("  unsupported as documented: %s: %s\n", name, g4_error_message());
                n_unsupported += v == 0;
            } else if (cJSON_IsNull(want)) {
                CHECK(st != G4_OK, "%s/%s: transformers raises, the C renderer did not", name, variants[v].key);
                if (st != G4_OK && v == 0) printf("  rejected like transformers: %s: %s\n", name, g4_error_message());
                n_errors += v == 0;
            } else {
                CHECK(st == G4_OK, "%s/%s: %s", name, variants[v].key, g4_error_message());
                if (st == G4_OK) {
                    int same = got_len == strlen(want->valuestring) && memcmp(got, want->valuestring, got_len) == 0;
                    CHECK(same, "%s/%s: rendered text differs from transformers", name, variants[v].key);
                    if (!same) show_diff(name, variants[v].key, got, want->valuestring);
                    n_rendered++;
                }
            }
            free(got);
        }
    }
    printf("render: %d cases, %d renders compared byte for byte, %d rejected as by transformers, %d unsupported\n",
           n_cases, n_rendered, n_errors, n_unsupported);
    CHECK(n_cases >= 60, "only %d cases", n_cases);
}

static void test_variants(const cJSON *doc) {
    const cJSON *templates = cJSON_GetObjectItem(doc, "templates");
    static const struct {
        const char *key;
        g4_chat_variant variant;
    } want[] = {{"small", G4_CHAT_SMALL}, {"large", G4_CHAT_LARGE}, {"12b", G4_CHAT_LARGE}};
    for (size_t i = 0; i < 3; i++) {
        const char *file = cJSON_GetObjectItem(cJSON_GetObjectItem(templates, want[i].key), "file")->valuestring;
        char *text;
        size_t len;
        CHECK(g4_read_file(data_path(file), 1 << 20, &text, &len) == G4_OK, "%s", g4_error_message());
        g4_chat_variant v = 99;
        int canonical = -1;
        CHECK(g4_chat_variant_from_template(text, len, &canonical, &v) == G4_OK, "%s", g4_error_message());
        CHECK(v == want[i].variant && canonical == 1, "%s: variant %d canonical %d", file, v, canonical);
        /* an edited copy: same variant, not canonical */
        text[len - 1] = ' ';
        CHECK(g4_chat_variant_from_template(text, len, &canonical, &v) == G4_OK && v == want[i].variant &&
                  canonical == 0,
              "%s edited: variant %d canonical %d", file, v, canonical);
        /* model folder with that template */
        char dir[256];
        snprintf(dir, sizeof dir, "%s", test_tmp_path("chat_variant_model"));
        char cmd[600];
        snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s' '%s/chat_template.jinja'", dir, data_path(file), dir);
        CHECK(system(cmd) == 0, "%s", cmd);
        g4_chat_variant_info info;
        CHECK(g4_chat_variant_for_model(dir, &info) == G4_OK, "%s", g4_error_message());
        CHECK(info.variant == want[i].variant && info.canonical && info.source == G4_CHAT_FROM_TEMPLATE_FILE,
              "%s folder: variant %d canonical %d source %d", file, info.variant, info.canonical, info.source);
        free(text);
    }
    /* an older large-model revision (2026-05-06): large, not canonical */
    char *text;
    size_t len;
    CHECK(g4_read_file(data_path("templates/old-large-2026-05-06.jinja"), 1 << 20, &text, &len) == G4_OK, "%s",
          g4_error_message());
    g4_chat_variant v = 99;
    int canonical = -1;
    CHECK(g4_chat_variant_from_template(text, len, &canonical, &v) == G4_OK && v == G4_CHAT_LARGE && canonical == 0,
          "old large template: variant %d canonical %d", v, canonical);
    free(text);
    const char *other = "{% for m in messages %}<start_of_turn>{{ m.content }}{% endfor %}";
    CHECK(g4_chat_variant_from_template(other, strlen(other), &canonical, &v) == G4_ERR_UNSUPPORTED,
          "a non-Gemma-4 template must be refused");
    /* no template: the config decides (fixtures carry only config.json) */
    g4_chat_variant_info info;
    CHECK(g4_chat_variant_for_model(test_fixture("e2b"), &info) == G4_OK && info.variant == G4_CHAT_SMALL &&
              info.source == G4_CHAT_FROM_CONFIG,
          "e2b fixture: %s variant %d source %d", g4_error_message(), info.variant, info.source);
    CHECK(g4_chat_variant_for_model(test_fixture("dense"), &info) == G4_OK && info.variant == G4_CHAT_LARGE &&
              info.source == G4_CHAT_FROM_CONFIG,
          "dense fixture: %s variant %d source %d", g4_error_message(), info.variant, info.source);
}

static void test_media(const cJSON *doc) {
    const cJSON *c;
    int n = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(doc, "media")) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        const cJSON *items = cJSON_GetObjectItem(c, "items");
        size_t n_items = (size_t)cJSON_GetArraySize(items);
        g4_media_item it[16];
        double seconds[16][8];
        size_t i = 0;
        const cJSON *j;
        cJSON_ArrayForEach(j, items) {
            const char *kind = cJSON_GetObjectItem(j, "kind")->valuestring;
            it[i].kind = !strcmp(kind, "image") ? G4_MEDIA_IMAGE : !strcmp(kind, "audio") ? G4_MEDIA_AUDIO
                                                                                          : G4_MEDIA_VIDEO;
            it[i].n_tokens = cJSON_GetObjectItem(j, "n_tokens")->valueint;
            it[i].n_frames = 0;
            it[i].frame_seconds = seconds[i];
            const cJSON *s;
            cJSON_ArrayForEach(s, cJSON_GetObjectItem(j, "frame_seconds")) seconds[i][it[i].n_frames++] = s->valuedouble;
            i++;
        }
        char *out = NULL;
        size_t out_len;
        g4_status st = g4_chat_expand_media(text, strlen(text), it, n_items, &out, &out_len);
        const char *want = cJSON_GetObjectItem(c, "expected")->valuestring;
        CHECK(st == G4_OK && out_len == strlen(want) && !memcmp(out, want, out_len), "media %s: %s\n got  %s\n want %s",
              name, g4_error_message(), out ? out : "(none)", want);
        free(out);
        n++;
    }
    printf("media: %d expansions compared with Gemma4Processor\n", n);
    /* counts must match */
    g4_media_item one = {G4_MEDIA_IMAGE, 2, 0, NULL};
    char *out = NULL;
    CHECK(g4_chat_expand_media("a<|image|>b<|image|>", 20, &one, 1, &out, NULL) == G4_ERR_INVALID_ARGUMENT,
          "two placeholders, one image");
    CHECK(g4_chat_expand_media("no placeholder", 14, &one, 1, &out, NULL) == G4_ERR_INVALID_ARGUMENT,
          "no placeholder, one image");
    g4_media_item bad_video = {G4_MEDIA_VIDEO, 2, 2, NULL};
    CHECK(g4_chat_expand_media("<|video|>", 9, &bad_video, 1, &out, NULL) == G4_ERR_INVALID_ARGUMENT,
          "video without timestamps");
}

static void test_tool_call_replies(const cJSON *doc) {
    const cJSON *c;
    int n = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(doc, "tool_call_replies")) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        /* the model's turn: thought, then the call, stopped at <|tool_response> */
        char reply[8192];
        snprintf(reply, sizeof reply, "<|channel>thought\nI need %s.\n<channel|>%s<|tool_response>", name, text);
        g4_chat_reply r;
        CHECK(g4_chat_parse_reply(reply, strlen(reply), 0, &r) == G4_OK, "%s", g4_error_message());
        CHECK(r.n_tool_calls == 1 && r.n_malformed_tool_calls == 0, "%s: %zu calls, %zu malformed", name,
              r.n_tool_calls, r.n_malformed_tool_calls);
        if (r.n_tool_calls == 1) {
            CHECK(!strcmp(r.tool_calls[0].name, name), "name %s vs %s", r.tool_calls[0].name, name);
            cJSON *got = cJSON_Parse(r.tool_calls[0].arguments);
            CHECK(got && cJSON_Compare(got, cJSON_GetObjectItem(c, "arguments"), 1), "%s: arguments %s", name,
                  r.tool_calls[0].arguments);
            cJSON_Delete(got);
        }
        char want_reasoning[256];
        snprintf(want_reasoning, sizeof want_reasoning, "I need %s.", name);
        CHECK(r.reasoning && !strcmp(r.reasoning, want_reasoning) && !r.reasoning_open, "reasoning '%s'",
              r.reasoning ? r.reasoning : "(null)");
        CHECK(r.content && r.content[0] == 0, "content '%s'", r.content);
        g4_chat_reply_free(&r);
        n++;
    }
    printf("tool calls: %d template-rendered calls parsed back to their arguments\n", n);
}

/* The model turn of a rendered case, parsed back: reasoning, calls and
 * content must be what the messages held. */
static void test_reply_roundtrip(const cJSON *doc) {
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(doc, "cases")) {
        if (strcmp(cJSON_GetObjectItem(c, "name")->valuestring, "tool_flow_complete_nogen") != 0) continue;
        const char *text = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "expected"), "large")->valuestring;
        const char *turn = strstr(text, "<|turn>model\n");
        CHECK(turn != NULL, "model turn");
        if (!turn) return;
        turn += strlen("<|turn>model\n");
        /* what the model generated: up to its stop token <|tool_response> */
        g4_chat_reply r;
        CHECK(g4_chat_parse_reply(turn, strlen(turn), 0, &r) == G4_OK, "%s", g4_error_message());
        CHECK(r.reasoning && !strcmp(r.reasoning, "I should call the tool twice."), "reasoning %s", r.reasoning);
        CHECK(r.n_tool_calls == 2, "%zu calls", r.n_tool_calls);
        if (r.n_tool_calls == 2) {
            CHECK(!strcmp(r.tool_calls[0].arguments, "{\"city\":\"Paris\",\"unit\":\"celsius\"}"), "%s",
                  r.tool_calls[0].arguments);
            CHECK(!strcmp(r.tool_calls[1].arguments, "{\"city\":\"London\",\"days\":3}"), "%s",
                  r.tool_calls[1].arguments);
        }
        CHECK(!strcmp(r.content, ""), "content '%s'", r.content);
        g4_chat_reply_free(&r);
    }
}

static void test_reply_shapes(void) {
    g4_chat_reply r;
    /* thinking on: reasoning, then answer, then end of turn; text after <turn|> is dropped */
    const char *a = "<|channel>thought\nStep 1.\nStep 2.\n<channel|>  The answer is 4.\n<turn|>junk";
    CHECK(g4_chat_parse_reply(a, strlen(a), 0, &r) == G4_OK, "%s", g4_error_message());
    CHECK(r.reasoning && !strcmp(r.reasoning, "Step 1.\nStep 2.") && !r.reasoning_open, "reasoning '%s'", r.reasoning);
    CHECK(!strcmp(r.content, "The answer is 4."), "content '%s'", r.content);
    g4_chat_reply_free(&r);
    /* generation stopped inside the thought */
    const char *b = "<|channel>thought\nStill thinking about ";
    CHECK(g4_chat_parse_reply(b, strlen(b), 0, &r) == G4_OK, "%s", g4_error_message());
    CHECK(r.reasoning && !strcmp(r.reasoning, "Still thinking about ") && r.reasoning_open && !strcmp(r.content, ""),
          "open reasoning '%s' content '%s'", r.reasoning, r.content);
    g4_chat_reply_free(&r);
    /* the prompt opened the thought channel (after a tool response with thinking on) */
    const char *c = "It is sunny.\n<channel|>Sunny in Rome.<eos>";
    CHECK(g4_chat_parse_reply(c, strlen(c), 1, &r) == G4_OK, "%s", g4_error_message());
    CHECK(r.reasoning && !strcmp(r.reasoning, "It is sunny.") && !strcmp(r.content, "Sunny in Rome."),
          "reasoning '%s' content '%s'", r.reasoning, r.content);
    g4_chat_reply_free(&r);
    /* no reasoning at all (large model, thinking off: the prompt held the empty thought block) */
    const char *d = "Hello there!<turn|>";
    CHECK(g4_chat_parse_reply(d, strlen(d), 0, &r) == G4_OK && !r.reasoning && !strcmp(r.content, "Hello there!"),
          "plain reply");
    g4_chat_reply_free(&r);
    /* a cut-off tool call stays in the content and is counted */
    const char *e = "Sure. <|tool_call>call:get_weather{city:<|\"|>Par";
    CHECK(g4_chat_parse_reply(e, strlen(e), 0, &r) == G4_OK, "%s", g4_error_message());
    CHECK(r.n_tool_calls == 0 && r.n_malformed_tool_calls == 1 && strstr(r.content, "<|tool_call>call:get_weather"),
          "malformed call: %zu %zu '%s'", r.n_tool_calls, r.n_malformed_tool_calls, r.content);
    g4_chat_reply_free(&r);
    /* bare words and quoted keys */
    char *json = NULL;
    const char *args = "{city: Paris , <|\"|>key<|\"|>:<|\"|>v<|\"|>, n:-1.5e3, ok:true}";
    CHECK(g4_chat_tool_args_to_json(args, strlen(args), &json) == G4_OK && json &&
              !strcmp(json, "{\"city\":\"Paris\",\"key\":\"v\",\"n\":-1.5e3,\"ok\":true}"),
          "lenient args: %s", json ? json : g4_error_message());
    free(json);
    json = NULL;
    CHECK(g4_chat_tool_args_to_json("{a:1,", 5, &json) == G4_ERR_FORMAT, "truncated arguments must fail");
    CHECK(g4_chat_tool_args_to_json("{a:1}x", 6, &json) == G4_ERR_FORMAT, "trailing text must fail");
    /* prompt tail detection */
    const char *p1 = "...<|tool_response><|channel>thought\n";
    CHECK(g4_chat_prompt_opens_reasoning(p1, strlen(p1)), "opens reasoning");
    const char *p2 = "<|turn>model\n<|channel>thought\n<channel|>";
    CHECK(!g4_chat_prompt_opens_reasoning(p2, strlen(p2)), "empty thought block is closed");
}

static int32_t fake_lookup(void *ctx, const char *s) {
    (void)ctx;
    if (!strcmp(s, "<turn|>")) return 106;
    if (!strcmp(s, "<eos>")) return 1;
    if (!strcmp(s, "<|tool_response>")) return 50;
    return -1;
}

static void test_stop_ids(void) {
    g4_generation_config gc = {0};
    gc.eos_ids[0] = 1;
    gc.eos_ids[1] = 106;
    gc.n_eos = 2;
    int32_t ids[8];
    size_t n = g4_chat_stop_ids(&gc, fake_lookup, NULL, ids, 8);
    CHECK(n == 3 && ids[0] == 1 && ids[1] == 106 && ids[2] == 50, "stop ids n=%zu", n);
}

static void test_normalize_arguments(void) {
    cJSON *m = cJSON_Parse("[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"tool_calls\":[{\"id\":"
                           "\"1\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"b\\\": 2, \\\"a\\\": \\\"s\\\"}\"}}]}]");
    CHECK(g4_chat_normalize_tool_arguments(m) == G4_OK, "%s", g4_error_message());
    char *out = NULL;
    g4_chat_options opt = {0};
    CHECK(g4_chat_render(G4_CHAT_SMALL, m, NULL, &opt, &out, NULL) == G4_OK, "%s", g4_error_message());
    CHECK(out && strstr(out, "<|tool_call>call:f{a:<|\"|>s<|\"|>,b:2}<tool_call|><|tool_response>"), "%s", out);
    free(out);
    cJSON_Delete(m);
    m = cJSON_Parse("[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"[1]\"}}]}]");
    CHECK(g4_chat_normalize_tool_arguments(m) == G4_ERR_INVALID_ARGUMENT, "non-object arguments text");
    cJSON_Delete(m);
}

int main(void) {
    cJSON *doc = load_json(data_path("cases.json"));
    CHECK(doc != NULL, "cannot read %s", data_path("cases.json"));
    if (!doc) return test_finish();
    test_render_cases(doc);
    test_variants(doc);
    test_media(doc);
    test_tool_call_replies(doc);
    test_reply_roundtrip(doc);
    test_reply_shapes();
    test_stop_ids();
    test_normalize_arguments();
    cJSON_Delete(doc);
    return test_finish();
}
