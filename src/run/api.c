/* lockstep — the public C API (include/lockstep/lockstep.h) over the run
 * layer, the comparator and the report writers.
 *
 * The public types mirror internal ones but are never cast to them: each
 * call copies what it needs, so the internal structs may change without
 * touching the ABI the header promises. */
#include "lockstep/lockstep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/compare.h"
#include "core/status.h"
#include "core/util.h"
#include "fingerprint/fingerprint.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "report/report.h"
#include "run/load.h"
#include "run/run.h"
#include "synth/synth.h"

/* The public status values are the internal ones, so a status converts by
 * value; these fail the build if either enum moves. */
_Static_assert(LOCKSTEP_OK == (int)LS_OK && LOCKSTEP_E_USAGE == (int)LS_E_USAGE &&
                   LOCKSTEP_E_INPUT == (int)LS_E_INPUT &&
                   LOCKSTEP_E_UNSUPPORTED == (int)LS_E_UNSUPPORTED && LOCKSTEP_E_IO == (int)LS_E_IO &&
                   LOCKSTEP_E_NOMEM == (int)LS_E_NOMEM && LOCKSTEP_E_DEVICE == (int)LS_E_DEVICE &&
                   LOCKSTEP_E_CRYPTO == (int)LS_E_CRYPTO && LOCKSTEP_E_INTERNAL == (int)LS_E_INTERNAL,
               "lockstep_status and ls_status must agree value for value");
_Static_assert(LOCKSTEP_ERROR_MESSAGE_BYTES >= LS_ERROR_MSG_BYTES, "an ls_error message must fit");

struct lockstep_checkpoint {
    char *dir;                     /* the directory as given; owned */
    ls_checkpoint *ck;             /* open for the handle's life: fp's tensor names borrow from it */
    ls_fingerprint fp;             /* every tensor hashed once, reused by every run */
    char fingerprint_hex[65];
    long vocab, n_layers;
    int have_last;
    lockstep_run_summary last;     /* the last successful run; last.completions = completions */
    int32_t *completions;          /* [last.n_sequences, last.max_new_tokens]; owned */
};

/* ---- version and errors ------------------------------------------------------------- */

unsigned lockstep_version_number(void)
{
    return LOCKSTEP_VERSION_NUMBER;
}

const char *lockstep_version(void)
{
    return LOCKSTEP_VERSION_STRING;
}

const char *lockstep_status_name(lockstep_status st)
{
    return (unsigned)st <= LOCKSTEP_E_INTERNAL ? ls_status_name((ls_status)st) : "?";
}

/* Hands an internal status and message to the caller's lockstep_error. */
static lockstep_status finish(ls_status st, const ls_error *e, lockstep_error *out)
{
    if (out) {
        out->status = (lockstep_status)st;
        if (st == LS_OK) out->message[0] = '\0';
        else if (e && e->msg[0]) snprintf(out->message, sizeof out->message, "%s", e->msg);
        else snprintf(out->message, sizeof out->message, "%s error", ls_status_name(st));
    }
    return (lockstep_status)st;
}

/* ---- checkpoints ---------------------------------------------------------------------- */

lockstep_status lockstep_checkpoint_open(const char *dir, lockstep_checkpoint **out, lockstep_error *err)
{
    ls_error e;
    ls_error_clear(&e);
    if (!out) return finish(ls_fail(&e, LS_E_USAGE, "lockstep_checkpoint_open: out is NULL"), &e, err);
    *out = NULL;
    if (!dir) return finish(ls_fail(&e, LS_E_USAGE, "lockstep_checkpoint_open: dir is NULL"), &e, err);
    lockstep_checkpoint *h = calloc(1, sizeof *h);
    if (!h || !(h->dir = strdup(dir))) {
        free(h);
        return finish(ls_fail(&e, LS_E_NOMEM, "out of memory"), &e, err);
    }
    ls_model *m = NULL;
    /* Opening the model validates the configuration now, so a checkpoint
     * the engine would refuse fails here rather than at the first run. */
    ls_status st = ls_run_checkpoint_open(dir, &h->ck, &m, &e);
    if (st == LS_OK) {
        h->vocab = m->cfg.vocab;
        h->n_layers = m->cfg.n_layers;
        ls_fingerprint_opts fo = {0, 0};
        st = ls_fingerprint_checkpoint(h->ck, &fo, &h->fp, &e);
    }
    ls_model_close(m);
    if (st != LS_OK) {
        lockstep_checkpoint_close(h);
        return finish(st, &e, err);
    }
    ls_digest_to_hex(&h->fp.merkle_root, h->fingerprint_hex);
    *out = h;
    return finish(LS_OK, &e, err);
}

