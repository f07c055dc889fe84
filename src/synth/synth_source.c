/* lockstep — synth: a checkpoint generated in memory (ls_synth_checkpoint):
 * the tensors `lockstep synth` would write, streamed piece by piece to
 * whoever reads them (the fingerprint), never all held at once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "numerics/fp8.h"
#include "synth/synth.h"
#include "synth/synth_internal.h"

/* Bytes generated per piece: large enough that the sink's per-call cost
 * vanishes, small enough that every hashing thread can hold one. */
#define PIECE_BYTES ((size_t)4 << 20)

ls_dtype ls_synth_tensor_dtype(const ls_synth_tensor *t)
{
    return t->fp8 == LS_SYNTH_F8_WEIGHT ? LS_DTYPE_F8_E4M3 : t->fp8 == LS_SYNTH_F8_SCALE ? LS_DTYPE_F32 : LS_DTYPE_BF16;
}

/* A NORMAL (or ONE_PLUS_NORMAL) run of n values keyed `key` from element 0,
 * in pieces of the buffer's size. */
static ls_status stream_normal(const ls_synth_tensor *t, uint64_t key, uint64_t n, uint16_t *buf,
                               ls_tensor_sink_fn sink, void *ctx, ls_error *err)
{
    const uint64_t per = PIECE_BYTES / sizeof *buf;
    for (uint64_t i = 0; i < n; i += per) {
        uint64_t m = n - i < per ? n - i : per;
        ls_synth_fill_normal_at(t, key, i, m, buf);
        LS_TRY(sink(ctx, buf, (size_t)(m * sizeof *buf), err));
    }
    return LS_OK;
}

/* A fused expert stack: expert by expert, each slice under its per-expert
 * name (ls_synth_fused_key). */
static ls_status stream_fused(const ls_synth_tensor *t, uint64_t seed, uint16_t *buf, ls_tensor_sink_fn sink,
                              void *ctx, ls_error *err)
{
    const int64_t E = t->shape[0], rows = t->shape[1], cols = t->shape[2];
    const int parts = t->fused == LS_SYNTH_FUSED_DOWN ? 1 : 2;
    for (int64_t e = 0; e < E; e++)
        for (int p = 0; p < parts; p++)
            LS_TRY(stream_normal(t, ls_synth_fused_key(t, seed, e, p), (uint64_t)(rows / parts * cols), buf, sink,
                                 ctx, err));
    return LS_OK;
}

/* An FP8 weight, or its scales: bands of whole 128-row scale blocks, each
 * quantised as the whole matrix is (a block's scale is its own amax). */
static ls_status stream_fp8(const ls_synth_tensor *t, uint64_t seed, ls_tensor_sink_fn sink, void *ctx,
                            ls_error *err)
{
    ls_synth_tensor w = *t;
    if (t->fp8 == LS_SYNTH_F8_SCALE) { /* the weight it scales, under the weight's name */
        size_t n = strlen(w.name);
        if (n > 10) w.name[n - 10] = '\0'; /* NAME.weight_scale_inv -> NAME.weight */
        w.fp8 = LS_SYNTH_F8_WEIGHT;
        w.ndim = 2;
        w.shape[0] = t->wshape[0];
        w.shape[1] = t->wshape[1];
    }
    const int64_t R = w.shape[0], C = w.shape[1], BC = LS_FP8_BLOCKS(C);
    int64_t band = (int64_t)(PIECE_BYTES / (size_t)(C > 0 ? C : 1)) / LS_FP8_BLOCK * LS_FP8_BLOCK;
    if (band < LS_FP8_BLOCK) band = LS_FP8_BLOCK;
    const int scales = t->fp8 == LS_SYNTH_F8_SCALE;
    uint8_t *q = scales ? NULL : malloc((size_t)(band * C > 0 ? band * C : 1));
    float *s = scales ? malloc(sizeof(float) * (size_t)(LS_FP8_BLOCKS(band) * BC > 0 ? LS_FP8_BLOCKS(band) * BC : 1))
                      : NULL;
    if (scales ? !s : !q) {
        free(q);
        free(s);
        return ls_fail(err, LS_E_NOMEM, "synth: cannot allocate a band of %lld rows of %s", (long long)band, t->name);
    }
    ls_status st = LS_OK;
    for (int64_t r0 = 0; st == LS_OK && r0 < R; r0 += band) {
        int64_t n = R - r0 < band ? R - r0 : band;
        st = ls_synth_fill_rows(&w, seed, r0, n, q, s, err);
        if (st == LS_OK)
            st = scales ? sink(ctx, s, sizeof(float) * (size_t)(LS_FP8_BLOCKS(n) * BC), err)
                        : sink(ctx, q, (size_t)(n * C), err);
    }
    free(q);
    free(s);
    return st;
}

