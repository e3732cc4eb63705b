/* The server's request validation without a server: strict JSON (RFC 8259,
 * no escaped NUL, bounded values), chat message checks with the OpenAI
 * error's param, the runtime's media collection (statuses) and the HTTP
 * codes the server makes of them, and completions' character offsets
 * across byte-fallback tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "text/json_strict.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "test_util.h"

static void check_json(void) {
    static const char *const valid[] = {
        "{}", " [ ] ", "0", "-0", "-0.5e+3", "1E9", "12.25", "\"a\\u00e9\\ud83d\\ude00\\n\"", "[true,false,null]",
        "{\"a\":{\"b\":[1,{\"c\":\"\\\\u0000\"}]}}", /* an escaped backslash, then text: no NUL */
    };
    static const char *const invalid[] = {
        "", "01", "-01", "00", "1.", ".5", "+1", "1e", "1e+", "-", "0x10", "NaN", "Infinity", "[1,]", "{\"a\":1,}",
        "[1 2]", "{\"a\" 1}", "{a:1}", "'a'", "\"\\x41\"", "\"\\u12\"", "\"\\u0000\"", "{\"c\":\"a\\u0000b\"}",
        "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"tab\there\"", "[", "{\"a\":1} x", "tru", "nul",
        "[1]]", "{}}",
    };
    for (size_t i = 0; i < sizeof valid / sizeof valid[0]; i++) {
        size_t pos;
        const char *why = NULL;
        CHECK(g4_json_check(valid[i], strlen(valid[i]), 1000, &pos, &why) == 0, "valid [%s]: %s at %zu", valid[i],
              why ? why : "", pos);
    }
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
        size_t pos;
        const char *why = NULL;
        CHECK(g4_json_check(invalid[i], strlen(invalid[i]), 1000, &pos, &why) != 0 && why, "invalid [%s] accepted",
              invalid[i]);
    }
    const char *nul = "{\"m\":\"ab\\u0000cd\"}";
    size_t pos;
    const char *why = NULL;
    CHECK(g4_json_check(nul, strlen(nul), 100, &pos, &why) != 0 && why && strstr(why, "NUL") && pos == 14,
          "escaped NUL: %s at %zu", why ? why : "", pos);
    /* depth and value count are bounded */
    char deep[2 * G4_JSON_MAX_DEPTH + 8];
    size_t n = 0;
    for (int i = 0; i < G4_JSON_MAX_DEPTH; i++) deep[n++] = '[';
    for (int i = 0; i < G4_JSON_MAX_DEPTH; i++) deep[n++] = ']';
    CHECK(g4_json_check(deep, n, 100000, NULL, NULL) == 0, "depth %d accepted", G4_JSON_MAX_DEPTH);
    memmove(deep + 1, deep, n);
    deep[0] = '[';
    deep[n + 1] = ']';
    CHECK(g4_json_check(deep, n + 2, 100000, NULL, &why) != 0 && !strcmp(why, "nested too deeply"), "depth + 1");
    const char *list = "[0,0,0,0,0]"; /* 6 values */
    CHECK(g4_json_check(list, strlen(list), 6, NULL, NULL) == 0, "6 values within 6");
    CHECK(g4_json_check(list, strlen(list), 5, NULL, &why) != 0 && !strcmp(why, "too many values"), "6 values > 5");
    /* the parser refuses, with a 400 */
    g4_oai_error err;
    cJSON *root = g4_oai_parse_json("{\"a\": 012}", 10, 0, &err);
    CHECK(!root && err.status == 400 && strstr(err.message, "leading zero"), "leading zero: %s", err.message);
}

/* One chat body -> the status and param of the error (0 / NULL: accepted). */
static void chat_case(const char *messages, int want_status, const char *want_param) {
    char body[1024];
    snprintf(body, sizeof body, "{\"messages\": %s}", messages);
    g4_oai_limits lim = {.vocab_size = 100};
    g4_oai_request r;
    g4_oai_error err = {0};
    int rc = g4_oai_parse(body, strlen(body), G4_OAI_CHAT, &lim, &r, &err);
    int status = rc ? err.status : 0;
    const char *param = rc ? err.param : NULL;
    CHECK(status == want_status && ((!param && !want_param) || (param && want_param && !strcmp(param, want_param))),
          "%s: %d %s (%s), want %d %s", messages, status, param ? param : "null", rc ? err.message : "",
          want_status, want_param ? want_param : "null");
    g4_oai_request_free(&r);
}

