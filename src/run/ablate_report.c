/* lockstep — the ablation's reports: JSON, Markdown and the printed table;
 * see ablate.h and docs/ablate.md. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "io/json.h"
#include "run/ablate.h"

/* ---- what the reports say about a cell -------------------------------------- */

/* "hidden digest", "router digest", "next_token", "logprob", ... */
static void what_label(const ls_compare_drift *d, char *out, size_t n)
{
    if (d->what == LS_DRIFT_DIGEST) snprintf(out, n, "%s digest", ls_digest_kind_name(d->kind));
    else snprintf(out, n, "%s", ls_drift_what_name(d->what));
}

/* "9 (moe, decoder layer 4)", "0 (embed)", "- (not in a layer)" */
static void layer_label(const ls_compare_drift *d, char *out, size_t n)
{
    if (d->layer < 0) snprintf(out, n, "- (not in a layer)");
    else if (d->decoder_layer >= 0)
        snprintf(out, n, "%d (%s, decoder layer %d)", d->layer, ls_layer_family_name(d->family), d->decoder_layer);
    else snprintf(out, n, "%d (%s)", d->layer, ls_layer_family_name(d->family));
}

typedef struct family_sum {
    int cells, drift, no_drift, unsupported, diverged;
    double max_dlogprob;            /* over the cells that ran */
    int64_t fewest_tokens;          /* fewest tokens until a greedy divergence, -1: none */
} family_sum;

static family_sum summarise(const ls_ablate_result *r, ls_perturb_op op)
{
    family_sum f = {0, 0, 0, 0, 0, 0.0, -1};
    for (size_t i = 0; i < r->n_cells; i++) {
        const ls_ablate_cell *w = &r->cells[i];
        if (w->op != op) continue;
        f.cells++;
        if (w->outcome == LS_ABLATE_UNSUPPORTED) {
            f.unsupported++;
            continue;
        }
        if (w->outcome == LS_ABLATE_DRIFT) f.drift++;
        else f.no_drift++;
        if (w->dlogprob.max > f.max_dlogprob) f.max_dlogprob = w->dlogprob.max;
        if (w->seqs_diverged > 0) {
            f.diverged++;
            if (f.fewest_tokens < 0 || w->tokens_until_divergence < f.fewest_tokens)
                f.fewest_tokens = w->tokens_until_divergence;
        }
    }
    return f;
}

/* ---- JSON ------------------------------------------------------------------- */

