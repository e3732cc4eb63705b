/* Token masks and the matcher's modes: every mask equals, token by token,
 * what running the token's bytes through the grammar says (brute force,
 * including UTF-8 characters split across tokens and the real 262,144-token
 * vocabulary), stop tokens only where the grammar may end, the thought
 * channel and lazy tool calls left free, the budget that closes a text in
 * time, and the compile-time refusals. */
#include <stdint.h>

#include "constrain/constrain.h"
#include "constrain/token_mask.h"
#include "test_util.h"
#include "text/tokenizer.h"

enum { STOP = 0, DELIM = 1, CALL = 2, CALL_END = 3, THINK_OPEN = 4, THINK_CLOSE = 5 };

/* A small vocabulary: ids 0..5 are special (no bytes), the rest text, with
 * multi-byte characters whole and split ("é" = C3 A9, "中" = E4 B8 AD). */
static const char *const small_vocab[] = {
    "", "", "", "", "", "",
    "{", "}", "\"", "\"a", "a", "b", ":", ",", " ", "\xC3\xA9", "\xC3", "\xA9", "\xE4\xB8", "\xAD", "\xE4\xB8\xAD",
    "\"}", "1", "12", "-", "\\", "n", "\\n", "\"x\":", "x", "[", "]", "ab\"", "é\"", "\xA9\"", "true", "null",
    "call:", "f", "{x:", "\n",
};
#define SMALL_V ((int)(sizeof small_vocab / sizeof small_vocab[0]))

static g4_token_trie *small_trie(void) {
    size_t lens[SMALL_V];
    for (int i = 0; i < SMALL_V; i++) lens[i] = strlen(small_vocab[i]);
    g4_token_trie *t = NULL;
    CHECK(g4_token_trie_from_bytes(SMALL_V, small_vocab, lens, &t) == G4_OK, "%s", g4_error_message());
    return t;
}

static g4_grammar *compile(g4_constraint_kind kind, const char *text, g4_tool_mode mode) {
    g4_constraint_spec spec = {kind, (char *)text, mode};
    g4_constraint_tokens tk = {DELIM, CALL, CALL_END};
    g4_grammar *g = NULL;
    g4_status st = g4_constraint_compile(&spec, &tk, &g);
    CHECK(st == G4_OK, "compile %s: %s", text ? text : "", g4_error_message());
    return g;
}

/* mask == brute force over every token, from `state` */
static int mask_matches_brute_force(g4_grammar *g, const g4_token_trie *t, int32_t state) {
    int V = g4_token_trie_vocab(t), bad = 0;
    uint32_t *mask = malloc(g4_mask_words(V) * 4);
    CHECK(g4_token_mask_compute(g, t, state, mask) == G4_OK, "%s", g4_error_message());
    for (int id = 0; id < V && bad < 5; id++) {
        size_t n;
        const unsigned char *b = g4_token_trie_bytes(t, id, &n);
        int expect = n ? g4_grammar_run(g, state, b, n) >= 0 : g4_grammar_step_token(g, state, id) >= 0;
        if (expect != g4_mask_has(mask, id)) {
            bad++;
            fprintf(stderr, "token %d (%.*s): mask %d, bytes say %d\n", id, (int)n, (const char *)b,
                    g4_mask_has(mask, id), expect);
        }
    }
    free(mask);
    return bad == 0;
}

static void test_utf8_split(g4_token_trie *t) {
    g4_grammar *g = compile(G4_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"string\",\"maxLength\":3}", 0);
    int32_t s0 = g4_grammar_start(g);
    CHECK(mask_matches_brute_force(g, t, s0), "string start");
    int32_t s1 = g4_grammar_step(g, s0, '"');
    CHECK(mask_matches_brute_force(g, t, s1), "inside the string");
    int32_t lead = g4_grammar_run(g, s1, "\xC3", 1);
    CHECK(lead >= 0, "a lead byte may start a character");
    CHECK(mask_matches_brute_force(g, t, lead), "after a lead byte");
    uint32_t mask[g4_mask_words(SMALL_V)];
    g4_token_mask_compute(g, t, lead, mask);
    CHECK(g4_mask_has(mask, 17) && g4_mask_has(mask, 34), "the continuation byte (alone or with a quote) completes é");
    CHECK(!g4_mask_has(mask, 10) && !g4_mask_has(mask, 16) && !g4_mask_has(mask, 8), "no ASCII, lead or quote mid-character");
    g4_token_mask_compute(g, t, s1, mask);
    CHECK(!g4_mask_has(mask, 17) && !g4_mask_has(mask, 19), "a lone continuation byte cannot start a character");
    CHECK(g4_mask_has(mask, 18) && g4_mask_has(mask, 20) && g4_mask_has(mask, 16), "whole and split characters may start");
    /* 中 written as E4 B8 + AD, then the string closes */
    int32_t s = g4_grammar_run(g, s1, "\xE4\xB8", 2);
    CHECK(s >= 0 && !g4_grammar_accepts(g, s), "half a character");
    s = g4_grammar_run(g, s, "\xAD\"", 2);
    CHECK(g4_grammar_accepts(g, s), "\"中\" complete");
    /* maxLength counts characters, not bytes: three 3-byte characters fit, four do not */
    s = g4_grammar_run(g, s1, "\xE4\xB8\xAD\xE4\xB8\xAD\xE4\xB8\xAD", 9);
    CHECK(s >= 0 && g4_grammar_step(g, s, '"') >= 0 && g4_grammar_run(g, s, "\xC3\xA9", 2) < 0, "maxLength in characters");
    g4_grammar_free(g);
}

