/* lockstep — the engine's forward: the layer sequence over the operator
 * table, and the digest queue that hashes what the layers produce; see
 * engine.h for what is recorded where. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "core/util.h"
#include "fingerprint/sha256.h"

static ls_order ord(const ls_engine *e, long layer, ls_perturb_op op)
{
    if (e->o.perturb_op != op) return LS_ORDER_CANONICAL;
    if (op == LS_PERTURB_LM_HEAD || e->o.perturb_layer == layer)
        return e->o.perturb_fast ? LS_ORDER_FAST_TWIN : LS_ORDER_REVERSED;
    return LS_ORDER_CANONICAL;
}

/* ---- digests ------------------------------------------------------------------------
 * Every digest goes through the backend's digest op. Jobs are queued and run
 * in one call before a buffer they read changes (before each layer's experts,
 * fenced before the residual add that follows them; before a carried state
 * advances past a digested position; after the lm_head, fenced at the end of
 * the forward), so one call covers a layer's rows. */

static ls_digest_span span(ls_view v, long rows, long len, long stride, int bf16)
{
    ls_digest_span s = {v, rows, len, stride, bf16};
    return s;
}

static const ls_digest_span no_span = {{NULL, 0}, 0, 0, 0, 0};

static ls_status dq_flush(ls_engine *e, ls_error *err)
{
    long n = e->n_jobs;
    e->n_jobs = 0;
    return n > 0 ? e->be->digest(e->be, e->jobs, n, err) : LS_OK;
}

/* A flush whose spans stay as they are until the next dq_fence (the
 * backend's digest_early: their encoding may run beside the ops between). */
static ls_status dq_flush_early(ls_engine *e, ls_error *err)
{
    long n = e->n_jobs;
    if (!e->be->digest_early) return dq_flush(e, err);
    e->n_jobs = 0;
    return n > 0 ? e->be->digest_early(e->be, e->jobs, n, err) : LS_OK;
}

static ls_status dq_fence(ls_engine *e, ls_error *err)
{
    return e->be->digest_fence ? e->be->digest_fence(e->be, err) : LS_OK;
}

/* Canonical bytes of one span, downloaded, appended at out (dumps only). */
static ls_status span_bytes(ls_engine *e, const ls_digest_span *sp, unsigned char *out, size_t *len,
                            ls_error *err)
{
    for (long r = 0; r < sp->rows; r++) {
        LS_TRY(e->be->download(e->be, e->h_tmp, ls_view_at(sp->src, (size_t)(r * sp->stride)),
                               (size_t)sp->len * 4, err));
        for (long i = 0; i < sp->len; i++) {
            if (sp->bf16) {
                uint16_t h = ls_f32_to_bf16(e->h_tmp[i]);
                out[(*len)++] = (unsigned char)(h & 0xff);
                out[(*len)++] = (unsigned char)(h >> 8);
            } else {
                uint32_t u = ls_f32_bits(e->h_tmp[i]);
                for (int b = 0; b < 4; b++) out[(*len)++] = (unsigned char)(u >> (8 * b));
            }
        }
    }
    return LS_OK;
}

/* The digest slot of (row, trace layer, kind), marked as recorded: its cell. */
static long dq_cell(ls_engine *e, long row, int tl, ls_digest_kind kind)
{
    long cell = row * e->n_slots + e->slot_of[tl * N_KINDS + kind];
    e->have[cell] = 1;
    e->dig[cell].layer = (uint16_t)tl;
    e->dig[cell].kind = (uint8_t)kind;
    return cell;
}

/* A queued job, cleared. */
static ls_status dq_job(ls_engine *e, ls_digest_job **j, ls_error *err)
{
    if (e->n_jobs == e->jobs_cap) LS_TRY(dq_flush(e, err));
    *j = &e->jobs[e->n_jobs++];
    memset(*j, 0, sizeof **j);
    return LS_OK;
}

/* Queues the digest of (row, trace layer, kind) over spans a then b; copies the
 * canonical bytes into the row's dumps when the layer is dumped. */
static ls_status dq_push(ls_engine *e, long row, int tl, ls_digest_kind kind, ls_digest_span a,
                         ls_digest_span b, ls_error *err)
{
    ls_digest_job *j;
    LS_TRY(dq_job(e, &j, err));
    long cell = dq_cell(e, row, tl, kind);
    j->span[0] = a;
    j->span[1] = b;
    j->out = &e->dig[cell].digest;
    int dl = e->layers[tl].decoder_layer;
    if (e->dumping && dl >= 0 && e->o.dump_decoder_layers[dl]) {
        unsigned char *out = e->dump_data + (size_t)cell * e->dump_bytes;
        size_t len = 0;
        LS_TRY(span_bytes(e, &a, out, &len, err));
        LS_TRY(span_bytes(e, &b, out, &len, err));
        long elems = a.rows * a.len + b.rows * b.len;
        e->dump_elems[cell] = (uint32_t)elems;
        e->dump_dtype[cell] = kind == LS_DIGEST_ROUTER ? LS_DUMP_ROUTER
                              : a.bf16 ? LS_DUMP_BF16 : LS_DUMP_FP32;
    }
    return LS_OK;
}

/* HIDDEN digests of rows r0 .. r1-1 of width `width` (act dtype, or fp32 when f32). */
static ls_status dq_row_range(ls_engine *e, ls_buf *b, long width, long r0, long r1, int tl, int f32,
                              ls_error *err)
{
    int bf = f32 ? 0 : e->o.act_bf16;
    for (long r = r0; r < r1; r++)
        LS_TRY(dq_push(e, r, tl, LS_DIGEST_HIDDEN, span(AT(b, r * width), 1, width, width, bf),
                       no_span, err));
    return LS_OK;
}

static ls_status dq_rows(ls_engine *e, ls_buf *b, long width, long T, int tl, int f32, ls_error *err)
{
    return dq_row_range(e, b, width, 0, T, tl, f32, err);
}

/* Columns c0 .. c0+w-1 of logits rows 0 .. T-1 (fp32), one part of each
 * row's digest (backend.h, a digest in parts): the first columns start the
 * row's running hash, the last end it in the row's slot. No decoder layer's:
 * never dumped. */
static ls_status dq_logits_part(ls_engine *e, long T, long c0, long w, ls_error *err)
{
    long V = e->c.vocab;
    int tl = e->n_tl - 1;
    for (long r = 0; r < T; r++) {
        ls_digest_job *j;
        LS_TRY(dq_job(e, &j, err));
        j->span[0] = span(AT(e->logits, r * V + c0), 1, w, w, 0);
        j->run = &e->lg_run[r];
        j->first = c0 == 0;
        if (c0 + w == V) j->out = &e->dig[dq_cell(e, r, tl, LS_DIGEST_HIDDEN)].digest;
    }
    return LS_OK;
}

/* ---- tensor parallelism (docs/parallel.md §3.3, the order-preserving form) --------------
 * The mixers run over this rank's heads (e->c holds its head counts); what
 * reads every head (o_proj, out_proj) or every vocabulary row (the logits)
 * is preceded or followed by an all-gather of exact bytes. */

/* Every rank's columns [T, n] of src (exact bytes) into y [T, N]: rank r's
 * are columns (r / share) * n .. of y, where `share` consecutive ranks hold
 * the same columns (replicated KV heads; 1 otherwise) and the first of them
 * provides them. */
static ls_status gather_cols(ls_engine *e, ls_view src, long T, long n, long N, int share, ls_view y,
                             ls_error *err)
{
    ls_backend *be = e->be;
    long tp = e->tp;
    size_t own = sizeof(float) * (size_t)(T * n);
    if (n * (tp / share) != N)
        return ls_fail(err, LS_E_INTERNAL, "engine: %ld columns on each of %ld ranks (shared by %d) do "
                       "not make %ld", n, tp, share, N);
    LS_TRY(be->download(be, e->h_tp_a, src, own, err));
    LS_TRY(ls_comm_all_gather(e->o.tp_comm, e->h_tp_a, own, e->h_tp_b, err));
    for (long t = 0; t < T; t++)
        for (long r = 0; r < tp; r += share)
            memcpy(e->h_tp_a + t * N + (r / share) * n, e->h_tp_b + (r * T + t) * n,
                   sizeof(float) * (size_t)n);
    return be->upload(be, y, e->h_tp_a, sizeof(float) * (size_t)(T * N), err);
}