static json_t *finite_or_null(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static json_t *cell_json(const ls_ablate_cell *w)
{
    json_t *c = json_pack("{s:o, s:o, s:s}", "layer", w->layer >= 0 ? json_integer(w->layer) : json_null(),
                          "planted_trace_layer", w->planted_tl >= 0 ? json_integer(w->planted_tl) : json_null(),
                          "outcome", ls_ablate_outcome_name(w->outcome));
    if (!c) return NULL;
    int ok = 1;
    if (w->outcome == LS_ABLATE_UNSUPPORTED) {
        ok = json_object_set_new(c, "note", json_string(w->note)) == 0;
        if (!ok) json_decref(c);
        return ok ? c : NULL;
    }
    ok = json_object_set_new(c, "seconds", json_real(w->seconds)) == 0;
    if (ok && w->outcome == LS_ABLATE_DRIFT) {
        const ls_compare_drift *d = &w->first;
        char what[48];
        what_label(d, what, sizeof what);
        int in_layer = d->layer >= 0 && d->what == LS_DRIFT_DIGEST;
        json_t *fd = json_pack("{s:I, s:I, s:o, s:o, s:o, s:s, s:s}", "seq", (json_int_t)d->seq, "pos",
                               (json_int_t)d->pos, "trace_layer", in_layer ? json_integer(d->layer) : json_null(),
                               "family", in_layer ? json_string(ls_layer_family_name(d->family)) : json_null(),
                               "decoder_layer",
                               in_layer && d->decoder_layer >= 0 ? json_integer(d->decoder_layer) : json_null(),
                               "what", what, "message", d->message);
        ok = fd && json_object_set_new(c, "first_drift", fd) == 0;
    }
    if (ok) {
        json_t *dl = json_pack("{s:I, s:o, s:o, s:o, s:o}", "n", (json_int_t)w->dlogprob.n, "max",
                               finite_or_null(w->dlogprob.max), "p50", finite_or_null(w->dlogprob.p50), "p99",
                               finite_or_null(w->dlogprob.p99), "mean", finite_or_null(w->dlogprob.mean));
        json_t *g = json_pack("{s:I, s:I}", "sequences", (json_int_t)w->seqs, "diverged",
                              (json_int_t)w->seqs_diverged);
        if (g && w->seqs_diverged > 0) {
            json_t *fst = json_pack("{s:I, s:I, s:I}", "seq", (json_int_t)w->diverge_seq, "pos",
                                    (json_int_t)w->diverge_pos, "tokens_until_divergence",
                                    (json_int_t)w->tokens_until_divergence);
            if (!fst || json_object_set_new(g, "first", fst) != 0) {
                json_decref(g);
                g = NULL;
            }
        }
        ok = json_object_set_new(c, "positions", json_integer((json_int_t)w->positions)) == 0 &&
             json_object_set_new(c, "positions_differ", json_integer((json_int_t)w->positions_differ)) == 0 &&
             dl && json_object_set_new(c, "abs_dlogprob", dl) == 0 && g &&
             json_object_set_new(c, "greedy", g) == 0;
    }
    if (!ok) {
        json_decref(c);
        return NULL;
    }
    return c;
}

ls_status ls_ablate_write_json(const char *path, const ls_ablate_opts *o, const ls_ablate_result *r,
                               ls_error *err)
{
    int nf;
    const ls_perturb_op *fam = ls_ablate_families(&nf);
    json_t *fams = json_array();
    int ok = fams != NULL;
    for (int f = 0; ok && f < nf; f++) {
        family_sum sm = summarise(r, fam[f]);
        json_t *cells = json_array();
        ok = cells != NULL;
        for (size_t i = 0; ok && i < r->n_cells; i++)
            if (r->cells[i].op == fam[f]) ok = json_array_append_new(cells, cell_json(&r->cells[i])) == 0;
        const char *verdict = sm.cells == 0 ? "absent" : sm.unsupported == sm.cells ? "not_ablatable"
                              : sm.drift > 0 ? "drifts" : "no_drift";
        json_t *fj = ok ? json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:o, s:i, s:o, s:o}", "family",
                                    ls_perturb_op_name(fam[f]), "verdict", verdict, "cells", sm.cells,
                                    "cells_drift", sm.drift, "cells_no_drift", sm.no_drift, "cells_unsupported",
                                    sm.unsupported, "max_abs_dlogprob",
                                    sm.drift + sm.no_drift ? finite_or_null(sm.max_dlogprob) : json_null(),
                                    "cells_greedy_diverged", sm.diverged, "fewest_tokens_until_divergence",
                                    sm.fewest_tokens >= 0 ? json_integer(sm.fewest_tokens) : json_null(),
                                    "layers", cells)
                        : NULL;
        if (!fj) json_decref(cells);
        ok = fj && json_array_append_new(fams, fj) == 0;
    }
    json_t *control = ok ? cell_json(&r->control) : NULL;
    json_t *doc = NULL;
    int twin;
    const char *substitute = ls_ablate_substitute(o, &twin);
    if (control)
        doc = json_pack("{s:s, s:s, s:b, s:o, s:s, s:s, s:s, s:s, s:s, s:I, s:s, s:s, s:I, s:I, s:I, s:f, s:b, "
                        "s:o, s:o}",
                        "schema", "lockstep-ablate/1", "substitute", substitute, "fast_tier", twin,
                        "command", o->command ? json_string(o->command) : json_null(), "model_fingerprint",
                        r->merkle_root, "manifest_digest", r->manifest_digest, "backend",
                        o->backend ? o->backend : "cpu", "tier", ls_run_tier_name(o->tier), "mode", r->mode,
                        "max_new_tokens", (json_int_t)o->max_new,
                        "prompts", o->prompts ? o->prompts : "", "layers", o->layers ? o->layers : "sample",
                        "decoder_layers", (json_int_t)r->n_layers, "sequences", (json_int_t)r->n_seqs,
                        "strict_positions", (json_int_t)r->strict_positions, "strict_seconds", r->strict_seconds,
                        "control_equal", r->control.outcome == LS_ABLATE_NO_DRIFT, "control", control,
                        "families", fams);
    else {
        json_decref(fams);
    }
    return ls_json_write_doc(path, doc, "ablation report", err);
}