static void test_brute_force_walks(g4_token_trie *t) {
    const char *schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"array\",\"items\":{\"type\":[\"integer\",\"null\"]}}},"
        "\"required\":[\"x\"],\"additionalProperties\":false}",
        "{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"boolean\"},{\"enum\":[\"ab\",12]}]}",
    };
    uint64_t seed = 7;
    for (int k = 0; k < 2; k++) {
        g4_grammar *g = compile(G4_CONSTRAINT_JSON_SCHEMA, schemas[k], 0);
        for (int walk = 0; walk < 30; walk++) {
            int32_t s = g4_grammar_start(g);
            for (int step = 0; step < 12 && s >= 0; step++) {
                CHECK(mask_matches_brute_force(g, t, s), "schema %d walk %d step %d", k, walk, step);
                uint32_t mask[g4_mask_words(SMALL_V)];
                g4_token_mask_compute(g, t, s, mask);
                int allowed[SMALL_V], n = 0;
                for (int i = 0; i < SMALL_V; i++)
                    if (g4_mask_has(mask, i)) allowed[n++] = i;
                if (n == 0) break;
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                int id = allowed[(seed >> 33) % (uint64_t)n];
                size_t len;
                const unsigned char *b = g4_token_trie_bytes(t, id, &len);
                s = g4_grammar_run(g, s, b, len);
                CHECK(s >= 0, "a token of the mask is accepted");
            }
        }
        g4_grammar_free(g);
    }
}

