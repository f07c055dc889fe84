/* lockstep CLI — the gate; see gate.h. */
#include "run/gate.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "compare/compare.h"
#include "core/util.h"
#include "fingerprint/fingerprint.h"
#include "io/checkpoint.h"
#include "report/report.h"

static const ls_gate_variant standard[] = {
    {"chunk 1", 1, 0, NULL},
    {"chunk 3", 3, 0, NULL},
    {"chunk 64", 64, 0, NULL},
    {"whole sequence", 0, 0, NULL},
    {"chunk 64, batch reversed", 64, 1, NULL},
};

static void summarise(const ls_compare_result *c, ls_gate_row *w)
{
    w->equal = c->equal;
    for (size_t i = 0; i < c->n_seqs; i++) {
        const ls_compare_seq *s = &c->seqs[i];
        w->positions += s->positions_compared;
        w->positions_total += s->positions_compared + s->positions_only_a + s->positions_only_b;
        w->tokens_equal += s->tokens_equal;
        w->topk_equal += s->topk_set_equal;
        if (s->max_abs_dlogprob > w->max_dlogprob) w->max_dlogprob = s->max_abs_dlogprob;
    }
    if (c->first_seq >= 0) {
        const ls_compare_drift *d = &c->seqs[c->first_seq].first;
        w->has_drift = 1;
        snprintf(w->first, sizeof w->first, "%s", d->message);
        w->seq = d->seq;
        w->pos = d->pos;
        w->layer = d->layer;
        w->family = d->family;
        w->decoder_layer = d->decoder_layer;
        w->kind = d->kind;
        w->digest_drift = d->what == LS_DRIFT_DIGEST;
    }
}