/* y [T, N] = x W^T. A matrix held whole (w->rows = N: no TP, or split by
 * head, N being this rank's heads) is the plain linear; one held by rows
 * (w->rows = N / tp) computes this rank's outputs, each the dot product one
 * rank computes over the whole K in today's order, and all-gathers them. */
static ls_status lin(ls_engine *e, const ls_bweight *w, long N, ls_view x, ls_view y, long T,
                     ls_order o, ls_error *err)
{
    ls_backend *be = e->be;
    if (w->rows == N) return be->linear(be, w, x, y, T, e->o.act_bf16, o, err);
    if (!e->tp)
        return ls_fail(err, LS_E_INTERNAL, "engine: a projection of %ld rows holds %ld", N, w->rows);
    LS_TRY(be->linear(be, w, x, BEV(e->tp_out), T, e->o.act_bf16, o, err));
    return gather_cols(e, BEV(e->tp_out), T, w->rows, N, 1, y, err);
}

/* ---- forward ------------------------------------------------------------------------- */

/* The lm_head's calls in a step: rows in at most LS_LM_HEAD_RUNS runs, of at
 * least LS_LM_HEAD_RUN_MIN rows; a step of at most LS_LM_HEAD_COL_ROWS rows
 * in at most LS_LM_HEAD_COLS column chunks instead, of a multiple of
 * LS_LM_HEAD_COL_ALIGN columns (weight rows). */
#define LS_LM_HEAD_RUNS 8
#define LS_LM_HEAD_RUN_MIN 8
#define LS_LM_HEAD_COL_ROWS 64
#define LS_LM_HEAD_COLS 8
#define LS_LM_HEAD_COL_ALIGN 64

long ls_engine_lm_head_chunk(long vocab)
{
    long cw = (vocab + LS_LM_HEAD_COLS - 1) / LS_LM_HEAD_COLS;
    return (cw + LS_LM_HEAD_COL_ALIGN - 1) / LS_LM_HEAD_COL_ALIGN * LS_LM_HEAD_COL_ALIGN;
}

/* The logits, digested as they are written: a logits row is one long
 * SHA-256 on a host thread. A step whose digests are waited for before the
 * next step begins (ls_engine_step, layer dumps: step_alone) computes them
 * in blocks, each digested as soon as it is written, so that the host
 * hashes the first blocks while the device computes the next, instead of
 * every row after the last. Rows go in runs. A step of few rows (decode)
 * goes in column chunks instead where the backend computes a linear column
 * by column (be->linear_by_column) and the lm_head is held whole in bf16 or
 * fp32: each chunk computed into lp (free until the logprobs) and copied
 * into place (one row: computed in place), and hashed as the next part of
 * its rows' digests, so a row's hash ends soon after its last columns are
 * written instead of starting there. With many rows the host's hashing
 * throughput bounds the lm_head, and whole rows spread over the hashing
 * threads without the copies. A pipelined step (ls_engine_step_begin) of
 * one row hashes its row during the next step, so it takes the lm_head in
 * one call. (Pipelined steps of more rows keep the blocks: hashing many
 * whole rows at once on every host thread slowed the next batch-32 step on
 * an H200 more than the blocks' launches cost.) Rows and columns are
 * computed alone either way: the same bits. */
static ls_status lm_head(ls_engine *e, long T, ls_error *err)
{
    ls_backend *be = e->be;
    long V = e->c.vocab, D = e->c.hidden;
    const ls_bweight *w = &e->lm_head;
    ls_order o = ord(e, -1, LS_PERTURB_LM_HEAD);
    int alone = e->step_alone || e->dumping;
    if (T > LS_LM_HEAD_COL_ROWS || (T == 1 && !alone) || !be->linear_by_column || w->rows != V ||
        (w->wtype != LS_WTYPE_BF16 && w->wtype != LS_WTYPE_F32)) {
        long run = (T + LS_LM_HEAD_RUNS - 1) / LS_LM_HEAD_RUNS;
        if (run < LS_LM_HEAD_RUN_MIN) run = LS_LM_HEAD_RUN_MIN;
        for (long r0 = 0; r0 < T; r0 += run) {
            long n = T - r0 < run ? T - r0 : run;
            LS_TRY(lin(e, w, V, AT(e->XN, r0 * D), AT(e->logits, r0 * V), n, o, err));
            LS_TRY(dq_row_range(e, e->logits, V, r0, r0 + n, e->n_tl - 1, 1, err));
            LS_TRY(dq_flush_early(e, err)); /* fenced at the end of the step */
        }
        return LS_OK;
    }
    long cw = ls_engine_lm_head_chunk(V);
    for (long c0 = 0; c0 < V; c0 += cw) {
        ls_bweight chunk = *w;
        chunk.rows = V - c0 < cw ? V - c0 : cw;
        chunk.off_bytes += (size_t)(c0 * w->cols * ls_wtype_bytes(w->wtype));
        if (T == 1) { /* one row: the chunk is contiguous in place */
            LS_TRY(be->linear(be, &chunk, BEV(e->XN), AT(e->logits, c0), T, e->o.act_bf16, o, err));
        } else {
            LS_TRY(be->linear(be, &chunk, BEV(e->XN), BEV(e->lp), T, e->o.act_bf16, o, err));
            LS_TRY(ls_copy_rows(be, AT(e->logits, c0), V, BEV(e->lp), chunk.rows, T, chunk.rows, err));
        }
        LS_TRY(dq_logits_part(e, T, c0, chunk.rows, err));
        LS_TRY(dq_flush(e, err)); /* one part of a row's hash per call */
    }
    return LS_OK;
}

/* Carried-state digests: p % N == N - 1, the last prompt position, and the
 * sequence's last position (docs/trace-format.md §3). */
static int state_due(const ls_engine *e, const seg *sg, long j)
{
    long p = sg->pos0 + j, N = e->o.state_digest_every;
    long prompt = e->ss[sg->slot].prompt_len;
    return p % N == N - 1 || (prompt > 0 && p == prompt - 1) || (sg->last && j == sg->n - 1);
}

/* 1 when no sequence's rows need a carried-state digest before its last row:
 * each sequence then runs its mixer in one call, and the backend's batched
 * mixer ops can run all sequences in one launch with the same bits. */
static int single_runs(const ls_engine *e, const seg *sg, long nseg)
{
    for (long s = 0; s < nseg; s++)
        for (long j = 0; j < sg[s].n - 1; j++)
            if (state_due(e, &sg[s], j)) return 0;
    return 1;
}

/* Per-sequence row spans and state buffers for the batched mixer ops. */
typedef struct batch_args {
    long *row0, *len, *pos0;
    ls_buf **st, **st2;
} batch_args;

static void batch_free(batch_args *b)
{
    free(b->row0);
    free(b->len);
    free(b->pos0);
    free(b->st);
    free(b->st2);
}

static ls_status batch_init(const seg *sg, long nseg, batch_args *b, ls_error *err)
{
    size_t n = (size_t)(nseg > 0 ? nseg : 1);
    b->row0 = malloc(n * sizeof(long));
    b->len = malloc(n * sizeof(long));
    b->pos0 = malloc(n * sizeof(long));
    b->st = malloc(n * sizeof(ls_buf *));
    b->st2 = malloc(n * sizeof(ls_buf *));
    if (!b->row0 || !b->len || !b->pos0 || !b->st || !b->st2) {
        batch_free(b);
        return ls_fail_nomem(err, n * (3 * sizeof(long) + 2 * sizeof(ls_buf *)), "engine: batch tables for %ld sequences",
                             nseg);
    }
    for (long s = 0; s < nseg; s++) {
        b->row0[s] = sg[s].row0;
        b->len[s] = sg[s].n;
        b->pos0[s] = sg[s].pos0;
    }
    return LS_OK;
}

/* Trace layer of decoder layer l's mixer (its MoE is the next one). */
static int mixer_tl(long l)
{
    return (int)(1 + 2 * l);
}