static void test_matcher_modes(g4_token_trie *t) {
    int32_t stop = STOP;
    g4_token_matcher_options o = {.stop_ids = &stop, .n_stop = 1, .think = 1, .think_open = THINK_OPEN,
                                  .think_close = THINK_CLOSE};
    g4_grammar *g = compile(G4_CONSTRAINT_JSON_SCHEMA, "{\"enum\":[\"ab\"]}", 0);
    g4_token_matcher *m;
    CHECK(g4_token_matcher_create(g, t, &o, &m) == G4_OK, "%s", g4_error_message());
    const uint32_t *mask;
    CHECK(g4_token_matcher_mask(m, &mask) == 1, "constrained at the start");
    CHECK(g4_mask_has(mask, THINK_OPEN) && g4_mask_has(mask, 8) && !g4_mask_has(mask, STOP) && !g4_mask_has(mask, 10),
          "start: the quote or the thought channel; no stop, no text");
    CHECK(g4_token_matcher_accept(m, THINK_OPEN) == G4_OK, "open the thought channel");
    CHECK(g4_token_matcher_mask(m, &mask) == 0 && !g4_token_matcher_constrained(m), "thinking is free");
    CHECK(g4_token_matcher_accept(m, 10) == G4_OK && g4_token_matcher_accept(m, THINK_CLOSE) == G4_OK, "think and close");
    CHECK(g4_token_matcher_mask(m, &mask) == 1 && !g4_mask_has(mask, THINK_OPEN), "constrained after the thought");
    CHECK(g4_token_matcher_accept(m, 10) != G4_OK, "a refused token is an error");
    g4_error_clear();
    CHECK(g4_token_matcher_accept(m, 8) == G4_OK && g4_token_matcher_accept(m, 32) == G4_OK, "\" then ab\"");
    g4_token_matcher_free(m);
    g4_grammar_free(g);

    /* the quote first, then ab" completes; only then the stop token */
    g = compile(G4_CONSTRAINT_JSON_SCHEMA, "{\"enum\":[\"ab\"]}", 0);
    o.think = 0;
    CHECK(g4_token_matcher_create(g, t, &o, &m) == G4_OK, "%s", g4_error_message());
    CHECK(g4_token_matcher_accept(m, 8) == G4_OK && g4_token_matcher_accept(m, 32) == G4_OK, "\" + ab\"");
    CHECK(g4_token_matcher_mask(m, &mask) == 1, "still masked");
    int only_stop = g4_mask_has(mask, STOP);
    for (int i = 1; i < SMALL_V; i++) only_stop &= !g4_mask_has(mask, i);
    CHECK(only_stop && g4_token_matcher_can_end(m), "complete: the stop token and nothing else");
    g4_token_matcher_free(m);
    g4_grammar_free(g);

    /* lazy tool calls: free text until <|tool_call>, then the call's grammar, then free again */
    g = compile(G4_CONSTRAINT_TOOL_CALLS,
                "[{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\"}},"
                "\"required\":[\"x\"]}}]",
                G4_TOOLS_LAZY);
    g4_token_matcher_options lo = {.stop_ids = &stop, .n_stop = 1, .lazy = 1, .trigger = CALL};
    CHECK(g4_token_matcher_create(g, t, &lo, &m) == G4_OK, "%s", g4_error_message());
    CHECK(g4_token_matcher_mask(m, &mask) == 0, "free before a call");
    CHECK(g4_token_matcher_accept(m, 10) == G4_OK && g4_token_matcher_accept(m, CALL) == G4_OK, "text, then a call");
    CHECK(g4_token_matcher_mask(m, &mask) == 1 && g4_mask_has(mask, 37) && !g4_mask_has(mask, 10), "call: must follow");
    int seq[] = {37, 38, 39, DELIM, 10, DELIM, 7, CALL_END};
    for (int i = 0; i < 8; i++) CHECK(g4_token_matcher_accept(m, seq[i]) == G4_OK, "call token %d", i);
    CHECK(!g4_token_matcher_constrained(m) && g4_token_matcher_mask(m, &mask) == 0, "free again after the call");
    g4_token_matcher_free(m);
    g4_grammar_free(g);
}

static void test_budget(g4_token_trie *t) {
    int32_t stop = STOP;
    g4_grammar *g = compile(G4_CONSTRAINT_JSON_SCHEMA,
                            "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\"}},\"required\":[\"x\"],"
                            "\"additionalProperties\":false}",
                            0);
    g4_token_matcher_options o = {.stop_ids = &stop, .n_stop = 1};
    g4_token_matcher *m;
    CHECK(g4_token_matcher_create(g, t, &o, &m) == G4_OK, "%s", g4_error_message());
    int seq[] = {6, 28, 8, 10};
    for (int i = 0; i < 4; i++) CHECK(g4_token_matcher_accept(m, seq[i]) == G4_OK, "prefix token %d", i);
    const uint32_t *mask;
    g4_token_matcher_set_budget(m, 3); /* {"x":"a  then two tokens and the stop: "} fits, " then } fits */
    CHECK(g4_token_matcher_mask(m, &mask) == 1, "masked");
    CHECK(g4_mask_has(mask, 21) && g4_mask_has(mask, 8) && !g4_mask_has(mask, 10) && !g4_mask_has(mask, 15),
          "two tokens left: only what can still close the object");
    g4_token_matcher_set_budget(m, 2);
    g4_token_matcher_mask(m, &mask);
    CHECK(g4_mask_has(mask, 21) && !g4_mask_has(mask, 8), "one token left: \"} alone");
    g4_token_matcher_set_budget(m, 100);
    g4_token_matcher_mask(m, &mask);
    CHECK(g4_mask_has(mask, 10) && g4_mask_has(mask, 15), "plenty left: any string text");
    g4_token_matcher_free(m);
    g4_grammar_free(g);
}

