/* lockstep — the rollout, replay and continuous-batching drivers; see
 * drive.h. They use the engine's public step API only. */
#include "run/drive.h"

#include <stdlib.h>
#include <string.h>

/* ---- the step pipeline (drive.h) -------------------------------------------------------- */

ls_run_pipe ls_run_pipe_open(ls_engine *e, ls_run_sink sink, void *ctx)
{
    return (ls_run_pipe){e, sink, ctx, ls_engine_pipelines(e), 0, LS_FRAME_PREFILL, NULL, 0};
}

ls_status ls_run_pipe_end(ls_run_pipe *p, ls_error *err)
{
    if (!p->pending) return LS_OK;
    p->pending = 0;
    LS_TRY(ls_engine_step_end(p->e, err));
    return p->sink(p->ctx, p->kind, p->rec0, p->rows, err);
}

ls_status ls_run_pipe_push(ls_run_pipe *p, ls_frame_kind kind, const ls_trace_record *rec0, long rows,
                           ls_error *err)
{
    if (p->on) LS_TRY(ls_run_pipe_end(p, err));
    p->pending = 1, p->kind = kind, p->rec0 = rec0, p->rows = rows;
    return p->on ? LS_OK : ls_run_pipe_end(p, err);
}

ls_status ls_run_pipe_close(ls_run_pipe *p, ls_status st, ls_error *err)
{
    if (st == LS_OK) return ls_run_pipe_end(p, err);
    /* the pending step, and a step begun after it whose records failed */
    ls_error ignored;
    for (int i = 0; i < 2; i++) ls_engine_step_end(p->e, &ignored);
    p->pending = 0;
    return st;
}

/* ---- rollout ---------------------------------------------------------------------------- */

