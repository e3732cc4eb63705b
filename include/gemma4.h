/* gemma4.c — public C API.
 *
 * Opaque handles, status codes and per-thread error messages. Every function
 * that can fail returns a g4_status; on failure g4_error_message() says why. */
#ifndef GEMMA4_H
#define GEMMA4_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum g4_status {
    G4_OK = 0,
    G4_ERR_INVALID_ARGUMENT, /* the caller passed something unusable */
    G4_ERR_IO,               /* a file could not be opened/read/written */
    G4_ERR_FORMAT,           /* a file or request is malformed */
    G4_ERR_UNSUPPORTED,      /* well-formed but not supported */
    G4_ERR_OUT_OF_MEMORY,
    G4_ERR_NOT_FOUND,        /* a named thing (tensor, file, token) is absent */
    G4_ERR_CANCELLED,        /* stopped on request */
    G4_ERR_LIMIT,            /* a size limit (context, tokens, bytes) was hit */
    G4_ERR_INTERNAL,
    G4_ERR_PERMISSION,       /* refused: e.g. a media file outside the allowed folder */
} g4_status;

/* The message of the last failure on this thread ("" if none). */
const char *g4_error_message(void);
const char *g4_status_name(g4_status s);

/* ---- Embedding the engine ------------------------------------------------
 *
 * One opened model serves any number of concurrent requests through one
 * batched engine: every decode step is a single forward pass over all
 * running requests, new prompts join between steps, and a shared KV cache
 * pool admits requests while it has room (the rest wait in a queue).
 *
 *   g4_handle *h;
 *   g4_open("path/to/gemma-4-E2B-it", NULL, &h);
 *   g4_params p;
 *   g4_params_default(&p);
 *   p.max_tokens = 200;
 *   g4_submit_chat(h, "[{\"role\": \"user\", \"content\": \"Hi!\"}]", NULL, &p, on_event, state, &id);
 *   ... on_event receives the reply piece by piece; ev->done marks the end ...
 *   g4_close(h);
 *
 * Callbacks run on the engine's thread, one request's events in order:
 * keep them short (copy the text, signal another thread). Never call
 * g4_close from a callback. */

typedef struct g4_handle g4_handle;

typedef struct {
    const char *device; /* "cpu", "cuda", or NULL: cuda when present, else cpu */
    int threads;        /* CPU threads (0: all cores) */
    int max_seqs;       /* requests decoded together (0: 32) */
    int n_ctx;          /* positions per request, prompt included (0: min(model, 4096)) */
    int max_queue;      /* requests waiting for room before submit fails with G4_ERR_LIMIT (0: 256) */
    int exact;          /* 1: float32-accurate products (verification); 0: the measured fast default */
    const char *kv_type; /* KV cache element type: "f32", "bf16", "fp8", or NULL / "auto": bf16 (f32 with exact) */
    int sequences_only;  /* 1: no batched engine (g4_submit_* fail); for g4_sequence use, tokenizer optional */
    /* Speculative decoding: an MTP drafter (gemma4_assistant) folder, a
     * pulled ORG/NAME, or "auto" (the <model>-assistant beside the model);
     * NULL: none. Greedy replies are the ids of plain decoding; sampled ones
     * keep the sampler's distribution. Constrained requests never draft. */
    const char *draft;
    int draft_max;      /* drafts a round at most, 1..G4_MAX_DRAFTS (0: 1); fewer while a request's acceptance is low */
    float draft_min_p;  /* a round stops drafting at a draft the drafter gives less than this (0: off) */
    int draft_max_batch; /* draft only while at most this many requests decode (0: 2 on the CPU, 4 on CUDA) */
} g4_open_options;

/* The most drafts a round (g4_open_options.draft_max). */
#define G4_MAX_DRAFTS 16

/* `model`: a model folder (config.json, weights, tokenizer.json) or an
 * ORG/NAME already in the Hugging Face cache. opt may be NULL. */
g4_status g4_open(const char *model, const g4_open_options *opt, g4_handle **out);
/* Cancels what still runs (each request gets its final event first) and
 * frees everything. */
void g4_close(g4_handle *h);
/* The folder of the drafter the handle opened (g4_open_options.draft
 * resolved: "auto" and ORG/NAME become paths), or NULL without one. */
const char *g4_draft_dir(const g4_handle *h);

