/* lockstep — importer internals shared by the engine formats (import_*.c):
 * a JSON reader that keeps every number's text, and the sink that turns one
 * engine's per-position logprobs into trace records. Not public; the API is
 * trace/import.h and the mapping of each format is docs/import.md. */
#ifndef LS_TRACE_IMPORT_INTERNAL_H
#define LS_TRACE_IMPORT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "trace/import.h"
#include "trace/trace.h"

/* ---- JSON with exact number text (import_json.c) ------------------------------
 * jansson turns every number into a double before the caller sees it, and
 * rejects the NaN / Infinity / -Infinity tokens Python's json module writes
 * for non-finite floats. Logprobs must reach strtof from their own text (a
 * decimal rounded once, to fp32), so the engine formats are read with this
 * small parser: a value tree whose numbers keep the text as written.
 * Strictly JSON otherwise (RFC 8259 grammar, no trailing commas, no comments,
 * no raw control characters in strings), plus NaN, Infinity and -Infinity
 * (any letter case, and nan / inf / -inf) as number tokens. */
typedef enum ls_jv_type {
    LS_JV_NULL,
    LS_JV_BOOL,
    LS_JV_NUMBER,
    LS_JV_STRING,
    LS_JV_ARRAY,
    LS_JV_OBJECT
} ls_jv_type;

typedef struct ls_jv {
    uint8_t type;               /* ls_jv_type */
    uint8_t truth;              /* LS_JV_BOOL: 1 for true */
    uint8_t integer;            /* LS_JV_NUMBER: the text is an integer (no '.', no exponent) */
    uint32_t n;                 /* ARRAY: elements; OBJECT: members; NUMBER/STRING: bytes of s */
    uint64_t at;                /* byte offset of the value in the document */
    const char *s;              /* NUMBER: the text as written; STRING: decoded UTF-8 (not
                                   NUL-terminated; may hold NUL from \u0000) */
    const struct ls_jv *kids;   /* ARRAY: [n] elements; OBJECT: [2n] key (STRING), value pairs */
} ls_jv;

typedef struct ls_jparse ls_jparse;

/* A parser over data[0, len) (borrowed; must outlive the parser and every
 * value it returns). label names the document in messages. */
ls_status ls_jparse_new(const char *label, const char *data, size_t len, ls_jparse **out, ls_error *err);
/* The next top-level value of the document (a JSON text, or JSON Lines: values
 * separated by whitespace), or *out = NULL at the end. The value and its
 * children live until the next call. Errors name the byte offset and line. */
ls_status ls_jparse_next(ls_jparse *j, const ls_jv **out, ls_error *err);
void ls_jparse_free(ls_jparse *j);
/* Line (1-based) of a byte offset, for messages. */
uint64_t ls_jparse_line(const ls_jparse *j, uint64_t at);
const char *ls_jparse_label(const ls_jparse *j);

/* Length of a non-finite number word at p (NaN, Infinity, -Infinity, nan,
 * inf, -inf, any letter case, optional sign), or 0. */
size_t ls_json_nonfinite_len(const char *p, const char *end);

/* The member `key` of an object, or NULL (also when v is no object). */
const ls_jv *ls_jv_get(const ls_jv *v, const char *key);
/* 1 when v is a string equal to text. */
int ls_jv_str_is(const ls_jv *v, const char *text);
/* fp32 bits of a JSON number, or of a string holding a decimal, a C99 hex
 * float, inf / infinity / nan (any case, optional sign), converted with
 * strtof from the exact text: rounded once, never through double. Returns 0,
 * or -1 when v is neither (null included: callers decide what null means). */
int ls_jv_f32(const ls_jv *v, uint32_t *bits);
/* An integer number in [lo, hi] (no fraction, no exponent); 0 or -1. */
int ls_jv_int(const ls_jv *v, int64_t lo, int64_t hi, int64_t *out);
/* A token id: an integer, or a string "token_id:N" (vLLM's
 * return_tokens_as_token_ids), or with prefixed == 0 also "N" (a map key);
 * 0 or -1. With prefixed, "5" is refused: it is the text of a token. */
