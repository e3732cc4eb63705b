/* The internal path's values, in plain C types, for tests that include
 * only gemma4.h (test_public_sequence): a fixture's references and what
 * g4_session gives on its model, and the Hugging Face tokenizer corpus. */
#ifndef G4_TEST_INTERNAL_REFERENCE_H
#define G4_TEST_INTERNAL_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

typedef struct ref_fixture ref_fixture;

/* The fixture folder `dir` (ref.json, ref.safetensors) and its model on
 * the CPU's exact path (f32 KV), as g4_context_open loads it. NULL on failure. */
ref_fixture *ref_fixture_open(const char *dir);
void ref_fixture_close(ref_fixture *f);
int ref_fixture_vocab(const ref_fixture *f);
int ref_fixture_hidden_size(const ref_fixture *f);
int ref_fixture_n_layers(const ref_fixture *f);
int ref_fixture_max_position(const ref_fixture *f);
int32_t ref_fixture_bos(const ref_fixture *f);
/* ids of ref.json at section.key (malloc'd), NULL if absent */
int32_t *ref_fixture_ids(const ref_fixture *f, const char *section, const char *key, int *n);
/* a float32 tensor of ref.safetensors, NULL if absent; element count in *n */
const float *ref_fixture_tensor(const ref_fixture *f, const char *name, size_t *n);

/* g4_session (n_ctx = n + 1): the logits of ids[0..n), every row of one
 * prefill (decode = 0) or one id at a time (decode = 1) [n][vocab]; with
 * final_norm not NULL also the hook's "final_norm" rows [n][hidden]
 * (prefill). 0 on success. */
int ref_session_logits(const ref_fixture *f, const int32_t *ids, int n, int decode, float *logits, float *final_norm);
/* ids[0..n) prefilled, g4_session_truncate to k, ids[k..n) prefilled
 * again: the second prefill's rows [n - k][vocab]. 0 on success. */
int ref_session_truncated(const ref_fixture *f, const int32_t *ids, int n, int k, float *logits);

/* The processor-expanded ids[0..n) with one image (the file's bytes, the
 * model's default soft tokens) through g4_prompt_from_ids and one
 * g4_session prefill: every row's logits [n][vocab]. 0 on success. */
int ref_session_image_logits(const ref_fixture *f, const int32_t *ids, int n, const void *image, size_t size,
                             float *logits);

/* The "text" records of a tokenizer corpus (tests/tools/make_tokenizer_corpus.py). */
typedef struct {
    char *text;
    size_t len;
    int32_t *ids, *ids_special, *ids_plain;
    size_t n_ids, n_special, n_plain;
    char *decoded, *decoded_skip; /* decode(ids) with and without special tokens */
    size_t decoded_len, decoded_skip_len;
} ref_tokenizer_case;

/* All text records of the .jsonl (malloc'd array, count in *n); NULL on failure. */
ref_tokenizer_case *ref_tokenizer_cases(const char *jsonl, int *n);
void ref_tokenizer_cases_free(ref_tokenizer_case *c, int n);

#endif