void lockstep_checkpoint_close(lockstep_checkpoint *h)
{
    if (!h) return;
    ls_fingerprint_free(&h->fp);
    ls_checkpoint_close(h->ck);
    free(h->completions);
    free(h->dir);
    free(h);
}

const char *lockstep_checkpoint_fingerprint(const lockstep_checkpoint *h)
{
    return h->fingerprint_hex;
}

long lockstep_checkpoint_vocab_size(const lockstep_checkpoint *h)
{
    return h->vocab;
}

long lockstep_checkpoint_n_layers(const lockstep_checkpoint *h)
{
    return h->n_layers;
}

const lockstep_run_summary *lockstep_checkpoint_last_run(const lockstep_checkpoint *h)
{
    return h && h->have_last ? &h->last : NULL;
}

/* ---- runs --------------------------------------------------------------------------------- */

void lockstep_run_options_default(lockstep_run_options *o)
{
    memset(o, 0, sizeof *o);
    o->backend = "cpu";
    o->threads = 1;
    o->max_new_tokens = 16;
    o->sampling = "greedy";
    o->temperature = 1.0f;
    o->top_p = 1.0f;
    o->max_rows = 256;
}

/* The spec a run of these options executes in mode `mode`. Fields whose
 * default depends on the mode (activations, state_digest_every) are left to
 * the caller when the options leave them unset (*act_set = 0). Options the
 * mode does not use must stay at their defaults: the spec carries them
 * through and ls_run_spec_validate refuses them (a replay's
 * max_new_tokens maps to "unset" only at its default). */
static ls_status spec_from_options(const lockstep_run_options *opts, const char *mode, ls_run_spec *s,
                                   int *act_set, ls_error *err)
{
    lockstep_run_options o, d;
    lockstep_run_options_default(&d);
    o = opts ? *opts : d;
    ls_run_spec_default(s);
    s->mode = mode;
    s->backend = o.backend;
    s->threads = o.threads;
    s->max_new = strcmp(mode, "rollout") && o.max_new_tokens == d.max_new_tokens ? 0 : o.max_new_tokens;
    s->chunk = o.chunk;
    s->max_rows = o.max_rows;
    s->reverse_batch = o.reverse_batch;
    s->perturb = o.perturb;
    s->dump_layers = o.dump_layers;
    s->progress = o.progress;
    s->fp8 = o.fp8;
    if (o.gdn_form) LS_TRY(ls_run_parse_gdn_form("run options: gdn_form", o.gdn_form, &s->gdn_chunked, err));
    if (o.tier) LS_TRY(ls_run_parse_tier("run options: tier", o.tier, &s->tier, err));
    *act_set = o.activations != NULL;
    if (o.activations) {
        if (strcmp(o.activations, "bf16") && strcmp(o.activations, "fp32"))
            return ls_fail(err, LS_E_USAGE, "run options: activations '%s': expected bf16 or fp32",
                           o.activations);
        s->act_bf16 = !strcmp(o.activations, "bf16");
    }
    if (o.state_digest_every < 0)
        return ls_fail(err, LS_E_USAGE, "run options: state_digest_every must be >= 1 (0 = default)");
    if (o.state_digest_every) s->state_digest_every = o.state_digest_every;
    if (!o.sampling || !strcmp(o.sampling, "greedy")) s->sampling.kind = LS_SAMPLING_GREEDY;
    else if (!strcmp(o.sampling, "seeded")) s->sampling.kind = LS_SAMPLING_SEEDED;
    else return ls_fail(err, LS_E_USAGE, "run options: sampling '%s': expected greedy or seeded", o.sampling);
    s->sampling.seed = o.seed;
    s->sampling.temperature = o.temperature;
    s->sampling.top_k = o.top_k;
    s->sampling.top_p = o.top_p;
    return LS_OK;
}