static void check_messages(void) {
    chat_case("[{\"role\": \"user\", \"content\": \"Hi\"}]", 0, NULL);
    chat_case("[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hi\"}]}]", 0, NULL);
    chat_case("[{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"developer\", \"content\": \"d\"}, "
              "{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"content\": null, "
              "\"tool_calls\": []}, {\"role\": \"tool\", \"content\": \"t\"}, {\"role\": \"assistant\"}]",
              0, NULL);
    chat_case("[{\"role\": \"wizard\", \"content\": \"Hi\"}]", 400, "messages[0].role");
    chat_case("[{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"User\", \"content\": \"Hi\"}]", 400,
              "messages[1].role");
    chat_case("[{\"content\": \"Hi\"}]", 400, "messages[0].role");
    chat_case("[{\"role\": 5, \"content\": \"Hi\"}]", 400, "messages[0].role");
    chat_case("[{\"role\": \"user\", \"content\": 5}]", 400, "messages[0].content");
    chat_case("[{\"role\": \"user\", \"content\": {\"a\": 1}}]", 400, "messages[0].content");
    chat_case("[{\"role\": \"user\", \"content\": true}]", 400, "messages[0].content");
    chat_case("[{\"role\": \"user\"}]", 400, "messages[0].content");
    chat_case("[{\"role\": \"user\", \"content\": null}]", 400, "messages[0].content");
    chat_case("[{\"role\": \"system\"}]", 400, "messages[0].content");
    chat_case("[{\"role\": \"tool\"}]", 400, "messages[0].content");
    chat_case("[{\"role\": \"user\", \"content\": \"a\", \"tool_calls\": []}]", 400, "messages[0].tool_calls");
    chat_case("[{\"role\": \"assistant\", \"content\": \"a\", \"tool_calls\": \"x\"}]", 400, "messages[0].tool_calls");
    chat_case("[{\"role\": \"user\", \"content\": \"a\", \"name\": 3}]", 400, "messages[0].name");
    chat_case("[5]", 400, "messages[0]");
    chat_case("[]", 400, "messages");
}

/* One content part through g4_chat_collect_media: its status, and the
 * server's HTTP code for it (g4_oai_collect_media). */
static g4_status media_case(const char *part, const g4_media_limits *lim, int want_http, g4_media_list *out) {
    char body[1024];
    snprintf(body, sizeof body, "[{\"role\": \"user\", \"content\": [%s]}]", part);
    cJSON *messages = cJSON_Parse(body);
    g4_status st = g4_chat_collect_media(messages, lim, out);
    g4_media_list again;
    g4_oai_error err = {0};
    int rc = g4_oai_collect_media(messages, lim, &again, &err);
    CHECK((rc ? err.status : 0) == want_http, "%s: HTTP %d (%s), want %d", part, rc ? err.status : 0,
          rc ? err.message : "", want_http);
    if (want_http == 403) CHECK(rc && !strcmp(err.type, "permission_error"), "%s: type %s", part, rc ? err.type : "");
    if (!rc) g4_media_list_free(&again);
    cJSON_Delete(messages);
    return st;
}