ls_status ls_run_rollout(ls_engine *e, const ls_sequence *seqs, long n_seqs, long max_new,
                         const ls_sampling *sampling, int32_t *completion, ls_run_sink sink,
                         void *ctx, ls_error *err)
{
    long T = ls_engine_max_rows(e);
    if (n_seqs < 1 || n_seqs > ls_engine_max_seqs(e))
        return ls_fail(err, LS_E_USAGE, "rollout: %ld sequences (engine holds %ld)", n_seqs, ls_engine_max_seqs(e));
    if (max_new < 1) return ls_fail(err, LS_E_USAGE, "rollout: max_new must be >= 1");
    for (long i = 0; i < n_seqs; i++) {
        if (seqs[i].n_tokens < 1)
            return ls_fail(err, LS_E_INPUT, "rollout: sequence %u has an empty prompt", seqs[i].id);
        if (seqs[i].n_tokens + max_new - 1 > ls_engine_capacity(e))
            return ls_fail(err, LS_E_USAGE, "rollout: sequence %u needs %ld positions (capacity %ld)",
                           seqs[i].id, seqs[i].n_tokens + max_new - 1, ls_engine_capacity(e));
    }
    for (long i = 0; i < ls_engine_max_seqs(e); i++) ls_engine_leave(e, i);
    for (long i = 0; i < n_seqs; i++) LS_TRY(ls_engine_join(e, i, seqs[i].id, seqs[i].n_tokens, err));
    int32_t *gen = calloc((size_t)(n_seqs * max_new), sizeof(int32_t)); /* [n_seqs, max_new] */
    long *done = calloc((size_t)n_seqs, sizeof(long));
    ls_engine_item *it = calloc((size_t)T, sizeof *it);
    if (!gen || !done || !it) {
        free(gen), free(done), free(it);
        return ls_fail(err, LS_E_NOMEM, "rollout: out of memory");
    }
    ls_status st = LS_OK;
    const ls_trace_record *rec0 = NULL; /* row 0's record: a step's records are contiguous */
    ls_run_pipe pl = ls_run_pipe_open(e, sink, ctx);
    /* Prefill, packed, at most T rows per step. */
    while (st == LS_OK) {
        long n = 0, rows = 0;
        for (long i = 0; i < n_seqs && rows < T; i++) {
            long left = seqs[i].n_tokens - done[i];
            if (left <= 0) continue;
            long take = left < T - rows ? left : T - rows;
            it[n++] = (ls_engine_item){i, seqs[i].tokens + done[i], take,
                                       max_new == 1 && take == left, take < left};
            rows += take;
        }
        if (n == 0) break;
        st = ls_engine_step_begin(e, it, n, err);
        for (long s = 0, r = 0; st == LS_OK && s < n; s++) {
            long i = it[s].slot;
            for (long j = 0; st == LS_OK && j < it[s].n; j++, r++) {
                long pos = done[i] + j;
                int32_t next;
                if (pos + 1 < seqs[i].n_tokens) next = seqs[i].tokens[pos + 1];
                else {
                    st = ls_engine_sample(e, r, sampling, seqs[i].id, (uint32_t)(pos + 1), &next, err);
                    gen[i * max_new] = next;
                }
                const ls_trace_record *rec = NULL;
                if (st == LS_OK) st = ls_engine_record(e, r, next, &rec, err);
                if (r == 0) rec0 = rec;
            }
            done[i] += it[s].n;
        }
        if (st == LS_OK) st = ls_run_pipe_push(&pl, LS_FRAME_PREFILL, rec0, rows, err);
    }
    /* Decode: one token per sequence per step. */
    for (long step = 1; st == LS_OK && step < max_new; step++) {
        for (long b0 = 0; st == LS_OK && b0 < n_seqs; b0 += T) {
            long nb = n_seqs - b0 < T ? n_seqs - b0 : T;
            for (long s = 0; s < nb; s++) {
                long i = b0 + s;
                it[s] = (ls_engine_item){i, &gen[i * max_new + step - 1], 1, step == max_new - 1, 0};
            }
            st = ls_engine_step_begin(e, it, nb, err);
            for (long s = 0; st == LS_OK && s < nb; s++) {
                long i = b0 + s;
                int32_t next;
                st = ls_engine_sample(e, s, sampling, seqs[i].id, (uint32_t)(seqs[i].n_tokens + step),
                                      &next, err);
                gen[i * max_new + step] = next;
                const ls_trace_record *rec = NULL;
                if (st == LS_OK) st = ls_engine_record(e, s, next, &rec, err);
                if (s == 0) rec0 = rec;
            }
            if (st == LS_OK) st = ls_run_pipe_push(&pl, LS_FRAME_DECODE, rec0, nb, err);
        }
    }
    st = ls_run_pipe_close(&pl, st, err);
    if (st == LS_OK && completion) memcpy(completion, gen, sizeof(int32_t) * (size_t)(n_seqs * max_new));
    for (long i = 0; i < n_seqs; i++) ls_engine_leave(e, i);
    free(done), free(gen), free(it);
    return st;
}

/* ---- replay ------------------------------------------------------------------------------ */