/* Checks the caller's sequences and points an ls_sequence array at their
 * tokens (borrowed; *out is malloc'd, caller frees). */
static ls_status borrow_sequences(const char *what, const lockstep_sequence *in, long n, int replay,
                                  ls_sequence **out, ls_error *err)
{
    *out = NULL;
    if (n < 1 || !in) return ls_fail(err, LS_E_USAGE, "%s: no sequences (n = %ld)", what, n);
    ls_sequence *seqs = malloc(sizeof *seqs * (size_t)n);
    uint32_t *ids = malloc(sizeof *ids * (size_t)n);
    if (!seqs || !ids) {
        free(seqs);
        free(ids);
        return ls_fail(err, LS_E_NOMEM, "out of memory");
    }
    ls_status st = LS_OK;
    for (long i = 0; st == LS_OK && i < n; i++) {
        const lockstep_sequence *q = &in[i];
        if (!q->tokens && q->n_tokens > 0)
            st = ls_fail(err, LS_E_USAGE, "%s[%ld] (id %u): tokens is NULL", what, i, q->id);
        else if (replay && (q->prompt_len < 1 || q->prompt_len >= q->n_tokens))
            st = ls_fail(err, LS_E_USAGE, "%s[%ld] (id %u): prompt_len %ld: expected 1 .. n_tokens - 1 (%ld)",
                         what, i, q->id, q->prompt_len, q->n_tokens - 1);
        seqs[i] = (ls_sequence){q->id, q->tokens, q->n_tokens, replay ? q->prompt_len : 0};
        ids[i] = q->id;
    }
    /* A trace addresses records by (sequence id, position): ids must be unique. */
    for (long i = 0; st == LS_OK && i < n; i++)
        for (long j = i + 1; j < n; j++)
            if (ids[i] == ids[j]) {
                st = ls_fail(err, LS_E_USAGE, "%s[%ld] and [%ld]: the same id %u", what, i, j, ids[i]);
                break;
            }
    free(ids);
    if (st != LS_OK) free(seqs);
    else *out = seqs;
    return st;
}

/* Executes s (checkpoint, fingerprint and output filled in here) and keeps
 * its summary on the handle. */
static ls_status execute(lockstep_checkpoint *h, ls_run_spec *s, const char *trace_path, ls_error *err)
{
    if (!trace_path) return ls_fail(err, LS_E_USAGE, "trace_path is NULL");
    s->checkpoint = h->dir;
    s->fingerprint = &h->fp;
    s->out = trace_path;
    ls_run_result res;
    LS_TRY(ls_run_execute(s, &res, err));
    const ls_run_batch *b = s->batch;
    int rollout = !strcmp(s->mode, "rollout");
    /* The engine ran the batch reversed when asked; the summary gives the
     * completions in the order the caller gave the prompts. */
    if (rollout && s->reverse_batch) {
        for (long i = 0; i < b->n / 2; i++)
            for (long t = 0; t < s->max_new; t++) {
                int32_t *x = &res.completions[i * s->max_new + t];
                int32_t *y = &res.completions[(b->n - 1 - i) * s->max_new + t];
                int32_t tmp = *x;
                *x = *y;
                *y = tmp;
            }
    }
    free(h->completions);
    h->completions = res.completions;
    lockstep_run_summary *sum = &h->last;
    memcpy(sum->model_fingerprint, res.merkle_root, sizeof sum->model_fingerprint);
    memcpy(sum->manifest_digest, res.manifest_digest, sizeof sum->manifest_digest);
    sum->records = res.records;
    sum->positions = res.positions;
    sum->seconds = res.seconds;
    sum->n_sequences = b->n;
    sum->max_new_tokens = rollout ? s->max_new : 0;
    sum->completions = h->completions;
    h->have_last = 1;
    return LS_OK;
}