static void check_media(void) {
    char dir[512], inside[600], outside[600], part[1400];
    snprintf(dir, sizeof dir, "%s", test_tmp_path("media_allowed"));
    mkdir(dir, 0755);
    snprintf(inside, sizeof inside, "%s/a.png", dir);
    snprintf(outside, sizeof outside, "%s", test_tmp_path("media_outside.png"));
    FILE *f = fopen(inside, "wb"), *g = fopen(outside, "wb");
    CHECK(f && g, "cannot write the media files");
    if (!f || !g) return;
    fputs("inside", f), fclose(f);
    fputs("outside", g), fclose(g);
    g4_media_limits lim = {.max_images = 2, .max_audio = 2, .max_bytes = 1 << 20, .allowed_dir = dir};
    g4_media_list l;
    /* RFC 4648's test vector: "aGVsbG8=" is "hello" */
    g4_status st = media_case("{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,aGVsbG8=\"}}",
                              &lim, 0, &l);
    CHECK(st == G4_OK && l.n == 1 && l.items[0].kind == G4_MEDIA_IMAGE && l.items[0].size == 5 &&
              !memcmp(l.items[0].data, "hello", 5) && !strcmp(l.items[0].label, "image 1"),
          "data: URI image: %s", g4_error_message());
    if (st == G4_OK) g4_media_list_free(&l);
    st = media_case("{\"type\": \"input_audio\", \"input_audio\": {\"data\": \"aGVsbG8=\", \"format\": \"wav\"}}", &lim,
                    0, &l);
    CHECK(st == G4_OK && l.n == 1 && l.items[0].kind == G4_MEDIA_AUDIO && !memcmp(l.items[0].data, "hello", 5),
          "base64 audio: %s", g4_error_message());
    if (st == G4_OK) g4_media_list_free(&l);
    snprintf(part, sizeof part, "{\"type\": \"image_url\", \"image_url\": \"file://%s\"}", inside);
    st = media_case(part, &lim, 0, &l);
    CHECK(st == G4_OK && l.n == 1 && l.items[0].size == 6 && !memcmp(l.items[0].data, "inside", 6),
          "a file inside the allowed folder: %s", g4_error_message());
    if (st == G4_OK) g4_media_list_free(&l);
    snprintf(part, sizeof part, "{\"type\": \"image_url\", \"image_url\": \"%s\"}", outside);
    st = media_case(part, &lim, 403, &l);
    CHECK(st == G4_ERR_PERMISSION && l.n == 0, "a file outside the folder: %s (%s)", g4_status_name(st),
          g4_error_message());
    g4_media_limits no_dir = lim, gone = lim;
    no_dir.allowed_dir = NULL;
    st = media_case(part, &no_dir, 400, &l);
    CHECK(st == G4_ERR_INVALID_ARGUMENT, "a file without an allowed folder: %s", g4_status_name(st));
    gone.allowed_dir = test_tmp_path("media_no_such_folder");
    st = media_case(part, &gone, 500, &l);
    CHECK(st == G4_ERR_INTERNAL, "a missing allowed folder: %s", g4_status_name(st));
    st = media_case("{\"type\": \"image_url\", \"image_url\": \"https://example.com/a.png\"}", &lim, 400, &l);
    CHECK(st == G4_ERR_INVALID_ARGUMENT && strstr(g4_error_message(), "remote URLs"), "a remote URL: %s",
          g4_error_message());
    st = media_case("{\"type\": \"image_url\", \"image_url\": \"data:,x\"}, {\"type\": \"video\"}", &lim, 400, &l);
    CHECK(st == G4_ERR_INVALID_ARGUMENT && l.n == 0, "a bad data: URI: %s", g4_error_message());
    lim.max_images = 1;
    st = media_case("{\"type\": \"image_url\", \"image_url\": \"data:image/png;base64,aGVsbG8=\"}, "
                    "{\"type\": \"image_url\", \"image_url\": \"data:image/png;base64,aGVsbG8=\"}",
                    &lim, 400, &l);
    CHECK(st == G4_ERR_INVALID_ARGUMENT && l.n == 0 && strstr(g4_error_message(), "at most 1 images"),
          "over the image limit: %s", g4_error_message());
    remove(inside), remove(outside), rmdir(dir);
}

/* text_offset: the character each token starts in, without waiting for
 * the rest of a character split over byte tokens. */
