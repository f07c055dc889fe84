/* lockstep — importer of verl / Megatron-style rollout tensors saved as
 * safetensors (read through io/checkpoint.h, which validates the file):
 *
 *   rollout_log_probs  F32 [B, R]    log p of each response token, padded with -1
 *                                    (or old_log_probs, the trainer's recompute;
 *                                    BF16/F16 widen to fp32 exactly)
 *   responses          int [B, R]    response token ids, padded
 *   input_ids          int [B, P+R]  left-padded prompts, then the responses
 *   attention_mask     int [B, P+R]  1 on real tokens (left padding and the
 *                                    response's tail are 0)
 *   response_mask      int [B, R]    optional; preferred to attention_mask[:, P:]
 *   prompts            int [B, P]    optional; else input_ids[:, :P]
 *
 * Padding is found from the masks, never from the -1 fill (a logprob may be
 * exactly -1). Row b is sequence b: its prompt is the last plen_b of the P
 * prompt columns, its response the first rlen_b of the R response columns, and
 * response token t becomes the record at position plen_b + t - 1. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "trace/import_internal.h"

typedef struct verl_ctx {
    const ls_safetensors *st;
    const char *label;
    const char *lp_key;
    const ls_tensor *lp, *responses, *input_ids, *prompts, *amask, *rmask;
    int64_t B, R, P;
    int32_t *prompt_ids, *gen_ids;   /* [P], [R] scratch */
} verl_ctx;

static int is_int_dtype(ls_dtype d)
{
    return d == LS_DTYPE_I64 || d == LS_DTYPE_I32 || d == LS_DTYPE_I16 || d == LS_DTYPE_I8 || d == LS_DTYPE_U8 ||
           d == LS_DTYPE_BOOL;
}

/* Element i of an integer tensor (unaligned data: memcpy). */
static int64_t int_at(const ls_tensor *t, uint64_t i)
{
    const uint8_t *p = (const uint8_t *)t->data + i * ls_dtype_size(t->dtype);
    switch (t->dtype) {
    case LS_DTYPE_I64: { int64_t v; memcpy(&v, p, 8); return v; }
    case LS_DTYPE_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case LS_DTYPE_I16: { int16_t v; memcpy(&v, p, 2); return v; }
    case LS_DTYPE_I8: return (int8_t)p[0];
    default: return p[0]; /* U8, BOOL */
    }
}

/* fp32 bits of element i of the logprob tensor: F32 as stored; BF16 and F16
 * widen exactly (every value of theirs is an fp32 value). */
static uint32_t f32_at(const ls_tensor *t, uint64_t i)
{
    const uint8_t *p = (const uint8_t *)t->data + i * ls_dtype_size(t->dtype);
    if (t->dtype == LS_DTYPE_F32) { uint32_t v; memcpy(&v, p, 4); return v; }
    uint16_t h;
    memcpy(&h, p, 2);
    if (t->dtype == LS_DTYPE_BF16) return (uint32_t)h << 16;
    /* F16: sign, 5-bit exponent, 10-bit mantissa */
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = h >> 10 & 0x1f, m = h & 0x3ff;
    if (e == 0x1f) return sign | 0x7f800000u | m << 13;
    if (e == 0) {
        if (!m) return sign;
        int sh = 0;
        while (!(m & 0x400)) { m <<= 1; sh++; }
        return sign | (uint32_t)(113 - sh) << 23 | (m & 0x3ff) << 13;
    }
    return sign | (e + 112) << 23 | m << 13;
}

static ls_status need(verl_ctx *c, const char *name, int optional, const ls_tensor **out, ls_error *err)
{
    *out = ls_safetensors_find(c->st, name);
    if (!*out && !optional)
        return ls_fail(err, LS_E_INPUT, "%s: no tensor '%s' (a verl batch needs %s, responses, input_ids and "
                       "attention_mask)", c->label, name, c->lp_key);
    if (*out && (*out)->ndim != 2)
        return ls_fail(err, LS_E_INPUT, "%s: tensor '%s' has %d dimensions, expected 2 [batch, length]", c->label,
                       name, (*out)->ndim);
    return LS_OK;
}

static ls_status check_shape(verl_ctx *c, const ls_tensor *t, int64_t cols, int ints, ls_error *err)
{
    if (!t) return LS_OK;
    if (t->shape[0] != c->B || t->shape[1] != cols)
        return ls_fail(err, LS_E_INPUT, "%s: tensor '%s' is [%" PRId64 ", %" PRId64 "], expected [%" PRId64
                       ", %" PRId64 "]", c->label, t->name, t->shape[0], t->shape[1], c->B, cols);
    if (ints && !is_int_dtype(t->dtype))
        return ls_fail(err, LS_E_INPUT, "%s: tensor '%s' is %s, expected an integer dtype", c->label, t->name,
                       ls_dtype_name(t->dtype));
    return LS_OK;
}