/* Carried-state op of layer l on rows row .. row+n-1 of the packed batch. */
typedef ls_status (*state_op)(ls_engine *e, long l, long row, long n, ls_buf *state,
                              ls_error *err);

static ls_status conv_op(ls_engine *e, long l, long row, long n, ls_buf *cs, ls_error *err)
{
    long C = e->conv_dim;
    return e->be->conv_silu(e->be, AT(e->X, row * C), C, &e->lw[l].conv, BEV(cs),
                            AT(e->Y, row * C), C, n, C, e->c.conv_kernel, e->o.act_bf16,
                            ord(e, l, LS_PERTURB_CONV), err);
}

static ls_status gdn_op(ls_engine *e, long l, long row, long n, ls_buf *gs, ls_error *err)
{
    const ls_model_config *c = &e->c;
    long Hk = c->lin_k_heads, Hv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim;
    if (e->o.gdn_chunked) /* rows row.. of one sequence sit at positions h_pos[row].. */
        return e->be->gdn_chunked(e->be, ls_view_at(e->gq, row * Hk * dk), ls_view_at(e->gk, row * Hk * dk),
                                  ls_view_at(e->gv, row * Hv * dv),
                                  AT(e->alpha, row * Hv), AT(e->beta, row * Hv), BEV(gs), AT(e->O, row * Hv * dv), n,
                                  e->h_pos[row], Hk, Hv, dk, dv, e->o.act_bf16, ord(e, l, LS_PERTURB_GDN), err);
    return e->be->gdn_recurrent(e->be, ls_view_at(e->gq, row * Hk * dk), ls_view_at(e->gk, row * Hk * dk),
                                ls_view_at(e->gv, row * Hv * dv), AT(e->alpha, row * Hv),
                                AT(e->beta, row * Hv), BEV(gs), AT(e->O, row * Hv * dv), n, Hk,
                                Hv, dk, dv, e->o.act_bf16, ord(e, l, LS_PERTURB_GDN), err);
}

/* The digested part of a carried state: conv, [conv_dim, W-1] = columns
 * 1..W-1 of the [C, W] state in the activation dtype; GDN, the fp32 state. */
static ls_digest_span state_span(const ls_engine *e, ls_digest_kind kind, ls_buf *st)
{
    const ls_model_config *c = &e->c;
    long K = c->conv_kernel, SN = c->lin_v_heads * c->lin_k_dim * c->lin_v_dim;
    if (kind == LS_DIGEST_CONV_STATE)
        return span(AT(st, 1), e->conv_dim, K - 1, K, e->o.act_bf16);
    return span(BEV(st), 1, SN, SN, 0);
}

/* Queues the digest of a carried state at `row`. Under TP the state is this
 * rank's heads (GDN: [Hv_r, dk, dv]; conv: its [C_r, K] channels): the ranks'
 * parts are gathered into the full state, in head order (conv: the q, k and
 * v channels of every rank in turn), and digested at once, since the
 * gathered copy is reused. */
static ls_status state_push(ls_engine *e, long row, int tl, ls_digest_kind kind, ls_buf *st, ls_error *err)
{
    ls_backend *be = e->be;
    const ls_model_config *c = &e->c, *mc = &e->m->cfg;
    /* the chunk-aligned form carries the state at its chunk's start: the
     * state after the row is materialised (and digested before the next) */
    int mat = kind == LS_DIGEST_GDN_STATE && e->o.gdn_chunked;
    if (mat) {
        LS_TRY(be->gdn_chunked_state(be, BEV(st), e->h_pos[row], BEV(e->gdn_mat), c->lin_v_heads, c->lin_k_dim,
                                     c->lin_v_dim, err));
        st = e->gdn_mat;
    }
    if (!e->tp) {
        LS_TRY(dq_push(e, row, tl, kind, state_span(e, kind, st), no_span, err));
        return mat ? dq_flush(e, err) : LS_OK;
    }
    long tp = e->tp, K = c->conv_kernel;
    if (kind == LS_DIGEST_GDN_STATE) {
        long n = c->lin_v_heads * c->lin_k_dim * c->lin_v_dim;
        LS_TRY(gather_cols(e, BEV(st), 1, n, n * tp, 1, BEV(e->gdn_full), err));
        long SN = n * tp;
        LS_TRY(dq_push(e, row, tl, kind, span(BEV(e->gdn_full), 1, SN, SN, 0), no_span, err));
        return dq_flush(e, err);
    }
    long Cr = e->conv_dim, qk = c->lin_k_heads * c->lin_k_dim, vv = c->lin_v_heads * c->lin_v_dim;
    size_t own = sizeof(float) * (size_t)(Cr * K);
    LS_TRY(be->download(be, e->h_tp_a, BEV(st), own, err));
    LS_TRY(ls_comm_all_gather(e->o.tp_comm, e->h_tp_a, own, e->h_tp_b, err));
    /* rank r's channels: q at r*qk, k at tp*qk + r*qk, v at 2*tp*qk + r*vv */
    for (long r = 0; r < tp; r++) {
        const float *src = e->h_tp_b + r * Cr * K;
        long to[3] = {r * qk, tp * qk + r * qk, 2 * tp * qk + r * vv}, len[3] = {qk, qk, vv}, from = 0;
        for (int i = 0; i < 3; i++) {
            memcpy(e->h_tp_a + to[i] * K, src + from * K, sizeof(float) * (size_t)(len[i] * K));
            from += len[i];
        }
    }
    long C = 2 * mc->lin_k_heads * mc->lin_k_dim + mc->lin_v_heads * mc->lin_v_dim;
    LS_TRY(be->upload(be, BEV(e->conv_full), e->h_tp_a, sizeof(float) * (size_t)(C * K), err));
    LS_TRY(dq_push(e, row, tl, kind, span(AT(e->conv_full, 1), C, K - 1, K, e->o.act_bf16), no_span, err));
    return dq_flush(e, err);
}

/* After a batched op ran every sequence in one call (single_runs): the state
 * digest of each sequence whose last row is due. */
static ls_status last_state_digests(ls_engine *e, long l, const seg *sg, long nseg,
                                   ls_buf *const *st, ls_digest_kind kind, ls_error *err)
{
    for (long s = 0; s < nseg; s++)
        if (state_due(e, &sg[s], sg[s].n - 1))
            LS_TRY(state_push(e, sg[s].row0 + sg[s].n - 1, mixer_tl(l), kind, st[s], err));
    return LS_OK;
}

/* Sequence q through a carried-state op in runs that end where a state
 * digest is due; the digest is queued after its run and flushed before the
 * next run advances the state. */
static ls_status state_runs(ls_engine *e, long l, const seg *q, ls_buf *st, ls_digest_kind kind,
                            state_op op, ls_error *err)
{
    int pending = 0;
    for (long i = 0; i < q->n;) {
        long j = i;
        while (j < q->n - 1 && !state_due(e, q, j)) j++;
        if (pending) LS_TRY(dq_flush(e, err));
        LS_TRY(op(e, l, q->row0 + i, j - i + 1, st, err));
        pending = state_due(e, q, j);
        if (pending)
            LS_TRY(state_push(e, q->row0 + j, mixer_tl(l), kind, st, err));
        i = j + 1;
    }
    return LS_OK;
}

/* The GDN input projections of T rows of XN into X [T, conv_dim] (q, k, v
 * head-major: the conv's channel order), Z [T, Hv dv], Bv and Av [T, Hv].
 * Every output element is one linear DOT32 of its weight row, so the two
 * layouts compute the same bits from the same weights; only where the rows
 * sit differs (docs/model.md §2.3). */