int ls_jv_token_id(const ls_jv *v, int prefixed, int32_t *out);

/* ---- the sink (import_sink.c) ----------------------------------------------------
 * Every format hands its sequences to the sink the same way:
 *
 *     ls_imp_seq_begin(im, &seq)        request id, prompt length, known token ids
 *     ls_imp_add(im, &pos)              one per logprob position, positions increasing
 *     ls_imp_seq_end(im)
 *
 * and is run twice over the same input: the first pass measures (sequences,
 * prompt lengths, the top-k width the file supports: the header needs them
 * before the first record), the second writes the records. */

/* One scored token of a position: its id, fp32 logprob bits and rank (1 = most
 * likely; 0 = unknown, the entry is then not placed in the top-k). */
typedef struct ls_imp_entry {
    int32_t id;
    uint32_t bits;
    int32_t rank;
} ls_imp_entry;

typedef struct ls_imp_seq {
    const char *request_id;     /* the engine's request id (bytes), or NULL */
    size_t request_id_len;
    int64_t choice;             /* choice / output index within the request, -1 if none */
    int64_t row;                /* batch row (tensor formats), -1 if none */
    int64_t prompt_len;         /* prompt tokens, -1 when the file does not say */
    const int32_t *prompt_ids;  /* [prompt_len] when known, else NULL */
    const int32_t *gen_ids;     /* [n_gen] generated tokens when known, else NULL */
    int64_t n_gen;              /* generated tokens (-1: count the positions added) */
} ls_imp_seq;

/* One logprob position: the token at absolute position tok_pos (>= 1) was
 * scored (or selected) from the distribution after reading 0..tok_pos-1; it
 * becomes the record at tok_pos - 1 (docs/trace-format.md, section 5). */
typedef struct ls_imp_pos {
    int64_t tok_pos;
    int32_t token;              /* the selected (generated or teacher-forced) token id */
    uint32_t logprob_bits;
    const ls_imp_entry *top;    /* [n_top], any order; ranks place them */
    int n_top;
    int64_t at;                 /* byte offset of the position's data in the input (messages), -1 */
} ls_imp_pos;

typedef struct ls_imp ls_imp;

ls_status ls_imp_seq_begin(ls_imp *im, const ls_imp_seq *s, ls_error *err);
ls_status ls_imp_add(ls_imp *im, const ls_imp_pos *p, ls_error *err);
ls_status ls_imp_seq_end(ls_imp *im, ls_error *err);
/* The input label (file name) for messages. */
const char *ls_imp_label(const ls_imp *im);
/* Records a note for run_params.import.notes (first pass only; deduplicated). */
void ls_imp_note(ls_imp *im, const char *note);
/* The options the import was started with. */
const ls_import_opts *ls_imp_opts(const ls_imp *im);

/* One format: walks the input and feeds the sink. Called twice (see above);
 * must do the same both times. */
typedef ls_status (*ls_imp_walk_fn)(ls_imp *im, void *ctx, ls_error *err);

/* Runs walk twice and writes the trace (import_sink.c). */
ls_status ls_imp_run(ls_import_format fmt, const char *label, ls_imp_walk_fn walk, void *ctx,
                     const ls_import_opts *o, const char *out_path, ls_import_summary *sum, ls_error *err);

/* The JSON formats' walkers (import_engines.c); ctx is the document. */
typedef struct ls_imp_text {
    const char *data;
    size_t len;
} ls_imp_text;
ls_status ls_imp_walk_vllm(ls_imp *im, void *ctx, ls_error *err);
ls_status ls_imp_walk_vllm_offline(ls_imp *im, void *ctx, ls_error *err);
ls_status ls_imp_walk_sglang(ls_imp *im, void *ctx, ls_error *err);

/* The verl importer over an opened safetensors file (import_verl.c). */
struct ls_safetensors;
ls_status ls_import_verl_st(const struct ls_safetensors *st, const char *label, const ls_import_opts *o,
                            const char *out_path, ls_import_summary *sum, ls_error *err);

#endif