ls_status ls_gate_run(const ls_gate_opts *o, const ls_run_batch *batch, FILE *out, ls_gate_result *r,
                      ls_error *err)
{
    memset(r, 0, sizeof *r);
    const ls_gate_variant *vars = o->variants ? o->variants : standard;
    int nv = o->variants ? o->n_variants : (int)(sizeof standard / sizeof standard[0]);
    if (nv < 1 || nv > LS_GATE_MAX_VARIANTS) return ls_fail(err, LS_E_USAGE, "gate: %d replays (1..%d)", nv,
                                                              LS_GATE_MAX_VARIANTS);
    /* a report path that cannot be written is refused before the runs */
    if (o->json && strcmp(o->json, "-")) LS_TRY(ls_output_path_check(o->json, err));
    if (o->junit && strcmp(o->junit, "-")) LS_TRY(ls_output_path_check(o->junit, err));
    /* the gate's rollout is seeded by --seed (it has no --sampling): say so
     * rather than the run layer's message, which names run's flags */
    if (o->samples_per_prompt > 1 && !o->seeded)
        return ls_fail(err, LS_E_USAGE, "samples_per_prompt (--samples-per-prompt) %ld needs a seeded rollout "
                       "(--seed S): greedy samples of one prompt would all be equal", o->samples_per_prompt);
    char dir[4096], ro_path[4200], rp_path[4200], rep[4300];
    int temporary;
    LS_TRY(ls_run_workdir(o->workdir, "gate", dir, sizeof dir, &temporary, err));
    snprintf(ro_path, sizeof ro_path, "%s/rollout.trace", dir);
    ls_run_spec s;
    ls_run_spec_default(&s);
    s.checkpoint = o->checkpoint;
    s.mode = "rollout";
    s.max_new = o->max_new;
    s.backend = o->backend;
    s.gpu = o->gpu;
    s.threads = o->threads;
    s.batch = batch;
    s.fp8 = o->fp8;
    s.samples_per_prompt = o->samples_per_prompt > 0 ? o->samples_per_prompt : 1;
    s.prefix_cache = o->prefix_cache;
    s.prefix_block = o->prefix_block;
    s.preempt = o->preempt;
    s.kv_page = o->kv_page;
    s.gdn_chunked = o->gdn_chunked;
    s.ep = o->ep;
    s.tp = o->tp;
    s.afd_attention = o->afd_attention;
    s.afd_ffn = o->afd_ffn;
    if (o->seeded) s.sampling = (ls_sampling){LS_SAMPLING_SEEDED, o->seed, 1.0f, 0, 1.0f};
    s.out = ro_path;
    s.progress = out != NULL;
    /* Hash the checkpoint once: every run pins the same checkpoint section
     * (hashing a 160 GB checkpoint per run would dominate a gate). */
    ls_checkpoint *ck = NULL;
    ls_fingerprint fp = {0};
    ls_status st = ls_run_checkpoint_open(o->checkpoint, &ck, NULL, err);
    if (st == LS_OK) st = ls_run_fingerprint(ck, o->hash_cache, out != NULL, &fp, err);
    s.fingerprint = &fp;
    ls_run_result res;
    ls_run_batch full = {0, NULL};
    ls_run_rollout_info info;
    if (st == LS_OK) st = ls_run_execute(&s, &res, err);
    if (st == LS_OK) {
        free(res.completions);
        memcpy(r->merkle_root, res.merkle_root, 65);
        memcpy(r->manifest_digest, res.manifest_digest, 65);
        r->rollout_positions = res.positions;
        r->rollout_seconds = res.seconds;
        st = ls_run_load_rollout(ro_path, &full, &info, err);
    }
    char gpu_label[32] = ""; /* which card, when there is a choice to report */
    if (strcmp(o->backend, "cpu")) snprintf(gpu_label, sizeof gpu_label, " (CUDA device %d)", o->gpu);
    if (st == LS_OK && out)
        fprintf(out, "rollout: %ld sequences, %llu positions in %.2f s (%.0f tokens/s), backend %s%s\n"
                "model %s\n\n%-26s %-13s %-13s %-13s %-15s %s\n", batch->n,
                (unsigned long long)res.positions, res.seconds,
                res.seconds > 0 ? (double)res.positions / res.seconds : 0.0, o->backend,
                gpu_label, r->merkle_root,
                "replay", "positions", "tokens", "top-5 sets", "max|dlogprob|", "result");
    r->all_equal = 1;
    for (int v = 0; st == LS_OK && v < nv; v++) {
        ls_gate_row *w = &r->rows[r->n_rows++];
        snprintf(w->name, sizeof w->name, "%s", vars[v].name);
        w->perturbed = vars[v].perturb != NULL;
        w->layer = -1;
        snprintf(rp_path, sizeof rp_path, "%s/replay-%d.trace", dir, v + 1);
        s.mode = "replay";
        s.max_new = 0; /* a replay recomputes the rollout's tokens */
        s.samples_per_prompt = 1; /* ... each of the rollout's sequences, plainly */
        s.prefix_cache = NULL;
        s.prefix_block = 0;
        s.preempt = NULL;
        s.kv_page = 0; /* contiguous: the plain reference for a paged rollout */
        s.ep = s.tp = 0; /* one rank: the plain reference for a rollout on several */
        s.afd_attention = s.afd_ffn = 0;
        s.sampling = (ls_sampling){LS_SAMPLING_GREEDY, 0, 1.0f, 0, 1.0f};
        s.expect_merkle_root = info.model_fingerprint;
        s.expect_source = ro_path;
        s.batch = &full;
        s.chunk = vars[v].chunk;
        s.reverse_batch = vars[v].reverse;
        s.perturb = vars[v].perturb;
        s.act_bf16 = info.act_bf16;
        s.fp8 = info.fp8[0] ? info.fp8 : NULL;
        s.gdn_chunked = info.gdn_chunked;
        s.state_digest_every = info.state_digest_every;
        s.out = rp_path;
        st = ls_run_execute(&s, &res, err);
        if (st != LS_OK) break;
        w->seconds = res.seconds;
        ls_compare_result c;
        st = ls_compare_files(ro_path, rp_path, NULL, &c, err);
        if (st == LS_OK) {
            summarise(&c, w);
            if (o->workdir) { /* per-replay reports beside the traces */
                snprintf(rep, sizeof rep, "%s/compare-%d.json", dir, v + 1);
                st = ls_report_write_json(rep, &c, err);
                snprintf(rep, sizeof rep, "%s/compare-%d.junit.xml", dir, v + 1);
                if (st == LS_OK) st = ls_report_write_junit(rep, &c, err);
            }
        }
        ls_compare_result_free(&c);
        if (st != LS_OK) break;
        if (!w->perturbed && !w->equal) r->all_equal = 0;
        if (out) {
            char pos[32], tok[32], top[32];
            snprintf(pos, sizeof pos, "%llu/%llu", (unsigned long long)w->positions,
                     (unsigned long long)w->positions_total);
            snprintf(tok, sizeof tok, "%llu/%llu", (unsigned long long)w->tokens_equal,
                     (unsigned long long)w->positions);
            snprintf(top, sizeof top, "%llu/%llu", (unsigned long long)w->topk_equal,
                     (unsigned long long)w->positions);
            fprintf(out, "%-26s %-13s %-13s %-13s %-15.9g %s%s\n", w->name, pos, tok, top, w->max_dlogprob,
                    w->equal ? "PASS" : "FAIL", w->perturbed ? " (perturbed: drift expected)" : "");
            fflush(out);
        }
    }
    if (st == LS_OK && out) {
        int n_strict = 0, n_pass = 0;
        for (int i = 0; i < r->n_rows; i++)
            if (!r->rows[i].perturbed) n_strict++, n_pass += r->rows[i].equal;
        fprintf(out, "\n%s: %d/%d replays bitwise equal to the rollout\n", r->all_equal ? "PASS" : "FAIL", n_pass,
                n_strict);
        for (int i = 0; i < r->n_rows; i++)
            if (r->rows[i].has_drift)
                fprintf(out, "first drift (%s): %s\n", r->rows[i].name, r->rows[i].first);
    }
    if (st == LS_OK && o->junit) st = ls_report_write_gate_junit(o->junit, r, err);
    if (st == LS_OK && o->json) st = ls_report_write_gate_json(o->json, o->backend, o->max_new, r, err);
    ls_run_batch_free(&full);
    ls_fingerprint_free(&fp);
    ls_checkpoint_close(ck);
    if (temporary) ls_run_workdir_remove(dir);
    return st;
}