static ls_status gdn_project(ls_engine *e, layer_w *w, long T, ls_error *err)
{
    ls_backend *be = e->be;
    const ls_model_config *c = &e->c;
    ls_order o = LS_ORDER_CANONICAL;
    if (c->arch == LS_MODEL_QWEN3_5_MOE) {
        /* Qwen3.5: four matrices whose rows are already in this order. */
        long Hv = c->lin_v_heads;
        if (e->tp) {
            /* this rank's q, k and v rows are three ranges of in_proj_qkv:
             * each projected alone, then placed in X's channel order */
            long C = e->conv_dim, qk = c->lin_k_heads * c->lin_k_dim;
            const ls_bweight *part[3] = {&w->in_qkv, &w->in_k, &w->in_v};
            long at = 0;
            for (int i = 0; i < 3; i++) {
                long n = part[i]->rows;
                LS_TRY(be->linear(be, part[i], BEV(e->XN), BEV(e->tp_out), T, e->o.act_bf16, o, err));
                LS_TRY(ls_copy_rows(be, AT(e->X, at), C, BEV(e->tp_out), n, T, n, err));
                at += n;
            }
            if (at != 2 * qk + Hv * c->lin_v_dim)
                return ls_fail(err, LS_E_INTERNAL, "engine: in_proj_qkv rows %ld of %ld", at, C);
        } else {
            LS_TRY(lin(e, &w->in_qkv, e->conv_dim, BEV(e->XN), BEV(e->X), T, o, err));
        }
        LS_TRY(lin(e, &w->in_z, Hv * c->lin_v_dim, BEV(e->XN), BEV(e->Z), T, o, err));
        LS_TRY(lin(e, &w->in_b, Hv, BEV(e->XN), BEV(e->Bv), T, o, err));
        return lin(e, &w->in_a, Hv, BEV(e->XN), BEV(e->Av), T, o, err);
    }
    long Hk = c->lin_k_heads, Hv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim;
    long C = e->conv_dim, Wp = e->wqkvz, r = Hv / Hk;
    LS_TRY(lin(e, &w->qkvz, Wp, BEV(e->XN), BEV(e->P), T, o, err));
    LS_TRY(lin(e, &w->ba, 2 * Hv, BEV(e->XN), BEV(e->BA), T, o, err));
    /* Qwen3-Next: de-interleave per key-head group (docs/model.md §2.3): group
     * g of a row holds q, k (dk each), v, z (r dv each), and of the ba row b,
     * a (r each). */
    long gw = 2 * dk + 2 * r * dv;
    const ls_copy_job split[6] = {
        {AT(e->X, 0), AT(e->P, 0), {T, Hk, dk, C, dk, Wp, gw}},
        {AT(e->X, Hk * dk), AT(e->P, dk), {T, Hk, dk, C, dk, Wp, gw}},
        {AT(e->X, 2 * Hk * dk), AT(e->P, 2 * dk), {T, Hk, r * dv, C, r * dv, Wp, gw}},
        {AT(e->Z, 0), AT(e->P, 2 * dk + r * dv), {T, Hk, r * dv, Hv * dv, r * dv, Wp, gw}},
        {AT(e->Bv, 0), AT(e->BA, 0), {T, Hk, r, Hv, r, 2 * Hv, 2 * r}},
        {AT(e->Av, 0), AT(e->BA, r), {T, Hk, r, Hv, r, 2 * Hv, 2 * r}},
    };
    return be->copy_blocks(be, split, 6, err);
}

static ls_status gdn_layer(ls_engine *e, long l, const seg *sg, long nseg, long T, ls_error *err)
{
    ls_backend *be = e->be;
    const ls_model_config *c = &e->c;
    layer_w *w = &e->lw[l];
    int act = e->o.act_bf16;
    long Hk = c->lin_k_heads, Hv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim;
    long K = c->conv_kernel, C = e->conv_dim;
    LS_TRY(gdn_project(e, w, T, err));
    ls_order oc = ord(e, l, LS_PERTURB_CONV), og = ord(e, l, LS_PERTURB_GDN);
    int batched = be->conv_silu_batch && be->gdn_recurrent_batch && nseg > 1 &&
                  single_runs(e, sg, nseg);
    int gdn_batched = batched && (!e->o.gdn_chunked || be->gdn_chunked_batch);
    batch_args ba = {0};
    if (batched) {
        LS_TRY(batch_init(sg, nseg, &ba, err));
        for (long s = 0; s < nseg; s++) ba.st[s] = e->ss[sg[s].slot].conv[l];
        ls_status st = be->conv_silu_batch(be, BEV(e->X), C, &w->conv, ba.st, ba.row0, ba.len, nseg,
                                           BEV(e->Y), C, C, K, act, oc, err);
        if (st == LS_OK) st = last_state_digests(e, l, sg, nseg, ba.st, LS_DIGEST_CONV_STATE, err);
        if (st != LS_OK) {
            batch_free(&ba);
            return st;
        }
    }
    for (long s = 0; s < nseg && !batched; s++)
        LS_TRY(state_runs(e, l, &sg[s], e->ss[sg[s].slot].conv[l], LS_DIGEST_CONV_STATE, conv_op,
                          err));
    /* q, k and v rows apart from the conv output's; one row's are its
     * consecutive ranges, used in place where they stay 16-byte aligned */
    if (T == 1 && Hk * dk % 4 == 0) {
        e->gq = AT(e->Y, 0), e->gk = AT(e->Y, Hk * dk), e->gv = AT(e->Y, 2 * Hk * dk);
    } else {
        e->gq = BEV(e->Q), e->gk = BEV(e->K), e->gv = BEV(e->V);
        const ls_copy_job qkv[3] = {ls_copy_rows_job(e->gq, Hk * dk, AT(e->Y, 0), C, T, Hk * dk),
                                    ls_copy_rows_job(e->gk, Hk * dk, AT(e->Y, Hk * dk), C, T, Hk * dk),
                                    ls_copy_rows_job(e->gv, Hv * dv, AT(e->Y, 2 * Hk * dk), C, T, Hv * dv)};
        LS_TRY(be->copy_blocks(be, qkv, 3, err));
    }
    LS_TRY(be->l2norm_scale(be, e->gq, T * Hk, dk, ls_cpu_inv_sqrt_scale(dk), og, err));
    LS_TRY(be->l2norm_scale(be, e->gk, T * Hk, dk, 1.0f, og, err));
    LS_TRY(be->gdn_gates(be, BEV(e->Bv), BEV(e->Av), BEV(w->A_log), BEV(w->dt_bias), BEV(e->beta),
                         BEV(e->alpha), T, Hv, act, err));
    if (batched && !gdn_batched) batch_free(&ba);
    if (gdn_batched) {
        for (long s = 0; s < nseg; s++) ba.st[s] = e->ss[sg[s].slot].gdn[l];
        ls_status st =
            e->o.gdn_chunked
                ? be->gdn_chunked_batch(be, e->gq, e->gk, e->gv, BEV(e->alpha), BEV(e->beta), ba.st,
                                        ba.row0, ba.len, ba.pos0, nseg, BEV(e->O), Hk, Hv, dk, dv, act, og, err)
                : be->gdn_recurrent_batch(be, e->gq, e->gk, e->gv, BEV(e->alpha), BEV(e->beta), ba.st,
                                          ba.row0, ba.len, nseg, BEV(e->O), Hk, Hv, dk, dv, act, og, err);
        if (st == LS_OK) st = last_state_digests(e, l, sg, nseg, ba.st, LS_DIGEST_GDN_STATE, err);
        batch_free(&ba);
        LS_TRY(st);
    }
    for (long s = 0; s < nseg && !gdn_batched; s++)
        LS_TRY(state_runs(e, l, &sg[s], e->ss[sg[s].slot].gdn[l], LS_DIGEST_GDN_STATE, gdn_op, err));
    LS_TRY(be->gated_rmsnorm(be, BEV(e->O), BEV(e->Z), BEV(w->gnorm), BEV(e->O), T * Hv, dv, act,
                             LS_ORDER_CANONICAL, err));
    if (!e->tp) return lin(e, &w->out_proj, c->hidden, BEV(e->O), BEV(e->A), T, LS_ORDER_CANONICAL, err);
    /* out_proj reads every value head: the ranks' heads gathered, in head order */
    const ls_model_config *mc = &e->m->cfg;
    LS_TRY(gather_cols(e, BEV(e->O), T, Hv * dv, mc->lin_v_heads * mc->lin_v_dim, 1, BEV(e->tp_in), err));
    return lin(e, &w->out_proj, c->hidden, BEV(e->tp_in), BEV(e->A), T, LS_ORDER_CANONICAL, err);
}

