/* The embedding API of gemma4.h on the `dense` fixture with the tiny test
 * tokenizer: concurrent chat requests give exactly the tokens of the plain
 * greedy loop (g4_session) over the same prompt, the text is the decoded
 * reply, stop strings cut the text, cancellation and g4_close end requests
 * with a final event, bad input is refused with a message. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <regex.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gemma4.h"
#include "runtime/context.h"
#include "runtime/prompt.h"
#include "runtime/session.h"
#include "test_util.h"

#define N_REQ 6
#define MAX_NEW 8

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    int32_t tokens[256];
    int n_tokens;
    char text[4096];
    size_t len;
    int done, events;
    char finish[32];
    int prompt_tokens, completion_tokens, cached_tokens;
} collector;

static void collector_init(collector *c) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cv, NULL);
}

static void on_event(void *user, const g4_event *ev) {
    collector *c = user;
    pthread_mutex_lock(&c->lock);
    c->events++;
    if (ev->token >= 0 && c->n_tokens < 256) c->tokens[c->n_tokens++] = ev->token;
    if (ev->kind == G4_TEXT_CONTENT && c->len + ev->len < sizeof c->text) {
        memcpy(c->text + c->len, ev->text, ev->len);
        c->len += ev->len;
        c->text[c->len] = 0;
    }
    if (ev->done) {
        c->done = 1;
        snprintf(c->finish, sizeof c->finish, "%s", ev->finish_reason);
        c->prompt_tokens = ev->prompt_tokens;
        c->completion_tokens = ev->completion_tokens;
        c->cached_tokens = ev->cached_tokens;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->lock);
}

static void wait_done(collector *c) {
    pthread_mutex_lock(&c->lock);
    while (!c->done) pthread_cond_wait(&c->cv, &c->lock);
    pthread_mutex_unlock(&c->lock);
}

/* The fixture's weights with the tiny tokenizer, in a folder of links. */
static const char *make_model_dir(void) {
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s", test_tmp_path("public_api_model"));
    mkdir(dir, 0755);
    const char *files[] = {"config.json", "model.safetensors", "generation_config.json"};
    char src[1024], dst[1100];
    for (int i = 0; i < 3; i++) {
        snprintf(src, sizeof src, "%s/%s", test_fixture("dense"), files[i]);
        char *real = realpath(src, NULL);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        unlink(dst);
        if (!real || symlink(real, dst) != 0) fprintf(stderr, "cannot link %s\n", src);
        free(real);
    }
    const char *data = getenv("G4_TEST_DATA");
    snprintf(src, sizeof src, "%s/tiny_tokenizer/tokenizer.json", data ? data : "tests/data");
    char *real = realpath(src, NULL);
    snprintf(dst, sizeof dst, "%s/tokenizer.json", dir);
    unlink(dst);
    if (!real || symlink(real, dst) != 0) fprintf(stderr, "cannot link %s\n", src);
    free(real);
    return dir;
}

static void greedy_alone(const g4_model *m, const int32_t *prompt, int n, const int32_t *stop, int n_stop,
                         int32_t *out, int *n_out) {
    const int V = m->config.text.vocab_size;
    g4_session_options opt = {.n_ctx = n + MAX_NEW + 1};
    g4_session *s;
    float *logits = malloc((size_t)V * sizeof *logits);
    *n_out = 0;
    if (g4_session_create(m, &opt, &s) != G4_OK) return;
    g4_status st = g4_session_eval(s, prompt, n, NULL, G4_LOGITS_LAST, logits);
    while (st == G4_OK && *n_out < MAX_NEW) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        out[(*n_out)++] = best;
        int is_stop = 0;
        for (int k = 0; k < n_stop; k++) is_stop |= stop[k] == best;
        if (is_stop) break;
        int32_t next = best;
        st = g4_session_eval(s, &next, 1, NULL, G4_LOGITS_LAST, logits);
    }
    g4_session_destroy(s);
    free(logits);
}