typedef struct {
    int max_tokens;           /* 0: up to the end of the context */
    float temperature;        /* 0: greedy */
    int top_k;                /* 0: off */
    float top_p;              /* 1: off */
    float min_p;              /* 0: off */
    float repetition_penalty; /* 1: off */
    float presence_penalty, frequency_penalty; /* 0: off */
    uint64_t seed;
    int enable_thinking;      /* chat: the template's thinking mode; reasoning comes as G4_TEXT_REASONING */
    const char *const *stop;  /* stop strings (copied); the text ends before the first match */
    int n_stop;
    /* Constrained decoding, at most one (NULL: free text): the reply is JSON
     * valid against json_schema (JSON Schema text, the subset in the README,
     * "Constrained decoding"; "{}" or "{\"type\":\"object\"}" for any
     * object), follows the GBNF `grammar`, or fully matches `regex`. A
     * schema outside the subset makes the submit fail naming the keyword
     * and its JSON pointer. */
    const char *json_schema;
    const char *grammar;
    const char *regex;
    int json_object;    /* 1: the reply is a JSON object, any (OpenAI's response_format json_object) */
    int no_speculative; /* 1: this request never drafts (on a handle opened with a drafter) */
    /* tokens never chosen (copied; g4_params_model_default: generation_config's suppress_tokens, owned by the handle) */
    const int32_t *suppress;
    int n_suppress;
} g4_params;

/* Greedy, no stop strings, no limit but the context. */
void g4_params_default(g4_params *p);
/* The model's generation_config.json sampling (as transformers' generate). */
void g4_params_model_default(const g4_handle *h, g4_params *p);

typedef enum { G4_TEXT_CONTENT = 0, G4_TEXT_REASONING = 1 } g4_text_kind;

typedef struct {
    uint64_t request_id;
    const char *text;   /* new text, NUL-terminated, valid during the callback ("" if none) */
    size_t len;
    g4_text_kind kind;  /* the answer or the thought channel */
    int32_t token;      /* the generated token this event comes with (-1: none) */
    int done;           /* the last event of the request */
    const char *finish_reason; /* with done: "stop", "length", "tool_calls", "cancelled" or "error" */
    const char *error;         /* with "error": what went wrong */
    const char *tool_calls;    /* with done: JSON array [{"name": ..., "arguments": {...}}], or NULL */
    int prompt_tokens, completion_tokens;
    int cached_tokens;  /* prompt tokens whose KV the engine's prefix cache supplied */
    /* speculative decoding so far: drafts proposed, kept, and verification rounds */
    int draft_tokens, accepted_tokens, draft_rounds;
} g4_event;

typedef void (*g4_event_callback)(void *user, const g4_event *ev);

/* A conversation in the OpenAI chat shape (JSON text of the messages array;
 * image_url parts as data: URIs and input_audio parts as base64), rendered
 * with the model's chat template. tools_json: a JSON array of OpenAI tool
 * definitions, or NULL. Fails with G4_ERR_LIMIT when the queue is full or
 * the prompt does not fit the context. */
g4_status g4_submit_chat(g4_handle *h, const char *messages_json, const char *tools_json, const g4_params *p,
                         g4_event_callback cb, void *user, uint64_t *request_id);
/* Raw text continued as is (a <bos> is put first). */
g4_status g4_submit_text(g4_handle *h, const char *prompt, const g4_params *p, g4_event_callback cb, void *user,
                         uint64_t *request_id);
/* The request ends soon with finish_reason "cancelled" (if it has not ended). */
void g4_cancel(g4_handle *h, uint64_t request_id);

/* ---- Synchronous use: tokens, model facts, sequences ---------------------
 *
 * What a program that drives the model itself needs (the gemma4 commands
 * tokenize, logits, perplexity and info use these): the tokenizer, the
 * model's sizes, and sequences that run ids through the model on the
 * calling thread and hand back float32 logits. A g4_sequence has its own
 * KV cache beside the handle's engine; open the handle with
 * sequences_only = 1 when no requests will be submitted. */

/* Frees what the functions below allocate (ids, text). */
void g4_free(void *p);

typedef struct g4_tokenizer g4_tokenizer;

typedef enum {
    G4_TOKENIZE_ADD_SPECIAL = 1, /* add the post-processor's tokens (Gemma: <bos>) */
    G4_TOKENIZE_PLAIN_TEXT = 2,  /* special tokens written in the text are plain text */
} g4_tokenize_flags;

/* A tokenizer.json, or a folder holding one, alone (no model). */
g4_status g4_tokenizer_open(const char *path, g4_tokenizer **out);
void g4_tokenizer_close(g4_tokenizer *t);
/* The opened model's tokenizer (NULL when its folder has no tokenizer.json;
 * owned by the handle). */
const g4_tokenizer *g4_model_tokenizer(const g4_handle *h);
/* text[0..len) -> *ids[0..*n) (g4_free them); flags: g4_tokenize_flags. */
g4_status g4_tokenize(const g4_tokenizer *t, const char *text, size_t len, int flags, int32_t **ids, size_t *n);
/* ids -> UTF-8 *text[0..*len), NUL-terminated (g4_free it); skip_special:
 * leave out control tokens such as <bos>. */
g4_status g4_detokenize(const g4_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **text,
                        size_t *len);