lockstep_status lockstep_rollout(lockstep_checkpoint *h, const lockstep_sequence *prompts, long n_prompts,
                                 const lockstep_run_options *opts, const char *trace_path, lockstep_error *err)
{
    ls_error e;
    ls_error_clear(&e);
    if (!h) return finish(ls_fail(&e, LS_E_USAGE, "lockstep_rollout: checkpoint is NULL"), &e, err);
    ls_run_spec s;
    int act_set;
    ls_sequence *seqs = NULL;
    ls_status st = spec_from_options(opts, "rollout", &s, &act_set, &e);
    if (st == LS_OK) st = borrow_sequences("prompts", prompts, n_prompts, 0, &seqs, &e);
    if (st == LS_OK) {
        ls_run_batch b = {n_prompts, seqs};
        s.batch = &b;
        st = execute(h, &s, trace_path, &e);
    }
    free(seqs);
    return finish(st, &e, err);
}

lockstep_status lockstep_replay_sequences(lockstep_checkpoint *h, const lockstep_sequence *in, long n_seqs,
                                          const lockstep_run_options *opts, const char *trace_path,
                                          lockstep_error *err)
{
    ls_error e;
    ls_error_clear(&e);
    if (!h) return finish(ls_fail(&e, LS_E_USAGE, "lockstep_replay_sequences: checkpoint is NULL"), &e, err);
    ls_run_spec s;
    int act_set;
    ls_sequence *seqs = NULL;
    ls_status st = spec_from_options(opts, "replay", &s, &act_set, &e);
    if (st == LS_OK) st = borrow_sequences("sequences", in, n_seqs, 1, &seqs, &e);
    if (st == LS_OK) {
        ls_run_batch b = {n_seqs, seqs};
        s.batch = &b;
        st = execute(h, &s, trace_path, &e);
    }
    free(seqs);
    return finish(st, &e, err);
}

lockstep_status lockstep_replay(lockstep_checkpoint *h, const char *rollout_trace,
                                const lockstep_run_options *opts, const char *trace_path, lockstep_error *err)
{
    ls_error e;
    ls_error_clear(&e);
    if (!h) return finish(ls_fail(&e, LS_E_USAGE, "lockstep_replay: checkpoint is NULL"), &e, err);
    if (!rollout_trace) return finish(ls_fail(&e, LS_E_USAGE, "lockstep_replay: rollout_trace is NULL"), &e, err);
    ls_run_spec s;
    int act_set;
    ls_status st = spec_from_options(opts, "replay", &s, &act_set, &e);
    if (st != LS_OK) return finish(st, &e, err);
    ls_run_batch b = {0, NULL};
    ls_run_rollout_info info;
    st = ls_run_load_rollout(rollout_trace, &b, &info, &e);
    if (st == LS_OK) {
        /* A replay recomputes what the rollout computed: the rollout's dtype
         * and digest cadence unless the options say otherwise. */
        if (!act_set) s.act_bf16 = info.act_bf16;
        if (!s.fp8 && info.fp8[0]) s.fp8 = info.fp8;
        if (!(opts && opts->gdn_form)) s.gdn_chunked = info.gdn_chunked; /* the rollout's GDN form */
        if (!(opts && opts->tier)) s.tier = info.tier;                   /* and its tier */
        if (!(opts && opts->state_digest_every)) s.state_digest_every = info.state_digest_every;
        s.expect_merkle_root = info.model_fingerprint;
        s.expect_source = rollout_trace;
        s.batch = &b;
        st = execute(h, &s, trace_path, &e);
    }
    ls_run_batch_free(&b);
    return finish(st, &e, err);
}

/* ---- comparison ----------------------------------------------------------------------------- */

void lockstep_compare_options_default(lockstep_compare_options *o)
{
    memset(o, 0, sizeof *o);
}

