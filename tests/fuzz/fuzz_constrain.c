/* libFuzzer target: the constraint compilers (JSON Schema, GBNF, regex,
 * choices, tool calls) on arbitrary text, then the automaton and token masks
 * on what compiles. The first byte picks the front end. A compiled grammar
 * must run: stepping bytes, masks over a small vocabulary equal to running
 * each token's bytes, no crash, leak or unbounded time (the state limits). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/constrain.h"
#include "constrain/token_mask.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const vocab[] = {"", "", "", "{", "}", "\"", "a", "\"a\"", ":", ",", "[", "]", "0", "12", "-",
                                    ".", "e", "\\", "n", " ", "\n", "true", "null", "\xC3", "\xA9", "\xE4\xB8\xAD",
                                    "x", "<", "|", "call:", "f"};
#define V ((int)(sizeof vocab / sizeof vocab[0]))

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static g4_token_trie *trie;
    if (!trie) {
        size_t lens[V];
        for (int i = 0; i < V; i++) lens[i] = strlen(vocab[i]);
        if (g4_token_trie_from_bytes(V, vocab, lens, &trie) != G4_OK) __builtin_trap();
    }
    if (size < 1 || size > 4096) return 0;
    static const g4_constraint_kind kinds[] = {G4_CONSTRAINT_JSON_SCHEMA, G4_CONSTRAINT_GBNF, G4_CONSTRAINT_REGEX,
                                               G4_CONSTRAINT_CHOICE, G4_CONSTRAINT_TOOL_CALLS};
    char *text = malloc(size);
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    g4_constraint_spec spec = {kinds[data[0] % 5], text, (g4_tool_mode)((data[0] / 5) % 3)};
    g4_constraint_tokens tk = {0, 1, 2};
    g4_grammar *g = NULL;
    if (g4_constraint_compile(&spec, &tk, &g) == G4_OK) {
        int32_t s = g4_grammar_start(g);
        uint32_t mask[(V + 31) / 32];
        for (size_t i = 0; i < size && s >= 0 && i < 64; i++) {
            if (g4_token_mask_compute(g, trie, s, mask) != G4_OK) break;
            for (int id = 3; id < V; id++) {
                int32_t to = g4_grammar_run(g, s, vocab[id], strlen(vocab[id]));
                if (g4_grammar_overflowed(g)) break;
                if ((to >= 0) != g4_mask_has(mask, id)) __builtin_trap();
            }
            if (g4_grammar_overflowed(g)) break;
            s = g4_grammar_step(g, s, data[i]);
        }
        g4_grammar_free(g);
    } else if (g) {
        __builtin_trap();
    }
    free(text);
    return 0;
}