static ls_status verl_open(verl_ctx *c, ls_error *err)
{
    LS_TRY(need(c, c->lp_key, 0, &c->lp, err));
    LS_TRY(need(c, "responses", 0, &c->responses, err));
    LS_TRY(need(c, "input_ids", 0, &c->input_ids, err));
    LS_TRY(need(c, "attention_mask", 0, &c->amask, err));
    LS_TRY(need(c, "response_mask", 1, &c->rmask, err));
    LS_TRY(need(c, "prompts", 1, &c->prompts, err));
    if (c->lp->dtype != LS_DTYPE_F32 && c->lp->dtype != LS_DTYPE_BF16 && c->lp->dtype != LS_DTYPE_F16)
        return ls_fail(err, LS_E_UNSUPPORTED, "%s: tensor '%s' is %s: only F32 (or BF16/F16, widened exactly) "
                       "carries fp32 bits without rounding", c->label, c->lp_key, ls_dtype_name(c->lp->dtype));
    c->B = c->lp->shape[0];
    c->R = c->lp->shape[1];
    c->P = c->input_ids->shape[1] - c->R;
    if (c->P < 1)
        return ls_fail(err, LS_E_INPUT, "%s: input_ids has %" PRId64 " columns for %" PRId64 " response columns: "
                       "no prompt columns", c->label, c->input_ids->shape[1], c->R);
    LS_TRY(check_shape(c, c->responses, c->R, 1, err));
    LS_TRY(check_shape(c, c->input_ids, c->P + c->R, 1, err));
    LS_TRY(check_shape(c, c->amask, c->P + c->R, 1, err));
    LS_TRY(check_shape(c, c->rmask, c->R, 1, err));
    LS_TRY(check_shape(c, c->prompts, c->P, 1, err));
    c->prompt_ids = malloc(sizeof(int32_t) * (size_t)(c->P + 1));
    c->gen_ids = malloc(sizeof(int32_t) * (size_t)(c->R + 1));
    if (!c->prompt_ids || !c->gen_ids) return ls_fail(err, LS_E_NOMEM, "out of memory");
    return LS_OK;
}

static ls_status token_id(verl_ctx *c, const ls_tensor *t, uint64_t i, int32_t *out, ls_error *err)
{
    int64_t v = int_at(t, i);
    if (v < 0 || v > INT32_MAX)
        return ls_fail(err, LS_E_INPUT, "%s: tensor '%s' element [%" PRIu64 ", %" PRIu64 "] = %" PRId64
                       " is no token id", c->label, t->name, i / (uint64_t)t->shape[1], i % (uint64_t)t->shape[1], v);
    *out = (int32_t)v;
    return LS_OK;
}

static ls_status verl_walk(ls_imp *im, void *ctx, ls_error *err)
{
    verl_ctx *c = ctx;
    int64_t W = c->P + c->R;
    for (int64_t b = 0; b < c->B; b++) {
        /* prompt: left padding (mask 0), then plen ones */
        int64_t plen = 0, rlen = 0;
        for (int64_t k = 0; k < c->P; k++) {
            int64_t m = int_at(c->amask, (uint64_t)(b * W + k));
            if (!m && plen)
                return ls_fail(err, LS_E_INPUT, "%s: attention_mask row %" PRId64 ": a 0 at prompt column %" PRId64
                               " after real tokens (prompts must be left-padded)", c->label, b, k);
            plen += m != 0;
        }
        const ls_tensor *rm = c->rmask ? c->rmask : c->amask;
        int64_t r0 = c->rmask ? 0 : c->P, rw = c->rmask ? c->R : W;
        for (int64_t t = 0; t < c->R; t++) {
            int64_t m = int_at(rm, (uint64_t)(b * rw + r0 + t));
            if (m && rlen != t)
                return ls_fail(err, LS_E_INPUT, "%s: %s row %" PRId64 ": a 1 at response column %" PRId64
                               " after padding (responses must be right-padded)", c->label,
                               c->rmask ? "response_mask" : "attention_mask", b, t);
            rlen += m != 0;
        }
        for (int64_t k = 0; k < plen; k++) {
            const ls_tensor *src = c->prompts ? c->prompts : c->input_ids;
            int64_t cols = c->prompts ? c->P : W;
            LS_TRY(token_id(c, src, (uint64_t)(b * cols + c->P - plen + k), &c->prompt_ids[k], err));
        }
        for (int64_t t = 0; t < rlen; t++) LS_TRY(token_id(c, c->responses, (uint64_t)(b * c->R + t), &c->gen_ids[t], err));
        ls_imp_seq s = {.choice = -1, .row = b, .prompt_len = plen, .prompt_ids = c->prompt_ids,
                        .gen_ids = c->gen_ids, .n_gen = rlen};
        LS_TRY(ls_imp_seq_begin(im, &s, err));
        for (int64_t t = 0; t < rlen; t++) {
            ls_imp_pos p = {.tok_pos = plen + t, .token = c->gen_ids[t], .at = -1,
                            .logprob_bits = f32_at(c->lp, (uint64_t)(b * c->R + t))};
            LS_TRY(ls_imp_add(im, &p, err));
        }
        LS_TRY(ls_imp_seq_end(im, err));
    }
    return LS_OK;
}

ls_status ls_import_verl_st(const ls_safetensors *st, const char *label, const ls_import_opts *o,
                            const char *out_path, ls_import_summary *sum, ls_error *err)
{
    verl_ctx c = {.st = st, .label = label, .lp_key = o->logprobs_key ? o->logprobs_key : "rollout_log_probs"};
    ls_status st_ = verl_open(&c, err);
    if (!st_) st_ = ls_imp_run(LS_IMPORT_VERL, label, verl_walk, &c, o, out_path, sum, err);
    free(c.prompt_ids);
    free(c.gen_ids);
    return st_;
}