static ls_status write_text_report(const char *path, const ls_compare_result *r, ls_error *err)
{
    ls_outfile of;
    LS_TRY(ls_outfile_open(&of, path, err));
    ls_report_write_text(of.fp, r, 0);
    return ls_outfile_commit(&of, err);
}

static void fill_verdict(const ls_compare_result *r, lockstep_verdict *v)
{
    v->equal = r->equal;
    v->sequences = (long)r->n_seqs;
    const ls_compare_seq *first = r->first_seq >= 0 ? &r->seqs[r->first_seq] : NULL;
    for (size_t i = 0; i < r->n_seqs; i++) {
        v->positions += r->seqs[i].positions_compared;
        if (!r->seqs[i].pass) {
            v->sequences_failed++;
            if (!first) first = &r->seqs[i];
        }
    }
    if (r->equal) {
        snprintf(v->line, sizeof v->line, "equal: %ld sequence%s, %llu positions, bitwise", v->sequences,
                 v->sequences == 1 ? "" : "s", (unsigned long long)v->positions);
        return;
    }
    if (first && first->first.what != LS_DRIFT_NONE) {
        const ls_compare_drift *d = &first->first;
        v->drift = 1;
        v->drift_sequence = d->seq;
        v->drift_position = d->pos;
        v->drift_layer = d->layer;
        snprintf(v->drift_what, sizeof v->drift_what, "%s", ls_drift_what_name(d->what));
        snprintf(v->line, sizeof v->line, "drift: %ld of %ld sequences differ; first: %s", v->sequences_failed,
                 v->sequences, d->message);
    } else {
        snprintf(v->line, sizeof v->line, "drift: %ld of %ld sequences differ", v->sequences_failed,
                 v->sequences);
    }
}

lockstep_status lockstep_compare(const char *trace_a, const char *trace_b, const lockstep_compare_options *opts,
                                 lockstep_verdict *v, lockstep_error *err)
{
    ls_error e;
    ls_error_clear(&e);
    if (!v) return finish(ls_fail(&e, LS_E_USAGE, "lockstep_compare: verdict is NULL"), &e, err);
    memset(v, 0, sizeof *v);
    v->drift_layer = -1;
    if (!trace_a || !trace_b)
        return finish(ls_fail(&e, LS_E_USAGE, "lockstep_compare: a trace path is NULL"), &e, err);
    lockstep_compare_options o;
    if (opts) o = *opts;
    else lockstep_compare_options_default(&o);
    ls_compare_opts co = {o.allow_different_model, o.allow_incomplete, 0};
    ls_compare_result r;
    ls_status st = ls_compare_files(trace_a, trace_b, &co, &r, &e);
    if (st == LS_OK) fill_verdict(&r, v);
    if (st == LS_OK && o.report_text) st = write_text_report(o.report_text, &r, &e);
    if (st == LS_OK && o.report_json) st = ls_report_write_json(o.report_json, &r, &e);
    if (st == LS_OK && o.report_junit) st = ls_report_write_junit(o.report_junit, &r, &e);
    if (st == LS_OK && o.report_html) st = ls_report_write_html(o.report_html, &r, &e);
    ls_compare_result_free(&r);
    if (st != LS_OK) {
        memset(v, 0, sizeof *v);
        v->drift_layer = -1;
        snprintf(v->line, sizeof v->line, "could not compare: %.700s", e.msg);
    }
    return finish(st, &e, err);
}

/* ---- synthetic checkpoints -------------------------------------------------------------------- */

lockstep_status lockstep_synth_checkpoint(const char *preset, uint64_t seed, const char *dir, lockstep_error *err)
{
    ls_error e;
    ls_error_clear(&e);
    if (!preset || !dir)
        return finish(ls_fail(&e, LS_E_USAGE, "lockstep_synth_checkpoint: preset and dir are required"), &e, err);
    ls_synth_config cfg;
    ls_status st = ls_synth_preset(preset, &cfg, &e);
    ls_synth_options so = ls_synth_options_default();
    if (st == LS_OK) st = ls_synth_write(&cfg, seed, dir, &so, &e);
    return finish(st, &e, err);
}