ls_status ls_synth_stream_bytes(const ls_synth_tensor *t, uint64_t seed, ls_tensor_sink_fn sink, void *ctx,
                                ls_error *err)
{
    if (t->fp8) return stream_fp8(t, seed, sink, ctx, err);
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    const int normal = t->init == LS_SYNTH_INIT_NORMAL || t->init == LS_SYNTH_INIT_ONE_PLUS_NORMAL;
    uint16_t *buf = malloc(normal || t->fused ? PIECE_BYTES : sizeof *buf * (size_t)(n ? n : 1));
    if (!buf) return ls_fail(err, LS_E_NOMEM, "synth: cannot allocate the values of %s", t->name);
    ls_status st;
    if (t->fused) {
        st = stream_fused(t, seed, buf, sink, ctx, err);
    } else if (normal) {
        st = stream_normal(t, ls_synth_key(seed, t->name), n, buf, sink, ctx, err);
    } else { /* A_log, dt_bias: one value per head */
        ls_synth_fill(t, seed, buf);
        st = sink(ctx, buf, (size_t)(n * sizeof *buf), err);
    }
    free(buf);
    return st;
}

/* ---- the checkpoint ------------------------------------------------------------ */

typedef struct synth_source {
    ls_synth_tensor *t;
    size_t n;
    uint64_t seed;
} synth_source;

static ls_status source_stream(void *ctx, size_t index, ls_tensor_sink_fn sink, void *sink_ctx, ls_error *err)
{
    const synth_source *s = ctx;
    if (index >= s->n) return ls_fail(err, LS_E_INTERNAL, "synth: tensor %zu of %zu", index, s->n);
    return ls_synth_stream_bytes(&s->t[index], s->seed, sink, sink_ctx, err);
}

static void source_release(void *ctx)
{
    synth_source *s = ctx;
    if (!s) return;
    free(s->t);
    free(s);
}

ls_status ls_synth_checkpoint(const ls_synth_config *cfg, uint64_t seed, const char *label, ls_checkpoint **out,
                              ls_error *err)
{
    *out = NULL;
    synth_source *s = calloc(1, sizeof *s);
    if (!s) return ls_fail(err, LS_E_NOMEM, "%s: out of memory", label);
    s->seed = seed;
    char *text = NULL;
    size_t len = 0;
    ls_tensor *tab = NULL;
    ls_status st = ls_synth_list_tensors(cfg, &s->t, &s->n, err);
    if (st == LS_OK) st = ls_synth_config_render(cfg, &text, &len, err);
    if (st == LS_OK && !(tab = calloc(s->n ? s->n : 1, sizeof *tab)))
        st = ls_fail(err, LS_E_NOMEM, "%s: out of memory", label);
    if (st != LS_OK) {
        source_release(s);
        free(text);
        return st;
    }
    for (size_t i = 0; i < s->n; i++) {
        const ls_synth_tensor *t = &s->t[i];
        ls_tensor *x = &tab[i];
        x->stored_name = x->name = t->name;
        x->dtype = ls_synth_tensor_dtype(t);
        x->ndim = t->ndim;
        x->numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            x->shape[d] = t->shape[d];
            x->numel *= (uint64_t)t->shape[d];
        }
        x->size_bytes = ls_synth_tensor_bytes(t);
    }
    ls_tensor_source src = {source_stream, source_release, s};
    st = ls_checkpoint_open_generated(label, text, len, tab, s->n, &src, out, err);
    free(tab);
    free(text);
    return st;
}