static void test_refusals(void) {
    struct {
        g4_constraint_kind kind;
        const char *text, *expect;
    } cases[] = {
        {G4_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"integer\",\"multipleOf\":2}", "'multipleOf' at #/multipleOf"},
        {G4_CONSTRAINT_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{\"a b\":{\"not\":{}}}}", "#/properties/a b/not"},
        {G4_CONSTRAINT_JSON_SCHEMA, "{\"items\":[{}]}", "tuple items"},
        {G4_CONSTRAINT_GBNF, "root ::= a\na ::= a \"x\" | \"y\"", "left-recursive"},
        {G4_CONSTRAINT_GBNF, "root ::= (\"\")*", "left-recursive"},
        {G4_CONSTRAINT_REGEX, "a{5000}", "too large"},
        {G4_CONSTRAINT_REGEX, "(a", "missing ')'"},
        {G4_CONSTRAINT_CHOICE, "[]", "non-empty"},
        {G4_CONSTRAINT_TOOL_CALLS, "[{\"name\":\"bad name\"}]", "cannot be written"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        g4_constraint_spec spec = {cases[i].kind, (char *)cases[i].text, 0};
        g4_constraint_tokens tk = {DELIM, CALL, CALL_END};
        g4_grammar *g = NULL;
        g4_status st = g4_constraint_compile(&spec, &tk, &g);
        CHECK(st == G4_ERR_INVALID_ARGUMENT && strstr(g4_error_message(), cases[i].expect),
              "%s -> %s (want %s)", cases[i].text, g4_error_message(), cases[i].expect);
        g4_grammar_free(g);
        g4_error_clear();
    }
    /* ambiguity beyond the stack limit is an error at run time, not a hang */
    g4_constraint_spec spec = {G4_CONSTRAINT_GBNF, "root ::= \"a\" root | \"a\" root \"b\" | \"\"", 0};
    g4_grammar *g = NULL;
    CHECK(g4_constraint_compile(&spec, NULL, &g) == G4_OK, "%s", g4_error_message());
    if (g) {
        int32_t s = g4_grammar_start(g);
        for (int i = 0; i < 5000 && s >= 0; i++) s = g4_grammar_step(g, s, 'a');
        CHECK(s < 0 && g4_grammar_overflowed(g) && strstr(g4_error_message(), "parse stacks"), "%s", g4_error_message());
        g4_grammar_free(g);
    }
    g4_error_clear();
}

/* The real vocabulary: masks equal the brute force over all 262,144 tokens. */
static void test_real_vocabulary(void) {
    g4_tokenizer *tok = NULL;
    if (g4_tokenizer_load(test_fixture("tokenizer/tokenizer.json"), &tok) != G4_OK) {
        CHECK(0, "load the vendored tokenizer: %s", g4_error_message());
        return;
    }
    g4_token_trie *t = NULL;
    CHECK(g4_token_trie_build(tok, &t) == G4_OK, "%s", g4_error_message());
    CHECK(g4_token_trie_vocab(t) >= 262144, "vocab %d", g4_token_trie_vocab(t));
    size_t n;
    int byte_tokens = 0;
    for (int id = 0; id < g4_token_trie_vocab(t); id++)
        if (g4_tokenizer_token_byte(tok, id) >= 0) {
            g4_token_trie_bytes(t, id, &n);
            byte_tokens += n == 1;
        }
    CHECK(byte_tokens == 256, "the 256 byte-fallback tokens are one byte each (%d)", byte_tokens);
    g4_constraint_tokens tk = {g4_tokenizer_token_id(tok, "<|\"|>"), g4_tokenizer_token_id(tok, "<|tool_call>"),
                               g4_tokenizer_token_id(tok, "<tool_call|>")};
    g4_constraint_spec spec = {G4_CONSTRAINT_JSON_SCHEMA,
                               "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"n\":{\"type\":"
                               "\"number\"}},\"required\":[\"name\",\"n\"],\"additionalProperties\":false}",
                               0};
    g4_grammar *g = NULL;
    CHECK(g4_constraint_compile(&spec, &tk, &g) == G4_OK, "%s", g4_error_message());
    const char *prefixes[] = {"", "{", "{\"name\": \"", "{\"name\": \"caf\xC3", "{\"name\": \"x\", \"n\": -1",
                              "{\"name\": \"x\", \"n\": 2.5e"};
    for (int i = 0; i < 6 && g; i++) {
        int32_t s = g4_grammar_run(g, g4_grammar_start(g), prefixes[i], strlen(prefixes[i]));
        CHECK(s >= 0, "prefix %s", prefixes[i]);
        CHECK(mask_matches_brute_force(g, t, s), "real vocabulary after %s", prefixes[i]);
    }
    g4_grammar_free(g);
    g4_token_trie_free(t);
    g4_tokenizer_free(tok);
}

int main(void) {
    g4_token_trie *t = small_trie();
    if (t) {
        test_utf8_split(t);
        test_brute_force_walks(t);
        test_matcher_modes(t);
        test_budget(t);
        g4_token_trie_free(t);
    }
    test_refusals();
    test_real_vocabulary();
    return test_finish();
}