static void check_offsets(void) {
    static const struct {
        const char *bytes;
        size_t want;
    } seq[] = {
        {"\xC3", 0}, {"\xA9", 0}, {"x", 1}, {"\xE6", 2}, {"\x97", 2}, {"\xA5", 2}, {" the", 3}, {"", 7},
        {"\xF0\x9F", 7}, {"\x98\x80", 7}, {"\xC3", 8}, {"\xC3", 9}, {"!", 10}, {"\xA9", 11},
    };
    g4_text_counter c = {0};
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
        size_t got = g4_text_counter_add(&c, seq[i].bytes, strlen(seq[i].bytes));
        CHECK(got == seq[i].want, "token %zu: offset %zu, want %zu", i, got, seq[i].want);
    }
    CHECK(c.chars == 12, "characters %zu", c.chars);
}

/* logit_bias keys are token ids written as digits, nothing else */
static void check_logit_bias(void) {
    static const char *const bad[] = {"\" 5\"", "\"+5\"", "\"5 \"", "\"-1\"", "\"\"", "\"0x5\"", "\"100\"",
                                      "\"99999999999999999999\""};
    g4_oai_limits lim = {.vocab_size = 100};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"prompt\": \"a\", \"logit_bias\": {%s: 1}}", bad[i]);
        g4_oai_request r;
        g4_oai_error err = {0};
        int rc = g4_oai_parse(body, strlen(body), G4_OAI_COMPLETION, &lim, &r, &err);
        CHECK(rc && err.status == 400 && !strcmp(err.param, "logit_bias"), "logit_bias key %s accepted", bad[i]);
        g4_oai_request_free(&r);
    }
    const char *good = "{\"prompt\": \"a\", \"logit_bias\": {\"7\": 2.5, \"099\": -1}}";
    g4_oai_request r;
    g4_oai_error err = {0};
    CHECK(g4_oai_parse(good, strlen(good), G4_OAI_COMPLETION, &lim, &r, &err) == 0 && r.sampling.n_logit_bias == 2 &&
              r.logit_bias[0].id == 7 && r.logit_bias[1].id == 99,
          "valid logit_bias: %s", err.message);
    g4_oai_request_free(&r);
}

/* The constraint fields: one spec, the schema text as given, conflicts and bad values refused. */
static void constraint_case(g4_oai_kind kind, const char *fields, int want_status, g4_constraint_kind want_kind,
                            const char *want_text_part, int want_mode) {
    char body[2048];
    snprintf(body, sizeof body, "{%s, %s}", kind == G4_OAI_CHAT ? "\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]"
                                                         : "\"prompt\": \"x\"",
             fields);
    g4_oai_limits lim = {.vocab_size = 100};
    g4_oai_request r;
    g4_oai_error err = {0};
    int rc = g4_oai_parse(body, strlen(body), kind, &lim, &r, &err);
    CHECK((rc ? err.status : 0) == want_status, "%s: status %d (%s), want %d", fields, rc ? err.status : 0,
          rc ? err.message : "", want_status);
    if (!rc) {
        CHECK(r.constraint.kind == want_kind, "%s: kind %d, want %d", fields, r.constraint.kind, want_kind);
        CHECK(!want_text_part || (r.constraint.text && strstr(r.constraint.text, want_text_part)), "%s: text %s",
              fields, r.constraint.text ? r.constraint.text : "(none)");
        CHECK(want_mode < 0 || (int)r.constraint.tool_mode == want_mode, "%s: tool mode %d", fields,
              r.constraint.tool_mode);
    }
    g4_oai_request_free(&r);
}