/* ---- Markdown and the printed table ---------------------------------------- */

static void first_drift_cells(const ls_ablate_cell *w, char *where, size_t nw, char *layer, size_t nl, char *what,
                              size_t nwh)
{
    if (w->outcome != LS_ABLATE_DRIFT) {
        snprintf(where, nw, "-");
        snprintf(layer, nl, "-");
        snprintf(what, nwh, "-");
        return;
    }
    snprintf(where, nw, "%u / %u", w->first.seq, w->first.pos);
    layer_label(&w->first, layer, nl);
    what_label(&w->first, what, nwh);
}

static void divergence_cell(const ls_ablate_cell *w, char *out, size_t n)
{
    if (w->outcome == LS_ABLATE_UNSUPPORTED) snprintf(out, n, "-");
    else if (w->seqs_diverged == 0) snprintf(out, n, "no (0/%ld)", w->seqs);
    else
        snprintf(out, n, "yes (%ld/%ld), after %lld equal tokens (seq %lld)", w->seqs_diverged, w->seqs,
                 (long long)w->tokens_until_divergence, (long long)w->diverge_seq);
}

static const char *outcome_text(ls_ablate_outcome o)
{
    switch (o) {
    case LS_ABLATE_DRIFT: return "drift";
    case LS_ABLATE_NO_DRIFT: return "no drift";
    case LS_ABLATE_UNSUPPORTED: return "not ablatable on this backend";
    }
    return "?";
}

static void write_markdown(FILE *f, const ls_ablate_opts *o, const ls_ablate_result *r)
{
    const char *backend = o->backend ? o->backend : "cpu";
    fprintf(f, "# Ablation: which operator families drift\n\n");
    if (o->command) fprintf(f, "Command:\n\n```\n%s\n```\n\n", o->command);
    fprintf(f, "- model fingerprint: `%s`\n- backend: %s; mode: %s; %ld sequences, %ld new tokens each; "
            "layers: %s\n- strict run: %llu positions, manifest `%s`\n",
            r->merkle_root, backend, r->mode, r->n_seqs, o->max_new, o->layers ? o->layers : "sample",
            (unsigned long long)r->strict_positions, r->manifest_digest);
    int twin;
    const char *substitute = ls_ablate_substitute(o, &twin);
    fprintf(f, "- what replaces each family's strict order: %s (docs/ablate.md)%s.\n", substitute,
            twin ? "" : "; the cuda backend runs the families' fast twins instead");
    fprintf(f, "- control (the strict run again): %s\n\n",
            r->control.outcome == LS_ABLATE_NO_DRIFT ? "bitwise equal"
            : r->control.outcome == LS_ABLATE_DRIFT ? "DRIFTS: the strict run is not deterministic, and no row "
                                                      "below can be laid at its family's door"
                                                    : "could not run");
    int nf;
    const ls_perturb_op *fam = ls_ablate_families(&nf);
    fprintf(f, "## Per family\n\n| family | layers ablated | drift | not ablatable | max \\|Δ logprob\\| | "
            "layers where greedy diverged | fewest equal tokens before divergence |\n|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < nf; i++) {
        family_sum sm = summarise(r, fam[i]);
        if (sm.cells == 0) {
            fprintf(f, "| %s | 0 (not in the chosen layers) | - | - | - | - | - |\n", ls_perturb_op_name(fam[i]));
            continue;
        }
        char mx[32] = "-", few[32] = "-";
        if (sm.drift + sm.no_drift) snprintf(mx, sizeof mx, "%.3g", sm.max_dlogprob);
        if (sm.fewest_tokens >= 0) snprintf(few, sizeof few, "%lld", (long long)sm.fewest_tokens);
        fprintf(f, "| %s | %d | %d/%d | %d | %s | %d/%d | %s |\n", ls_perturb_op_name(fam[i]), sm.cells, sm.drift,
                sm.cells, sm.unsupported, mx, sm.diverged, sm.cells, few);
    }
    fprintf(f, "\n## Matrix\n\nOne row per ablated run: the family's order changed in one decoder layer (lm_head: "
            "the head). *Planted at* is the trace layer whose output the change reaches first; the first drift "
            "is the comparator's (sequence / position, trace layer, what differed). |Δ logprob| is over the "
            "positions whose context is still the same as the strict run's (max, p50, p99); *greedy* says "
            "whether the top-1 token differs at a completion position, in how many sequences, and after how "
            "many equal completion tokens at the earliest.\n\n");
    fprintf(f, "| family | layer | planted at | outcome | first drift (seq / pos) | trace layer | what | "
            "max \\|Δ logprob\\| | p50 | p99 | greedy |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < r->n_cells; i++) {
        const ls_ablate_cell *w = &r->cells[i];
        char layer[16] = "head", planted[16] = "-", where[48], tl[96], what[48], div[96], mx[32] = "-",
             p50[32] = "-", p99[32] = "-";
        if (w->layer >= 0) snprintf(layer, sizeof layer, "%d", w->layer);
        if (w->planted_tl >= 0) snprintf(planted, sizeof planted, "%d", w->planted_tl);
        first_drift_cells(w, where, sizeof where, tl, sizeof tl, what, sizeof what);
        divergence_cell(w, div, sizeof div);
        if (w->outcome != LS_ABLATE_UNSUPPORTED) {
            snprintf(mx, sizeof mx, "%.3g", w->dlogprob.max);
            snprintf(p50, sizeof p50, "%.3g", w->dlogprob.p50);
            snprintf(p99, sizeof p99, "%.3g", w->dlogprob.p99);
        }
        fprintf(f, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", ls_perturb_op_name(w->op), layer,
                planted, outcome_text(w->outcome), where, tl, what, mx, p50, p99, div);
    }
    int notes = 0;
    for (size_t i = 0; i < r->n_cells; i++)
        if (r->cells[i].outcome == LS_ABLATE_UNSUPPORTED) {
            if (!notes++) fprintf(f, "\nNot ablatable on this backend:\n\n");
            fprintf(f, "- %s layer %d: %s\n", ls_perturb_op_name(r->cells[i].op), r->cells[i].layer,
                    r->cells[i].note);
        }
}