ls_status ls_run_replay(ls_engine *e, const ls_sequence *seqs, long n_seqs, long chunk,
                        ls_run_sink sink, void *ctx, ls_error *err)
{
    long T = ls_engine_max_rows(e);
    if (n_seqs < 1 || n_seqs > ls_engine_max_seqs(e))
        return ls_fail(err, LS_E_USAGE, "replay: %ld sequences (engine holds %ld)", n_seqs, ls_engine_max_seqs(e));
    if (chunk < 1) return ls_fail(err, LS_E_USAGE, "replay: chunk must be >= 1");
    for (long i = 0; i < n_seqs; i++) {
        if (seqs[i].n_tokens < 2)
            return ls_fail(err, LS_E_INPUT, "replay: sequence %u has %ld tokens (need a prompt and "
                           "at least one completion token)", seqs[i].id, seqs[i].n_tokens);
        if (seqs[i].n_tokens - 1 > ls_engine_capacity(e))
            return ls_fail(err, LS_E_USAGE, "replay: sequence %u needs %ld positions (capacity %ld)",
                           seqs[i].id, seqs[i].n_tokens - 1, ls_engine_capacity(e));
    }
    for (long i = 0; i < ls_engine_max_seqs(e); i++) ls_engine_leave(e, i);
    for (long i = 0; i < n_seqs; i++) LS_TRY(ls_engine_join(e, i, seqs[i].id, seqs[i].prompt_len, err));
    ls_engine_item *it = calloc((size_t)T, sizeof *it);
    long *done = calloc((size_t)n_seqs, sizeof(long));
    if (!it || !done) {
        free(it), free(done);
        return ls_fail(err, LS_E_NOMEM, "replay: out of memory");
    }
    ls_status st = LS_OK;
    const ls_trace_record *rec0 = NULL;
    ls_run_pipe pl = ls_run_pipe_open(e, sink, ctx);
    long start = 0; /* rotate which sequence gets rows first when the budget is short */
    while (st == LS_OK) {
        long n = 0, rows = 0;
        for (long o = 0; o < n_seqs && rows < T; o++) {
            long i = (start + o) % n_seqs;
            long left = seqs[i].n_tokens - 1 - done[i];
            if (left <= 0) continue;
            long take = left < chunk ? left : chunk;
            if (take > T - rows) take = T - rows;
            it[n++] = (ls_engine_item){i, seqs[i].tokens + done[i], take, take == left, 1};
            rows += take;
        }
        if (n == 0) break;
        start++;
        st = ls_engine_step_begin(e, it, n, err);
        for (long s = 0, r = 0; st == LS_OK && s < n; s++) {
            long i = it[s].slot;
            for (long j = 0; st == LS_OK && j < it[s].n; j++, r++) {
                const ls_trace_record *rec = NULL;
                st = ls_engine_record(e, r, seqs[i].tokens[done[i] + j + 1], &rec, err);
                if (r == 0) rec0 = rec;
            }
            done[i] += it[s].n;
        }
        if (st == LS_OK) st = ls_run_pipe_push(&pl, LS_FRAME_CHUNK, rec0, rows, err);
    }
    st = ls_run_pipe_close(&pl, st, err);
    for (long i = 0; i < n_seqs; i++) ls_engine_leave(e, i);
    free(it), free(done);
    return st;
}

/* ---- continuous batching ---------------------------------------------------------------- */

typedef struct serve_seq {
    int32_t *tok;              /* [prompt_len + max_new] prompt, then generated tokens */
    long fed;                  /* positions processed */
    long gen;                  /* tokens generated */
    long slot;                 /* -1 = waiting or finished */
    int finished;
} serve_seq;