/* Streaming detokenizer: push ids one at a time and get back the text they
 * complete. The concatenated output equals g4_detokenize of all ids, and
 * every returned piece is valid UTF-8 (bytes of a character split across
 * tokens are held until it is whole, or until flush). */
typedef struct g4_detokenizer g4_detokenizer;

g4_status g4_detokenizer_new(const g4_tokenizer *t, int skip_special, g4_detokenizer **out);
/* *text (not NUL-terminated, *len bytes) stays valid until the next call. */
g4_status g4_detokenizer_push(g4_detokenizer *d, int32_t id, const char **text, size_t *len);
/* Emits whatever is held; the detokenizer may then be reused from scratch. */
g4_status g4_detokenizer_flush(g4_detokenizer *d, const char **text, size_t *len);
void g4_detokenizer_free(g4_detokenizer *d);

typedef struct {
    int vocab_size;   /* logit row width */
    int hidden_size;  /* width of the hidden states */
    int n_layers;
    int max_position; /* max_position_embeddings */
    int32_t bos_id, pad_id;
    int n_eos;        /* config.json's eos_token_id(s) */
    int32_t eos_ids[8];
} g4_model_info;

void g4_get_model_info(const g4_handle *h, g4_model_info *out);
/* The model's summary as `gemma4 info` prints it (g4_free it; NULL when out of memory). */
char *g4_model_summary(const g4_handle *h);

typedef struct g4_sequence g4_sequence;

/* How image tokens attend to each other on models whose config asks for
 * bidirectional vision attention (use_bidirectional_attention = "vision"). */
typedef enum {
    G4_VISION_MASK_DEFAULT = 0, /* the model family's rule (gemma4: sliding layers, windowed) */
    G4_VISION_MASK_CAUSAL,      /* plain causal, as models without the flag */
    G4_VISION_MASK_ALL_LAYERS,  /* the image block bidirectional on every layer, not windowed
                                   (transformers 5.17's plain forward for the 12B) */
} g4_vision_mask;

/* "default", "all-layers" or "causal" (NULL: default) -> *out. Anything
 * else fails with G4_ERR_INVALID_ARGUMENT and the message "<what> must be
 * default, all-layers or causal, got '<name>'" (what: how the caller names
 * the value, e.g. "--vision-mask"; NULL: "vision_mask"). */
g4_status g4_vision_mask_parse(const char *name, const char *what, g4_vision_mask *out);

typedef struct {
    int n_ctx;               /* positions (0: min(model, 4096)) */
    const char *vision_mask; /* a g4_vision_mask_parse name; NULL: default */
} g4_sequence_options;

/* Which rows of the appended ids get logits (host float32 [rows][vocab_size]). */
typedef enum { G4_ROWS_NONE = 0, G4_ROWS_LAST, G4_ROWS_ALL } g4_rows;

/* An image or audio clip for g4_sequence_append_media: the file's bytes. */
typedef struct {
    int audio;               /* 0: image (PNG, JPEG, ...), 1: audio (WAV, ...) */
    const void *data;
    size_t size;
    const char *label;       /* names it in errors (e.g. the path) */
    int max_soft_tokens;     /* images: soft tokens (0: the model's default) */
} g4_media_file;

/* Called for each residual-stream capture point of every appended chunk
 * ("embed", "layer0", "last_prenorm", "final_norm"; rows x dim): return a
 * host buffer of rows * dim floats to receive them, or NULL to skip. */
typedef float *(*g4_hidden_sink)(void *user, const char *name, int rows, int dim);

/* opt may be NULL. The KV cache's type is the handle's (kv_type). */
g4_status g4_sequence_open(g4_handle *h, const g4_sequence_options *opt, g4_sequence **out);
void g4_sequence_close(g4_sequence *s);
int g4_sequence_length(const g4_sequence *s);
/* Runs ids[0..n) after what the sequence holds (prompts in chunks);
 * logits: the rows asked for (may be NULL with G4_ROWS_NONE). */
g4_status g4_sequence_append(g4_sequence *s, const int32_t *ids, int n, g4_rows rows, float *logits);
/* The same with ids already expanded by a processor (<|image|> x soft
 * tokens inside <|image>...<image|>, audio likewise): the media are encoded
 * and their soft tokens placed at the placeholders, in order. */
g4_status g4_sequence_append_media(g4_sequence *s, const int32_t *ids, int n, const g4_media_file *media,
                                   int n_media, g4_rows rows, float *logits);
/* Residual streams of what is appended next go to `sink` (NULL: none). */
void g4_sequence_set_hidden_sink(g4_sequence *s, g4_hidden_sink sink, void *user);
/* Forgets the positions from `length` on (0: all). Fails when the sliding
 * layers no longer hold the window before `length` or it cuts an image. */
g4_status g4_sequence_truncate(g4_sequence *s, int length);