static ls_status attn_layer(ls_engine *e, long l, const seg *sg, long nseg, long T, ls_error *err)
{
    ls_backend *be = e->be;
    const ls_model_config *c = &e->c;
    layer_w *w = &e->lw[l];
    int act = e->o.act_bf16;
    long Hq = c->n_heads, Hkv = c->n_kv_heads, d = c->head_dim;
    int tl = mixer_tl(l);
    LS_TRY(lin(e, &w->q, Hq * 2 * d, BEV(e->XN), BEV(e->QG), T, LS_ORDER_CANONICAL, err));
    LS_TRY(lin(e, &w->k, Hkv * d, BEV(e->XN), BEV(e->K), T, LS_ORDER_CANONICAL, err));
    LS_TRY(lin(e, &w->v, Hkv * d, BEV(e->XN), BEV(e->V), T, LS_ORDER_CANONICAL, err));
    /* Per head: d query values, then d gate values (docs/model.md §3.3 step 1). */
    const ls_copy_shape heads = {T, Hq, d, Hq * d, d, Hq * 2 * d, 2 * d};
    const ls_copy_job qg[2] = {{BEV(e->Q), AT(e->QG, 0), heads}, {BEV(e->G), AT(e->QG, d), heads}};
    LS_TRY(be->copy_blocks(be, qg, 2, err));
    ls_order on = LS_ORDER_CANONICAL;
    LS_TRY(be->rmsnorm(be, BEV(e->Q), BEV(w->q_norm), BEV(e->Q), T * Hq, d, act, on, err));
    LS_TRY(be->rmsnorm(be, BEV(e->K), BEV(w->k_norm), BEV(e->K), T * Hkv, d, act, on, err));
    LS_TRY(be->rope_apply(be, BEV(e->Q), e->v_cos, e->v_sin, T, Hq, d, c->rotary_dims, act, err));
    LS_TRY(be->rope_apply(be, BEV(e->K), e->v_cos, e->v_sin, T, Hkv, d, c->rotary_dims, act, err));
    ls_order oa = ord(e, l, LS_PERTURB_ATTENTION);
    int batched = be->kv_append_batch && be->attention_batch;
    if (batched) {
        batch_args ba = {0};
        LS_TRY(batch_init(sg, nseg, &ba, err));
        ls_view *pts = malloc(sizeof(ls_view) * (size_t)nseg);
        if (!pts) {
            batch_free(&ba);
            return ls_fail_nomem(err, sizeof(ls_view) * (size_t)nseg, "engine: page tables of %ld sequences",
                                 nseg);
        }
        for (long s = 0; s < nseg; s++) {
            ba.st[s] = e->ss[sg[s].slot].kc[l];
            ba.st2[s] = e->ss[sg[s].slot].vc[l];
            pts[s] = ls_engine_slot_pt(e, sg[s].slot);
        }
        ls_status st = be->kv_append_batch(be, BEV(e->K), BEV(e->V), ba.st, ba.st2, pts, e->page, e->kv_cap,
                                           ba.row0, ba.len, ba.pos0, e->v_pos, nseg, Hkv, d, err);
        if (st == LS_OK)
            st = be->attention_batch(be, BEV(e->Q), ba.st, ba.st2, pts, e->page, e->kv_cap, ba.row0, ba.len,
                                     nseg, e->v_pos, BEV(e->O), Hq, Hkv, d, act, oa, err);
        free(pts);
        batch_free(&ba);
        LS_TRY(st);
    }
    for (long s = 0; s < nseg && !batched; s++) {
        seq_state *q = &e->ss[sg[s].slot];
        long r0 = sg[s].row0, n = sg[s].n;
        ls_view pt = ls_engine_slot_pt(e, sg[s].slot);
        const int32_t *hpt = e->paged ? e->h_pt + sg[s].slot * e->max_pages : NULL;
        /* rows [m, Hkv, d] to positions p.. of the caches, in runs within one
         * page (contiguous: one run, page = cap) */
        for (long i = 0; i < n;) {
            long p = sg[s].pos0 + i, m = n - i, room = e->page - p % e->page;
            if (m > room) m = room;
            ls_copy_shape kv = {m, Hkv, d, d, e->page * d, Hkv * d, d};
            size_t at = (size_t)(ls_cpu_kv_row(hpt, e->page, Hkv, 0, p) * d);
            const ls_copy_job jobs[2] = {{AT(q->kc[l], at), AT(e->K, (r0 + i) * Hkv * d), kv},
                                         {AT(q->vc[l], at), AT(e->V, (r0 + i) * Hkv * d), kv}};
            LS_TRY(be->copy_blocks(be, jobs, 2, err));
            i += m;
        }
        LS_TRY(be->attention(be, AT(e->Q, r0 * Hq * d), BEV(q->kc[l]), BEV(q->vc[l]), pt, e->page,
                             e->kv_cap, ls_view_at(e->v_pos, r0), AT(e->O, r0 * Hq * d), n, Hq, Hkv, d, act, oa,
                             err));
    }
    /* KV digests: the K row then the V row written at each position, of
     * every KV head (split by head: gathered from the ranks) */
    long W = Hkv * d;
    ls_buf *kr = e->K, *vr = e->V;
    if (e->tp) {
        W = e->m->cfg.n_kv_heads * d;
        LS_TRY(gather_cols(e, BEV(e->K), T, Hkv * d, W, e->kv_share, BEV(e->k_full), err));
        LS_TRY(gather_cols(e, BEV(e->V), T, Hkv * d, W, e->kv_share, BEV(e->v_full), err));
        kr = e->k_full;
        vr = e->v_full;
    }
    for (long r = 0; r < T; r++)
        LS_TRY(dq_push(e, r, tl, LS_DIGEST_KV, span(AT(kr, r * W), 1, W, W, act),
                       span(AT(vr, r * W), 1, W, W, act), err));
    LS_TRY(be->sigmoid_gate(be, BEV(e->O), BEV(e->G), T * Hq * d, act, err));
    if (!e->tp) return lin(e, &w->o, c->hidden, BEV(e->O), BEV(e->A), T, LS_ORDER_CANONICAL, err);
    /* o_proj reads every head: the ranks' heads gathered, in head order */
    long Wo = e->m->cfg.n_heads * d;
    LS_TRY(gather_cols(e, BEV(e->O), T, Hq * d, Wo, 1, BEV(e->tp_in), err));
    return lin(e, &w->o, c->hidden, BEV(e->tp_in), BEV(e->A), T, LS_ORDER_CANONICAL, err);
}

/* ---- expert parallelism (docs/parallel.md §3.1) ----------------------------------------
 * Every rank holds the step's tokens and ran the router on them, so every
 * rank knows every (token, slot) pair's owner: routed slot i of token t
 * belongs to the owner of expert ids[t][i], the shared slot to rank t % ep.
 * A rank computes its pairs' slot rows (moe_slots: the rows moe computes),
 * the ranks gather every rank's rows (exact bytes, rank by rank, each rank's
 * in (token, slot) order), and each rank puts them in slot order and
 * combines them (moe_combine: moe's combine). No operand and no order
 * changes, so the result is moe's, bit for bit. */

static long ep_owner(const ls_engine *e, long t, long i, long k)
{
    return i < k ? e->h_ids[t * k + i] / e->ep_per : t % e->ep;
}