static void check_constraints(void) {
    const g4_oai_kind C = G4_OAI_CHAT, P = G4_OAI_COMPLETION;
    const char *tools = "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": "
                        "\"object\"}}}, {\"type\": \"function\", \"function\": {\"name\": \"g\", \"strict\": true}}]";
    char buf[1024];
    constraint_case(C, "\"response_format\": {\"type\": \"text\"}", 0, G4_CONSTRAINT_NONE, NULL, -1);
    constraint_case(C, "\"response_format\": {\"type\": \"json_object\"}", 0, G4_CONSTRAINT_JSON_OBJECT, NULL, -1);
    constraint_case(C, "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"n\", \"schema\": "
                       "{\"type\": \"integer\"}, \"strict\": true}}",
                    0, G4_CONSTRAINT_JSON_SCHEMA, "\"integer\"", -1);
    constraint_case(C, "\"response_format\": {\"type\": \"json_schema\"}", 400, 0, NULL, -1);
    constraint_case(C, "\"response_format\": {\"type\": \"yaml\"}", 400, 0, NULL, -1);
    constraint_case(C, "\"response_format\": \"json\"", 400, 0, NULL, -1);
    snprintf(buf, sizeof buf, "%s, \"tool_choice\": \"required\"", tools);
    constraint_case(C, buf, 0, G4_CONSTRAINT_TOOL_CALLS, "\"name\":\"g\"", G4_TOOLS_REQUIRED);
    snprintf(buf, sizeof buf, "%s, \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"f\"}}", tools);
    constraint_case(C, buf, 0, G4_CONSTRAINT_TOOL_CALLS, "{\"name\":\"f\",\"parameters\"", G4_TOOLS_NAMED);
    snprintf(buf, sizeof buf, "%s, \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"h\"}}", tools);
    constraint_case(C, buf, 400, 0, NULL, -1);
    snprintf(buf, sizeof buf, "%s, \"tool_choice\": \"auto\"", tools); /* g is strict: lazy calls, f's schema not applied */
    constraint_case(C, buf, 0, G4_CONSTRAINT_TOOL_CALLS, "[{\"name\":\"f\"},{\"name\":\"g\"}]", G4_TOOLS_LAZY);
    snprintf(buf, sizeof buf, "%s, \"tool_choice\": \"none\"", tools);
    constraint_case(C, buf, 0, G4_CONSTRAINT_NONE, NULL, -1);
    constraint_case(C, "\"tool_choice\": \"required\"", 400, 0, NULL, -1);
    constraint_case(C, "\"tool_choice\": \"sometimes\"", 400, 0, NULL, -1);
    constraint_case(C, "\"guided_json\": {\"type\": \"string\"}", 0, G4_CONSTRAINT_JSON_SCHEMA, "string", -1);
    constraint_case(C, "\"guided_json\": \"{\\\"type\\\": \\\"null\\\"}\"", 0, G4_CONSTRAINT_JSON_SCHEMA, "null", -1);
    constraint_case(P, "\"guided_regex\": \"a+b\"", 0, G4_CONSTRAINT_REGEX, "a+b", -1);
    constraint_case(P, "\"guided_choice\": [\"x\", \"y\"]", 0, G4_CONSTRAINT_CHOICE, "[\"x\",\"y\"]", -1);
    constraint_case(P, "\"grammar\": \"root ::= \\\"a\\\"\"", 0, G4_CONSTRAINT_GBNF, "root ::=", -1);
    constraint_case(P, "\"json_schema\": {\"type\": \"boolean\"}", 0, G4_CONSTRAINT_JSON_SCHEMA, "boolean", -1);
    constraint_case(P, "\"guided_regex\": 3", 400, 0, NULL, -1);
    constraint_case(C, "\"response_format\": {\"type\": \"json_object\"}, \"guided_regex\": \"a\"", 400, 0, NULL, -1);
    constraint_case(P, "\"grammar\": \"root ::= x\", \"json_schema\": {}", 400, 0, NULL, -1);
    /* the Responses API's text.format shape */
    g4_oai_request r = {0};
    g4_oai_error err = {0};
    cJSON *fmt = cJSON_Parse("{\"type\": \"json_schema\", \"name\": \"n\", \"schema\": {\"enum\": [1]}, \"strict\": true}");
    CHECK(g4_oai_parse_format(fmt, 1, "text.format", &r, &err) == 0 && r.constraint.kind == G4_CONSTRAINT_JSON_SCHEMA &&
              !strcmp(r.constraint.text, "{\"enum\":[1]}") && !strcmp(r.constraint_param, "text.format"),
          "flat format: %s", err.message);
    CHECK(g4_oai_parse_format(fmt, 1, "text.format", &r, &err) == -1 && err.status == 400, "a second constraint");
    cJSON_Delete(fmt);
    g4_constraint_spec_free(&r.constraint);
}

int main(void) {
    check_json();
    check_constraints();
    check_messages();
    check_media();
    check_offsets();
    check_logit_bias();
    return test_finish();
}