int main(void) {
    const char *dir = make_model_dir();
    g4_handle *h;
    /* a float32 cache: the greedy loop it is compared with is the exact path's (bf16's rounding flips the
     * random fixture's greedy ids, test_kv_types.c) */
    g4_open_options oo = {.max_seqs = 4, .n_ctx = 256, .kv_type = "f32"};
    g4_open_options bad = {.kv_type = "fp4"};
    g4_handle *hb = NULL;
    CHECK(g4_open(make_model_dir(), &bad, &hb) == G4_ERR_INVALID_ARGUMENT && !hb &&
              strstr(g4_error_message(), "kv_type must be"),
          "kv_type \"fp4\" refused: %s", g4_error_message());
    g4_status st = g4_open(dir, &oo, &h);
    CHECK(st == G4_OK, "g4_open: %s", g4_error_message());
    if (st != G4_OK) return test_finish();
    g4_context *ref;
    st = g4_context_open(dir, NULL, &ref);
    CHECK(st == G4_OK, "context: %s", g4_error_message());
    if (st != G4_OK) return test_finish();

    /* N_REQ concurrent chats (more than max_seqs: some wait for room) */
    static const char *questions[N_REQ] = {"Why is the sky blue?", "Hello!", "Count from one to ten.",
                                           "Write a poem about the sea.", "What is bread?", "日本 and é"};
    collector c[N_REQ];
    char json[N_REQ][256];
    g4_params p;
    g4_params_default(&p);
    p.max_tokens = MAX_NEW;
    for (int i = 0; i < N_REQ; i++) {
        collector_init(&c[i]);
        snprintf(json[i], sizeof json[i], "[{\"role\": \"user\", \"content\": \"%s\"}]", questions[i]);
        uint64_t id;
        st = g4_submit_chat(h, json[i], NULL, &p, on_event, &c[i], &id);
        CHECK(st == G4_OK && id > 0, "submit %d: %s", i, g4_error_message());
    }
    for (int i = 0; i < N_REQ; i++) {
        wait_done(&c[i]);
        cJSON *messages = cJSON_Parse(json[i]);
        g4_prompt pr;
        g4_prompt_options po = {.chat = {.add_generation_prompt = 1}};
        st = g4_prompt_from_messages(ref, messages, NULL, &po, NULL, 0, &pr);
        cJSON_Delete(messages);
        CHECK(st == G4_OK, "prompt %d", i);
        if (st != G4_OK) continue;
        int32_t want[MAX_NEW];
        int n_want;
        greedy_alone(ref->model, pr.ids, pr.n_ids, ref->stop_ids, ref->n_stop, want, &n_want);
        CHECK(c[i].n_tokens == n_want && !memcmp(c[i].tokens, want, (size_t)n_want * sizeof *want),
              "request %d: %d tokens differ from the greedy loop's %d", i, c[i].n_tokens, n_want);
        CHECK(c[i].prompt_tokens == pr.n_ids, "request %d: prompt_tokens %d, want %d", i, c[i].prompt_tokens, pr.n_ids);
        CHECK(c[i].completion_tokens == n_want, "request %d: completion_tokens %d", i, c[i].completion_tokens);
        int stopped = 0;
        for (int k = 0; k < ref->n_stop; k++) stopped |= n_want && want[n_want - 1] == ref->stop_ids[k];
        CHECK(!strcmp(c[i].finish, stopped ? "stop" : n_want == MAX_NEW ? "length" : "stop"),
              "request %d: finish %s", i, c[i].finish);
        /* the text is the parsed reply of the decoded tokens (special
         * tokens left out, except the chat markers the parser reads) */
        static const char *const markers[] = {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|\"|>",
                                              "<turn|>", "<|tool_response>", "<eos>"};
        int32_t kept[MAX_NEW];
        int nk = 0;
        for (int k = 0; k < (stopped ? n_want - 1 : n_want); k++) {
            int keep = !g4_tokenizer_is_special(ref->tokenizer, want[k]);
            for (size_t m = 0; m < sizeof markers / sizeof *markers; m++)
                keep |= g4_tokenizer_token_id(ref->tokenizer, markers[m]) == want[k];
            if (keep) kept[nk++] = want[k];
        }
        char *raw = NULL;
        size_t raw_len;
        g4_tokenizer_decode(ref->tokenizer, kept, (size_t)nk, 0, &raw, &raw_len);
        g4_chat_reply reply;
        CHECK(g4_chat_parse_reply(raw, raw_len, 0, &reply) == G4_OK, "parse");
        CHECK(!strcmp(c[i].text, reply.content), "request %d: text [%s] want [%s]", i, c[i].text, reply.content);
        g4_chat_reply_free(&reply);
        free(raw);
        g4_prompt_free(ref, &pr);
    }

    /* stop strings: the text of a raw completion ends before the first match */
    collector whole, cut;
    collector_init(&whole);
    collector_init(&cut);
    CHECK(g4_submit_text(h, "The quick brown fox", &p, on_event, &whole, NULL) == G4_OK, "text: %s",
          g4_error_message());
    wait_done(&whole);
    CHECK(whole.len >= 4, "the completion has text (%zu bytes)", whole.len);
    if (whole.len >= 4) {
        char stop[3] = {whole.text[2], whole.text[3], 0};
        const char *stops[] = {stop};
        g4_params ps = p;
        ps.stop = stops;
        ps.n_stop = 1;
        CHECK(g4_submit_text(h, "The quick brown fox", &ps, on_event, &cut, NULL) == G4_OK, "text with stop");
        wait_done(&cut);
        const char *at = strstr(whole.text, stop);
        CHECK(at && cut.len == (size_t)(at - whole.text) && !strncmp(cut.text, whole.text, cut.len),
              "stop '%s': [%s] from [%s]", stop, cut.text, whole.text);
        CHECK(!strcmp(cut.finish, "stop"), "finish %s", cut.finish);
    }

    /* constrained decoding: the reply matches the regex (POSIX regexec is the reference), a bad schema fails */
    {
        collector rc;
        collector_init(&rc);
        g4_params pc = p;
        pc.temperature = 1.0f;
        pc.seed = 5;
        pc.max_tokens = 40;
        pc.regex = "[a-c]{2}-[0-9]{1,3}";
        CHECK(g4_submit_text(h, "The quick brown fox", &pc, on_event, &rc, NULL) == G4_OK, "regex: %s",
              g4_error_message());
        wait_done(&rc);
        regex_t re;
        regcomp(&re, "^[a-c]{2}-[0-9]{1,3}$", REG_EXTENDED | REG_NOSUB);
        CHECK(regexec(&re, rc.text, 0, NULL, 0) == 0, "constrained text [%s] matches", rc.text);
        regfree(&re);
        g4_params pb = p;
        pb.json_schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"not\":{}}}}";
        collector unused2;
        collector_init(&unused2);
        CHECK(g4_submit_chat(h, "[{\"role\": \"user\", \"content\": \"x\"}]", NULL, &pb, on_event, &unused2, NULL) ==
                      G4_ERR_INVALID_ARGUMENT &&
                  strstr(g4_error_message(), "'not' at #/properties/a/not"),
              "a schema outside the subset: %s", g4_error_message());
    }

    /* cancellation */
    collector long_run;
    collector_init(&long_run);
    g4_params pl = p;
    pl.max_tokens = 200;
    uint64_t id = 0;
    CHECK(g4_submit_text(h, "Hello", &pl, on_event, &long_run, &id) == G4_OK, "long");
    g4_cancel(h, id);
    wait_done(&long_run);
    CHECK(!strcmp(long_run.finish, "cancelled") && long_run.completion_tokens < 200, "cancel: %s after %d tokens",
          long_run.finish, long_run.completion_tokens);

    /* refusals */
    collector unused;
    collector_init(&unused);
    /* the same long prompt twice: the second reuses the first's KV (the
     * engine's prefix cache), down to the last full block before its end */
    {
        const char *lng = "[{\"role\": \"user\", \"content\": \"In the beginning God created the heaven and the "
                          "earth. And the earth was without form, and void; and darkness was upon the face of the "
                          "deep. And the Spirit of God moved upon the face of the waters.\"}]";
        collector a, b;
        collector_init(&a);
        collector_init(&b);
        CHECK(g4_submit_chat(h, lng, NULL, &p, on_event, &a, NULL) == G4_OK, "long prompt: %s", g4_error_message());
        wait_done(&a);
        CHECK(g4_submit_chat(h, lng, NULL, &p, on_event, &b, NULL) == G4_OK, "long prompt again: %s",
              g4_error_message());
        wait_done(&b);
        CHECK(a.cached_tokens == 0 && a.prompt_tokens > 32, "first long prompt: %d of %d cached", a.cached_tokens,
              a.prompt_tokens);
        CHECK(b.cached_tokens == (b.prompt_tokens - 1) / 16 * 16, "again: cached_tokens %d of %d", b.cached_tokens,
              b.prompt_tokens);
        CHECK(b.n_tokens == a.n_tokens && !memcmp(a.tokens, b.tokens, (size_t)a.n_tokens * sizeof *a.tokens),
              "the reused prefix gives the same reply");
    }
    CHECK(g4_submit_chat(h, "{not json", NULL, &p, on_event, &unused, NULL) == G4_ERR_INVALID_ARGUMENT,
          "bad JSON is refused");
    CHECK(strstr(g4_error_message(), "messages") != NULL, "message: %s", g4_error_message());
    /* an escaped NUL would cut the text (cJSON strings end there): refused, never shortened */
    CHECK(g4_submit_chat(h, "[{\"role\": \"user\", \"content\": \"Hi\\u0000 and more\"}]", NULL, &p, on_event,
                         &unused, NULL) == G4_ERR_INVALID_ARGUMENT &&
              strstr(g4_error_message(), "NUL"),
          "escaped NUL: %s", g4_error_message());
    CHECK(g4_submit_chat(h, "[{\"role\": \"wizard\", \"content\": \"Hi\"}]", NULL, &p, on_event, &unused, NULL) ==
                  G4_ERR_INVALID_ARGUMENT &&
              strstr(g4_error_message(), "messages[0].role"),
          "unknown role: %s", g4_error_message());
    g4_params big = p;
    big.max_tokens = 100000;
    CHECK(g4_submit_text(h, "Hello", &big, on_event, &unused, NULL) == G4_ERR_LIMIT, "too long for the context");
    CHECK(g4_submit_chat(h, "[{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": "
                            "{\"url\": \"data:image/png;base64,!!!\"}}]}]",
                         NULL, &p, on_event, &unused, NULL) == G4_ERR_INVALID_ARGUMENT,
          "invalid base64 image");
    g4_handle *none;
    CHECK(g4_open("/nonexistent/model", NULL, &none) != G4_OK && none == NULL, "missing model");

    /* close with a request in flight: its final event comes first */
    collector pending;
    collector_init(&pending);
    CHECK(g4_submit_text(h, "Hello", &pl, on_event, &pending, NULL) == G4_OK, "pending");
    g4_close(h);
    CHECK(pending.done, "g4_close ended the request (%s)", pending.finish);
    CHECK(unused.events == 0, "refused requests get no events");
    g4_context_close(ref);
    return test_finish();
}