ls_status ls_ablate_write_markdown(const char *path, const ls_ablate_opts *o, const ls_ablate_result *r,
                                   ls_error *err)
{
    ls_outfile of;
    LS_TRY(ls_outfile_open(&of, path, err));
    write_markdown(of.fp, o, r);
    return ls_outfile_commit(&of, err);
}

void ls_ablate_print(FILE *out, const ls_ablate_opts *o, const ls_ablate_result *r)
{
    int twin;
    fprintf(out, "ablation (%s): %s; %s, %ld sequences, %llu positions\ncontrol (strict run again): %s\n\n",
            ls_ablate_substitute(o, &twin), r->merkle_root, r->mode, r->n_seqs,
            (unsigned long long)r->strict_positions,
            r->control.outcome == LS_ABLATE_NO_DRIFT ? "bitwise equal" : "DRIFTS (the strict run is not deterministic)");
    fprintf(out, "%-10s %-5s %-8s %-9s %-13s %-32s %-16s %-13s %s\n", "family", "layer", "planted", "outcome",
            "first drift", "trace layer", "what", "max|dlogprob|", "greedy");
    for (size_t i = 0; i < r->n_cells; i++) {
        const ls_ablate_cell *w = &r->cells[i];
        char layer[16] = "head", planted[16] = "-", where[48], tl[96], what[48], div[96], mx[32] = "-";
        if (w->layer >= 0) snprintf(layer, sizeof layer, "%d", w->layer);
        if (w->planted_tl >= 0) snprintf(planted, sizeof planted, "%d", w->planted_tl);
        first_drift_cells(w, where, sizeof where, tl, sizeof tl, what, sizeof what);
        divergence_cell(w, div, sizeof div);
        if (w->outcome != LS_ABLATE_UNSUPPORTED) snprintf(mx, sizeof mx, "%.3g", w->dlogprob.max);
        const char *oc = w->outcome == LS_ABLATE_UNSUPPORTED ? "n/a" : w->outcome == LS_ABLATE_DRIFT ? "drift"
                                                                                                 : "none";
        fprintf(out, "%-10s %-5s %-8s %-9s %-13s %-32s %-16s %-13s %s\n", ls_perturb_op_name(w->op), layer, planted,
                oc, where, tl, what, mx, w->outcome == LS_ABLATE_UNSUPPORTED ? "not ablatable on this backend" : div);
    }
    fflush(out);
}