/* ---- Generating on a sequence (synchronous) ------------------------------
 *
 * What `gemma4 run`, `chat` and `generate` use: a prompt built once (a chat
 * rendered with the model's template, raw text, or ids), then replies
 * generated on the calling thread into a g4_sequence, token by token to a
 * callback. A chat keeps its sequence between turns: each turn's prompt is
 * the whole conversation again, and only what the sequence does not hold
 * yet is evaluated. */

/* A prompt: token ids with every media placeholder expanded as
 * transformers' processor does, and the media encoded. */
typedef struct g4_input g4_input;

/* messages_json: the OpenAI chat shape, as g4_submit_chat; an {"type":
 * "image"} / {"type": "audio"} part without data takes the next of
 * media[0..n_media) of its kind, in order. enable_thinking: the template's
 * thinking mode. tools_json may be NULL. */
g4_status g4_input_chat(g4_handle *h, const char *messages_json, const char *tools_json, int enable_thinking,
                        const g4_media_file *media, int n_media, g4_input **out);
/* Raw text tokenized as is, special token strings recognised, nothing
 * added (write the <bos> yourself); each "<|image|>" / "<|audio|>" in it
 * takes the next of media[0..n_media) of its kind. */
g4_status g4_input_text(g4_handle *h, const char *text, size_t len, const g4_media_file *media, int n_media,
                        g4_input **out);
/* Ids already expanded, as g4_sequence_append_media takes them (no tokenizer needed). */
g4_status g4_input_ids(g4_handle *h, const int32_t *ids, int n, const g4_media_file *media, int n_media,
                       g4_input **out);
typedef struct {
    const int32_t *ids;       /* owned by the input */
    int n_ids;
    int starts_in_reasoning;  /* the reply begins inside a thought block (a chat rendered with thinking) */
    int audio_truncated;      /* an audio clip was cut to 30 s */
} g4_input_info;
void g4_input_get_info(const g4_input *in, g4_input_info *out);
void g4_input_free(g4_input *in);

/* Called with each chosen token in order (stop tokens are not reported);
 * return nonzero to end the reply after it. */
typedef int (*g4_reply_token_fn)(void *user, int32_t token);

typedef struct {
    /* sampling, max_tokens (0: up to the context's end), the constraint,
     * no_speculative; enable_thinking and the stop strings are not read
     * here (the input says whether the template opened a thought; the text
     * is the caller's to match) */
    g4_params params;
    /* the tokens that end the reply; NULL: the model's (generation_config's
     * eos and the chat template's end of turn). With a non-NULL stop_ids
     * and n_stop 0 only max_tokens, the context and the callback end it. */
    const int32_t *stop_ids;
    int n_stop;
} g4_generate_options;

/* Speculative decoding's counts over one reply. */
typedef struct {
    long rounds;                       /* target verification passes */
    long drafted, accepted;            /* drafts proposed and kept */
    long drafted_at[G4_MAX_DRAFTS];    /* drafts proposed at position i of a round */
    long accepted_at[G4_MAX_DRAFTS];   /* of them kept */
    double draft_seconds, verify_seconds;
} g4_draft_stats;

typedef struct {
    int n_prompt;           /* input ids evaluated (those the sequence did not hold) */
    int n_generated;        /* tokens reported to the callback */
    int hit_stop;           /* ended at a stop token, or the constraint was complete */
    int stopped;            /* the callback ended it */
    double prefill_seconds; /* evaluating the input up to the first token */
    double decode_seconds;  /* the rest */
    int drafted;            /* speculative decoding ran (draft_max drafts a round, `draft` its counts) */
    int draft_max;
    g4_draft_stats draft;
} g4_generate_result;

/* Makes the sequence hold `in` followed by a reply. Of what the sequence
 * holds, the longest prefix that the input repeats and that can be resumed
 * is kept (at least one input id is evaluated; never inside an image; the
 * sliding layers' window still held), the rest is forgotten; the remaining
 * input is evaluated, then tokens are chosen with o->params until a stop
 * token, max_tokens, the sequence's context, the constraint's end or the
 * callback. The handle's drafter (g4_open_options.draft, draft_max) drafts
 * unless params.no_speculative or a constraint is given: greedy replies are
 * the ids of plain decoding, sampled ones keep the sampler's distribution.
 * r may be NULL. */
g4_status g4_sequence_generate(g4_sequence *s, const g4_input *in, const g4_generate_options *o,
                               g4_reply_token_fn cb, void *user, g4_generate_result *r);

/* The answer of a chat reply's ids (as the callback got them, for the
 * next turn's assistant message): the thought channel and tool-call
 * markup left out. *content is NUL-terminated (g4_free it). */
g4_status g4_reply_content(const g4_handle *h, const int32_t *ids, size_t n, int starts_in_reasoning,
                           char **content);

#ifdef __cplusplus
}
#endif
#endif