static ls_status moe_ep(ls_engine *e, long l, long T, ls_error *err)
{
    ls_backend *be = e->be;
    const layer_w *w = &e->lw[l];
    long D = e->c.hidden, k = e->c.topk, E = e->c.n_experts;
    int shared = w->moe.sh_gate != NULL;
    long slots = k + shared;
    LS_TRY(be->download(be, e->h_ids, BEV(e->ids), sizeof(int32_t) * (size_t)(T * k), err));
    for (long i = 0; i < T * k; i++)
        if (e->h_ids[i] < 0 || e->h_ids[i] >= E)
            return ls_fail(err, LS_E_INTERNAL, "engine: layer %ld: the router chose expert %d "
                           "for row %ld (experts 0..%ld)", l, e->h_ids[i], i / k, E - 1);
    for (int r = 0; r < e->ep; r++) e->ep_base[r] = 0;
    long n = 0;
    for (long t = 0; t < T; t++)
        for (long i = 0; i < slots; i++) {
            long r = ep_owner(e, t, i, k);
            e->ep_base[r]++;
            if (r != e->ep_rank) continue;
            e->h_pairs[2 * n] = (int32_t)t;
            e->h_pairs[2 * n + 1] = (int32_t)i;
            n++;
        }
    if (n > 0) {
        LS_TRY(be->upload(be, BEV(e->ep_pairs), e->h_pairs, sizeof(int32_t) * (size_t)(2 * n), err));
        LS_TRY(be->moe_slots(be, &w->moe, BEV(e->XN), BEV(e->ids), BEV(e->wts), k, T,
                             BEV(e->ep_pairs), n, BEV(e->ep_rows), e->o.act_bf16,
                             ord(e, l, LS_PERTURB_EXPERTS), err));
        LS_TRY(be->download(be, e->h_rows, BEV(e->ep_rows), sizeof(float) * (size_t)(n * D), err));
    }
    /* each rank's row count becomes its byte count, then its first row */
    long first = 0;
    for (int r = 0; r < e->ep; r++) {
        e->ep_bytes[r] = sizeof(float) * (size_t)(e->ep_base[r] * D);
        long rows = e->ep_base[r];
        e->ep_base[r] = first;
        first += rows;
    }
    LS_TRY(ls_comm_all_gatherv(e->moe_comm, e->h_rows, e->ep_bytes, e->h_all, err));
    for (long t = 0; t < T; t++)
        for (long i = 0; i < slots; i++) {
            long r = ep_owner(e, t, i, k);
            memcpy(e->h_rows + (t * slots + i) * D, e->h_all + e->ep_base[r]++ * D,
                   sizeof(float) * (size_t)D);
        }
    LS_TRY(be->upload(be, BEV(e->ep_all), e->h_rows, sizeof(float) * (size_t)(T * slots * D), err));
    return be->moe_combine(be, BEV(e->ep_all), k, D, shared, BEV(e->A), T, e->o.act_bf16,
                           ord(e, l, LS_PERTURB_COMBINE), err);
}

/* ---- attention-FFN disaggregation AnF (docs/parallel.md §3.2) --------------------------
 * Ranks 0..A-1 run everything but the MoE (A > 1: tensor-parallel, every
 * one holding the same normed rows); per layer rank 0 sends the normed rows
 * XN [T, D] to every FFN rank and takes back the MoE output A [T, D] with
 * the router's ids and weights [T, k] each (for its router digests), all
 * exact bytes, from FFN rank A, and passes them on to attention ranks
 * 1..A-1. The FFN ranks run the router and the MoE on the
 * rows they receive, with the colocated code (F > 1: expert-parallel over
 * their own communicator, every FFN rank ending with the whole output),
 * and hold nothing else. */

/* An attention rank's MoE: rank 0's round trip to FFN rank A, which the
 * other attention ranks take from rank 0; the time from sending the rows
 * (or asking) to the answer is added to *wait_ns. */
static ls_status moe_remote(ls_engine *e, long T, uint64_t *wait_ns, ls_error *err)
{
    ls_backend *be = e->be;
    ls_comm *c = e->o.afd_comm;
    long D = e->c.hidden, k = e->c.topk;
    size_t rows = sizeof(float) * (size_t)(T * D), ik = sizeof(float) * (size_t)(T * k);
    uint64_t t0 = ls_now_ns();
    if (e->afd_rank == 0) {
        LS_TRY(be->download(be, e->h_afd, BEV(e->XN), rows, err));
        t0 = ls_now_ns();
        for (int r = e->afd_att; r < e->afd; r++) LS_TRY(ls_comm_send(c, e->h_afd, rows, r, err));
        LS_TRY(ls_comm_recv(c, e->h_afd, rows + 2 * ik, e->afd_att, err));
        for (int r = 1; r < e->afd_att; r++) LS_TRY(ls_comm_send(c, e->h_afd, rows + 2 * ik, r, err));
    } else {
        LS_TRY(ls_comm_recv(c, e->h_afd, rows + 2 * ik, 0, err));
    }
    *wait_ns += ls_now_ns() - t0;
    LS_TRY(be->upload(be, BEV(e->A), e->h_afd, rows, err));
    LS_TRY(be->upload(be, BEV(e->ids), e->h_afd + T * D, ik, err));
    return be->upload(be, BEV(e->wts), e->h_afd + T * D + T * k, ik, err);
}

/* An FFN rank's forward: the MoE of every layer on the rows rank 0 sends;
 * FFN rank A answers. */
static ls_status forward_ffn(ls_engine *e, long T, ls_error *err)
{
    ls_backend *be = e->be;
    const ls_model_config *c = &e->c;
    int act = e->o.act_bf16;
    long D = c->hidden, k = c->topk;
    size_t rows = sizeof(float) * (size_t)(T * D), ik = sizeof(float) * (size_t)(T * k);
    for (long l = 0; l < c->n_layers; l++) {
        layer_w *w = &e->lw[l];
        uint64_t t0 = ls_now_ns();
        LS_TRY(ls_comm_recv(e->o.afd_comm, e->h_afd, rows, 0, err));
        uint64_t t1 = ls_now_ns();
        /* before the first step's rows rank 0 was still starting (its
         * manifest, the checkpoint's hash): not a bubble of the pipeline */
        if (e->afd_steps > 0 || l > 0) e->afd_ns[2 * l + 1] += t1 - t0;
        LS_TRY(be->upload(be, BEV(e->XN), e->h_afd, rows, err));
        LS_TRY(be->router(be, &w->router, BEV(e->XN), T, k, c->norm_topk_prob, BEV(e->probs),
                          BEV(e->ids), BEV(e->wts), act, ord(e, l, LS_PERTURB_ROUTER), err));
        if (e->ep)
            LS_TRY(moe_ep(e, l, T, err));
        else
            LS_TRY(be->moe(be, &w->moe, BEV(e->XN), BEV(e->ids), BEV(e->wts), k, BEV(e->A), T, act,
                           ord(e, l, LS_PERTURB_EXPERTS), ord(e, l, LS_PERTURB_COMBINE), err));
        if (e->afd_rank == e->afd_att) {
            LS_TRY(be->download(be, e->h_afd, BEV(e->A), rows, err));
            LS_TRY(be->download(be, e->h_afd + T * D, BEV(e->ids), ik, err));
            LS_TRY(be->download(be, e->h_afd + T * D + T * k, BEV(e->wts), ik, err));
            LS_TRY(ls_comm_send(e->o.afd_comm, e->h_afd, rows + 2 * ik, 0, err));
        } else {
            /* a download returns when the device is done (CUDA runs the
             * combine after the host moved on), so the busy time below is the
             * device's, not the launches' */
            LS_TRY(be->download(be, e->h_afd, BEV(e->A), sizeof(float), err));
        }
        e->afd_ns[2 * l] += ls_now_ns() - t1;
    }
    return LS_OK;
}

/* After the step (its digests complete): rank 0 sends what the records
 * read — the logprob rows, their summary and every digest slot — and every
 * FFN rank takes them, so all ranks record and sample alike (the other
 * attention ranks computed the same themselves, as a tensor-parallel group
 * does). The FFN ranks have no logprob rows of their own to fetch later. */
static ls_status afd_records(ls_engine *e, long T, ls_error *err)
{
    ls_comm *c = e->o.afd_comm;
    size_t lp = sizeof(float) * (size_t)(T * e->c.vocab), cells = (size_t)(T * e->n_slots);
    size_t sum = 4 * (size_t)(T * LS_LP_SUMMARY_WORDS(e->lp_k));
    if (e->afd_rank > 0 && e->afd_rank < e->afd_att) return LS_OK;
    if (e->afd_rank == 0) {
        LS_TRY(ls_engine_lp_rows(e, err));
        for (int r = e->afd_att; r < e->afd; r++) {
            LS_TRY(ls_comm_send(c, e->h_lp, lp, r, err));
            LS_TRY(ls_comm_send(c, e->h_lps, sum, r, err));
            LS_TRY(ls_comm_send(c, e->dig, cells * sizeof *e->dig, r, err));
            LS_TRY(ls_comm_send(c, e->have, cells, r, err));
        }
        return LS_OK;
    }
    LS_TRY(ls_comm_recv(c, e->h_lp, lp, 0, err));
    LS_TRY(ls_comm_recv(c, e->h_lps, sum, 0, err));
    e->lp_full = 1;
    LS_TRY(ls_comm_recv(c, e->dig, cells * sizeof *e->dig, 0, err));
    return ls_comm_recv(c, e->have, cells, 0, err);
}

