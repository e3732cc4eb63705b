#include "text/reply_decode.h"

#include <stdlib.h>
#include <string.h>

static const char *const structural[] = {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|\"|>",
                                         "<turn|>", "<eos>", "<|tool_response>", "<tool_response|>"};

g4_status g4_decode_reply(const g4_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len) {
    int32_t keep_ids[sizeof structural / sizeof structural[0]];
    size_t n_keep = 0;
    for (size_t k = 0; k < sizeof structural / sizeof structural[0]; k++) {
        int32_t id = g4_tokenizer_token_id(t, structural[k]);
        if (id >= 0) keep_ids[n_keep++] = id;
    }
    int32_t *kept = malloc((n ? n : 1) * sizeof *kept);
    if (!kept) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int structural_id = 0;
        for (size_t k = 0; k < n_keep; k++) structural_id |= ids[i] == keep_ids[k];
        if (structural_id || ids[i] < 0 || ids[i] >= g4_tokenizer_vocab_size(t) || !g4_tokenizer_is_special(t, ids[i]))
            kept[m++] = ids[i];
    }
    g4_status st = g4_tokenizer_decode(t, kept, m, 0, text, len);
    free(kept);
    return st;
}