ls_status ls_run_serve(ls_engine *e, const ls_run_request *reqs, long n, const ls_sampling *sampling,
                       ls_run_sink sink, void *ctx, ls_error *err)
{
    long T = ls_engine_max_rows(e), S = ls_engine_max_seqs(e);
    if (n < 1) return ls_fail(err, LS_E_USAGE, "serve: no requests");
    for (long i = 0; i < n; i++) {
        const ls_run_request *q = &reqs[i];
        if (q->prompt_len < 1 || q->max_new < 1 || q->prefill_chunk < 1 || q->arrival_step < 0)
            return ls_fail(err, LS_E_USAGE, "serve: request %u needs prompt_len, max_new and "
                           "prefill_chunk >= 1 and arrival_step >= 0", q->id);
        if (q->prompt_len + q->max_new - 1 > ls_engine_capacity(e))
            return ls_fail(err, LS_E_USAGE, "serve: request %u needs %ld positions (capacity %ld)",
                           q->id, q->prompt_len + q->max_new - 1, ls_engine_capacity(e));
    }
    serve_seq *q = calloc((size_t)n, sizeof *q);
    ls_engine_item *it = calloc((size_t)T, sizeof *it);
    long *who = calloc((size_t)T, sizeof *who);
    unsigned char *used = calloc((size_t)S, 1);
    ls_status st = q && it && who && used ? LS_OK : ls_fail(err, LS_E_NOMEM, "serve: out of memory");
    for (long i = 0; st == LS_OK && i < n; i++) {
        q[i].slot = -1;
        q[i].tok = malloc(sizeof(int32_t) * (size_t)(reqs[i].prompt_len + reqs[i].max_new));
        if (!q[i].tok) st = ls_fail(err, LS_E_NOMEM, "serve: out of memory");
        else memcpy(q[i].tok, reqs[i].prompt, sizeof(int32_t) * (size_t)reqs[i].prompt_len);
    }
    for (long s = 0; st == LS_OK && s < S; s++) ls_engine_leave(e, s);
    ls_run_pipe pl = ls_run_pipe_open(e, sink, ctx);
    long finished = 0;
    for (long step = 0; st == LS_OK && finished < n; step++) {
        /* Join: free slots go to waiting requests whose arrival has come. */
        for (long i = 0, s = 0; st == LS_OK && i < n; i++) {
            if (q[i].slot >= 0 || q[i].finished || reqs[i].arrival_step > step) continue;
            while (s < S && used[s]) s++;
            if (s == S) break;
            st = ls_engine_join(e, s, reqs[i].id, reqs[i].prompt_len, err);
            used[s] = 1;
            q[i].slot = s;
        }
        long k = 0, rows = 0, decode = 0;
        for (long i = 0; st == LS_OK && i < n && rows < T; i++) {
            if (q[i].slot < 0) continue;
            const ls_run_request *r = &reqs[i];
            long take = q[i].fed < r->prompt_len ? r->prompt_len - q[i].fed : 1;
            if (take > r->prefill_chunk) take = r->prefill_chunk;
            if (take > T - rows) take = T - rows;
            decode += q[i].fed >= r->prompt_len;
            long last_pos = r->prompt_len + r->max_new - 2;
            it[k] = (ls_engine_item){q[i].slot, q[i].tok + q[i].fed, take, q[i].fed + take - 1 == last_pos,
                                     q[i].fed + take < r->prompt_len};
            who[k++] = i;
            rows += take;
        }
        if (st != LS_OK || k == 0) continue;
        st = ls_engine_step_begin(e, it, k, err);
        const ls_trace_record *rec0 = NULL;
        for (long j = 0, row = 0; st == LS_OK && j < k; j++) {
            serve_seq *x = &q[who[j]];
            const ls_run_request *r = &reqs[who[j]];
            for (long t = 0; st == LS_OK && t < it[j].n; t++, row++) {
                long p = x->fed + t;
                int32_t next = -1;
                if (p + 1 < r->prompt_len) next = x->tok[p + 1];
                else if (x->gen < r->max_new) {
                    st = ls_engine_sample(e, row, sampling, r->id, (uint32_t)(p + 1), &next, err);
                    x->tok[r->prompt_len + x->gen] = next;
                    if (r->completion) r->completion[x->gen] = next;
                    x->gen++;
                }
                const ls_trace_record *rec = NULL;
                if (st == LS_OK) st = ls_engine_record(e, row, next, &rec, err);
                if (row == 0) rec0 = rec;
            }
            x->fed += it[j].n;
            if (x->fed == r->prompt_len + r->max_new - 1) {
                ls_engine_leave(e, x->slot);
                used[x->slot] = 0;
                x->slot = -1;
                x->finished = 1;
                finished++;
            }
        }
        if (st == LS_OK) st = ls_run_pipe_push(&pl, decode ? LS_FRAME_DECODE : LS_FRAME_PREFILL, rec0, rows, err);
    }
    st = ls_run_pipe_close(&pl, st, err);
    for (long i = 0; q && i < n; i++) {
        if (q[i].slot >= 0) ls_engine_leave(e, q[i].slot);
        free(q[i].tok);
    }
    free(q), free(it), free(who), free(used);
    return st;
}