/* The step's input layout for T rows (engine_internal.h: inb, h_in). */
static void in_layout(ls_engine *e, long T)
{
    long half = e->c.rotary_dims / 2;
    e->h_tok = (int32_t *)e->h_in;
    e->h_next = (int32_t *)e->h_in + T;
    e->h_pos = (int32_t *)e->h_in + 2 * T;
    e->h_cos = (float *)(e->h_in + 3 * T);
    e->h_sin = (float *)(e->h_in + 3 * T + T * half);
    e->v_tok = BEV(e->inb);
    e->v_next = AT(e->inb, T);
    e->v_pos = AT(e->inb, 2 * T);
    e->v_cos = AT(e->inb, 3 * T);
    e->v_sin = AT(e->inb, 3 * T + T * half);
}

/* H_next = act(H + A), XN = rmsnorm(H_next) with w; then H_next is H. H's
 * rows before the add stay in the other buffer until the next add, so their
 * digest may still be queued (one flush a layer, before its second add). */
static ls_status residual_rmsnorm(ls_engine *e, ls_buf *w, ls_order o, long T, ls_error *err)
{
    long D = e->c.hidden;
    LS_TRY(e->be->residual_rmsnorm(e->be, BEV(e->H), BEV(e->A), BEV(e->H_next), BEV(w), BEV(e->XN), T, D,
                                   e->o.act_bf16, o, err));
    ls_buf *h = e->H;
    e->H = e->H_next;
    e->H_next = h;
    return LS_OK;
}

/* The device work of a step, after its inputs' upload: the layers, the
 * lm_head, the logprobs and their summary (not downloaded). */
static ls_status device_step(ls_engine *e, const seg *sg, long nseg, long T, uint64_t *t_layers, ls_error *err)
{
    ls_backend *be = e->be;
    const ls_model_config *c = &e->c;
    int act = e->o.act_bf16;
    long D = c->hidden, V = c->vocab, k = c->topk, L = c->n_layers;
    LS_TRY(be->embed(be, &e->embed, e->v_tok, T, BEV(e->H), act, err));
    LS_TRY(dq_rows(e, e->H, D, T, 0, 0, err));
    /* Every norm of the hidden rows but the first follows a residual add:
     * the two are one call (residual_rmsnorm). */
    LS_TRY(be->rmsnorm(be, BEV(e->H), BEV(e->lw[0].in_norm), BEV(e->XN), T, D, act,
                       ord(e, 0, LS_PERTURB_NORM), err));
    for (long l = 0; l < L; l++) {
        layer_w *w = &e->lw[l];
        ls_order on = ord(e, l, LS_PERTURB_NORM);
        uint64_t t_layer = ls_now_ns(), wait = 0;
        if (c->is_attention[l]) LS_TRY(attn_layer(e, l, sg, nseg, T, err));
        else LS_TRY(gdn_layer(e, l, sg, nseg, T, err));
        LS_TRY(residual_rmsnorm(e, w->post_norm, on, T, err));
        LS_TRY(dq_rows(e, e->H, D, T, mixer_tl(l), 0, err));
        if (e->afd) /* the router's ids and weights come back with the MoE's rows */
            LS_TRY(moe_remote(e, T, &wait, err));
        else
            LS_TRY(be->router(be, &w->router, BEV(e->XN), T, k, c->norm_topk_prob, BEV(e->probs),
                              BEV(e->ids), BEV(e->wts), act, ord(e, l, LS_PERTURB_ROUTER), err));
        int tl = mixer_tl(l) + 1;
        /* ids are int32 and weights fp32, both hashed as raw 4 bytes little-endian. */
        for (long r = 0; r < T; r++)
            LS_TRY(dq_push(e, r, tl, LS_DIGEST_ROUTER, span(AT(e->ids, r * k), 1, k, k, 0),
                           span(AT(e->wts, r * k), 1, k, k, 0), err));
        /* the next residual add writes where the layer's input rows are: their
         * digest, the mixer's (KV, states), its rows and the router's go now,
         * read while the experts run (which write none of them), fenced
         * before that add */
        LS_TRY(dq_flush_early(e, err));
        if (!e->afd && e->ep)
            LS_TRY(moe_ep(e, l, T, err));
        else if (!e->afd)
            LS_TRY(be->moe(be, &w->moe, BEV(e->XN), BEV(e->ids), BEV(e->wts), k, BEV(e->A), T, act,
                           ord(e, l, LS_PERTURB_EXPERTS), ord(e, l, LS_PERTURB_COMBINE), err));
        LS_TRY(dq_fence(e, err));
        /* the next layer's input norm, or after the last the final norm */
        ls_buf *next_norm = l + 1 < L ? e->lw[l + 1].in_norm : e->final_norm;
        LS_TRY(residual_rmsnorm(e, next_norm, ord(e, l + 1, LS_PERTURB_NORM), T, err));
        LS_TRY(dq_rows(e, e->H, D, T, tl, 0, err));
        if (e->afd) {
            uint64_t span_ns = ls_now_ns() - t_layer;
            e->afd_ns[2 * l] += span_ns - wait;
            e->afd_ns[2 * l + 1] += wait;
            *t_layers += span_ns;
        }
    }
    LS_TRY(dq_rows(e, e->XN, D, T, e->n_tl - 2, 0, err));
    LS_TRY(lm_head(e, T, err));
    LS_TRY(be->logprobs(be, BEV(e->logits), BEV(e->lp), T, V, LS_ORDER_CANONICAL, err));
    LS_TRY(be->lp_summary(be, BEV(e->lp), e->v_next, T, V, e->lp_k, BEV(e->lps), err));
    return dq_fence(e, err); /* the logits' digests (lm_head) */
}

/* ---- step graphs -------------------------------------------------------------------
 * A pipelined decode step of one sequence takes no host value into its
 * launches that changes from one step to the next: its positions, tokens
 * and rope rows are read from the uploaded inputs, the KV append's position
 * too (kv_append_batch), its buffers and the slot's states are fixed, and
 * the recurrent GDN form does not depend on the position. Such a step is
 * recorded once per bank (the digests it writes are the bank's) and slot,
 * after one run as it is (which sets up what a recording cannot: the MoE's
 * tables, the digester), and replayed from then on; its digests' slots are
 * marked as recording them marked them. A step with a carried-state digest
 * due, of more rows or sequences, or under TP, EP, AFD, layer dumps or the
 * chunk-aligned GDN form runs as it is. A recording that fails turns graphs
 * off for the engine (ls_engine_step_graph_stats says why) and the step runs
 * as it is. */
static int graph_fits(const ls_engine *e, const seg *sg, long nseg)
{
    const ls_backend *be = e->be;
    return e->graphs_on && be->graph_begin && be->kv_append_batch && be->attention_batch && !e->step_alone &&
           !e->dumping && !e->tp && !e->ep && !e->afd && !e->o.gdn_chunked && nseg == 1 && sg[0].n == 1 &&
           !state_due(e, &sg[0], 0);
}

static ls_status graph_launch(ls_engine *e, struct ls_engine_graph *g, ls_error *err)
{
    memcpy(e->have, g->have, (size_t)e->n_slots);
    memcpy(e->dig, g->dig, sizeof *e->dig * (size_t)e->n_slots);
    LS_TRY(e->be->graph_launch(e->be, g->g, err));
    e->graph_launches++;
    return LS_OK;
}

static ls_status graph_step(ls_engine *e, const seg *sg, long nseg, long T, uint64_t *t_layers, ls_error *err)
{
    if (!graph_fits(e, sg, nseg)) return device_step(e, sg, nseg, T, t_layers, err);
    ls_backend *be = e->be;
    struct ls_engine_graph *g = &e->graphs[e->bank];
    if (g->slot == sg[0].slot && g->H == e->H) return graph_launch(e, g, err);
    if (!e->graph_warm) {
        e->graph_warm = 1;
        return device_step(e, sg, nseg, T, t_layers, err);
    }
    ls_buf *H = e->H;
    ls_error rerr;
    ls_error_clear(&rerr);
    g->slot = -1;
    ls_status st = be->graph_begin(be, &g->g, &rerr);
    if (st == LS_OK) {
        st = device_step(e, sg, nseg, T, t_layers, &rerr);
        ls_error ignored;
        ls_status est = be->graph_end(be, g->g, st == LS_OK, st == LS_OK ? &rerr : &ignored);
        if (st == LS_OK) st = est;
    }
    if (st != LS_OK) { /* nothing ran: the step runs as it is */
        e->graphs_on = 0;
        snprintf(e->graph_off, sizeof e->graph_off, "%s", rerr.msg);
        if (e->H != H) {
            e->H_next = e->H;
            e->H = H;
        }
        e->n_jobs = 0;
        memset(e->have, 0, (size_t)(T * e->n_slots));
        return device_step(e, sg, nseg, T, t_layers, err);
    }
    g->slot = sg[0].slot;
    g->H = H;
    memcpy(g->have, e->have, (size_t)e->n_slots);
    memcpy(g->dig, e->dig, sizeof *e->dig * (size_t)e->n_slots);
    e->graph_records++;
    return graph_launch(e, g, err);
}

static ls_status forward(ls_engine *e, const seg *sg, long nseg, ls_error *err)
{
    ls_backend *be = e->be;
    const ls_model_config *c = &e->c;
    int act = e->o.act_bf16;
    long V = c->vocab, T = 0;
    e->step_rows = 0;
    e->lp_full = 0;
    in_layout(e, nseg > 0 ? sg[nseg - 1].row0 + sg[nseg - 1].n : 0);
    for (long s = 0; s < nseg; s++) {
        seq_state *q = &e->ss[sg[s].slot];
        if (sg[s].pos0 != q->len || q->len + sg[s].n > e->cap)
            return ls_fail(err, LS_E_USAGE, "engine: sequence %u needs positions up to %ld "
                           "(capacity %ld)", q->id, q->len + sg[s].n, e->cap);
        for (long i = 0; i < sg[s].n; i++) {
            e->h_tok[T] = sg[s].tokens[i];
            e->h_next[T] = i + 1 < sg[s].n || sg[s].follows ? sg[s].tokens[i + 1] : -1;
            e->h_pos[T] = (int32_t)(sg[s].pos0 + i);
            e->row_seq[T] = (int32_t)q->id;
            if (sg[s].tokens[i] < 0 || sg[s].tokens[i] >= V)
                return ls_fail(err, LS_E_INPUT, "sequence %u: token id %d at position %ld is outside "
                               "the vocabulary (0..%ld)", q->id, sg[s].tokens[i], sg[s].pos0 + i, V - 1);
            /* A vision placeholder stands for image or video features that a
             * text-only decoder does not have: refused, not embedded as text. */
            int v = ls_model_vision_token(c, sg[s].tokens[i]);
            if (v >= 0)
                return ls_fail(err, LS_E_INPUT, "sequence %u: token id %d at position %ld is "
                               "the model's %s placeholder (config.json field '%s'): vision "
                               "input is not supported (text only)", q->id, sg[s].tokens[i],
                               sg[s].pos0 + i, v ? "video" : "image", v ? "video_token_id" : "image_token_id");
            T++;
        }
    }
    e->n_jobs = 0;
    memset(e->have, 0, (size_t)(T * e->n_slots));
    if (e->dumping) memset(e->dump_elems, 0, sizeof(uint32_t) * (size_t)(T * e->n_slots));
    if (e->afd && e->afd_rank >= e->afd_att) {
        LS_TRY(forward_ffn(e, T, err));
        e->afd_steps++, e->afd_rows += T;
        for (long s = 0; s < nseg; s++) e->ss[sg[s].slot].len += sg[s].n;
        e->step_rows = T;
        return LS_OK;
    }
    uint64_t t_head = ls_now_ns(), t_layers = 0; /* AFD: rank 0's time outside the layers */
    long half = c->rotary_dims / 2;
    ls_cpu_rope_table(e->h_pos, T, c->rotary_dims, c->rope_theta, e->h_cos, e->h_sin, act);
    LS_TRY(be->upload(be, BEV(e->inb), e->h_in, (size_t)(3 * T + 2 * T * half) * 4, err));
    LS_TRY(graph_step(e, sg, nseg, T, &t_layers, err));
    LS_TRY(be->download(be, e->h_lps, BEV(e->lps), (size_t)(T * LS_LP_SUMMARY_WORDS(e->lp_k)) * 4, err));
    if (e->afd) {
        e->afd_head_ns += ls_now_ns() - t_head - t_layers;
        e->afd_steps++, e->afd_rows += T;
    }
    for (long s = 0; s < nseg; s++) e->ss[sg[s].slot].len += sg[s].n;
    e->step_rows = T;
    return LS_OK;
}

ls_status ls_engine_forward(ls_engine *e, const seg *sg, long nseg, ls_error *err)
{
    ls_status st = forward(e, sg, nseg, err);
    /* The digests may still be on their way (an asynchronous backend): the
     * records wait for them (ls_engine_step_end), but on failure nothing may
     * write into the engine after this returns, and rank 0 of an AFD group
     * sends them at once. */
    if (e->be->digest_wait && (st != LS_OK || e->afd)) {
        ls_error werr;
        ls_status ws = e->be->digest_wait(e->be, LS_DIGEST_ALL, st == LS_OK ? err : &werr);
        if (st == LS_OK) st = ws;
    }
    if (st == LS_OK && e->afd) st = afd_records(e, e->step_rows, err);
    return st;
}

ls_status ls_engine_afd_balance(ls_engine *e, ls_afd_balance *out, ls_error *err)
{
    memset(out, 0, sizeof *out);
    if (!e->afd) return ls_fail(err, LS_E_USAGE, "engine: the attention-FFN balance of an engine without afd_comm");
    long L = e->c.n_layers;
    int F = e->afd - e->afd_att;
    size_t bytes = sizeof(uint64_t) * (size_t)(2 * L);
    if (e->afd_rank >= e->afd_att) return ls_comm_send(e->o.afd_comm, e->afd_ns, bytes, 0, err);
    if (e->afd_rank > 0) return LS_OK; /* another attention rank: rank 0's times speak for the group */
    uint64_t *ffn = malloc(bytes);
    size_t nt = (size_t)(2 * L + 2 * F * L);
    double *t = calloc(nt, sizeof(double));
    if (!ffn || !t) {
        free(ffn), free(t);
        return ls_fail_nomem(err, bytes + sizeof(double) * nt, "engine: the attention-FFN balance");
    }
    out->n_layers = L, out->steps = e->afd_steps, out->rows = e->afd_rows, out->n_ffn = F;
    out->attn_busy_s = t, out->attn_wait_s = t + L, out->ffn_busy_s = t + 2 * L, out->ffn_wait_s = t + 2 * L + F * L;
    for (long l = 0; l < L; l++) {
        out->attn_busy_s[l] = (double)e->afd_ns[2 * l] / 1e9;
        out->attn_wait_s[l] = (double)e->afd_ns[2 * l + 1] / 1e9;
    }
    out->attn_head_s = (double)e->afd_head_ns / 1e9;
    ls_status st = LS_OK;
    for (int f = 0; st == LS_OK && f < F; f++) {
        st = ls_comm_recv(e->o.afd_comm, ffn, bytes, e->afd_att + f, err);
        for (long l = 0; st == LS_OK && l < L; l++) {
            out->ffn_busy_s[f * L + l] = (double)ffn[2 * l] / 1e9;
            out->ffn_wait_s[f * L + l] = (double)ffn[2 * l + 1] / 1e9;
        }
    }
    free(ffn);
    if (st != LS_OK) ls_afd_balance_free(out);
    return st;
}

void ls_afd_balance_free(ls_afd_balance *b)
{
    free(b->attn_busy_s); /* one block for every array */
    memset(b, 0, sizeof *b);
}
