/* lockstep — human-readable comparison report. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "report/report.h"
#include "report/report_internal.h"

static const char *kinds_list(uint32_t mask, char *buf, size_t n)
{
    buf[0] = 0;
    for (int k = 0; k < LS_DIGEST_COUNT; k++)
        if (mask & (1u << k)) {
            size_t l = strlen(buf);
            snprintf(buf + l, n - l, "%s%s", l ? ", " : "", ls_digest_kind_name((ls_digest_kind)k));
        }
    if (!buf[0]) snprintf(buf, n, "none");
    return buf;
}

void ls_report_tensor_line(const ls_tensor_diff *t, char *buf, size_t n)
{
    buf[0] = 0;
    if (!t->present) return;
    if (t->first_index < 0) {
        snprintf(buf, n, "full tensors are bitwise equal (%u elements)", t->n_elems);
        return;
    }
    int bf = t->dtype == LS_DUMP_BF16;
    snprintf(buf, n,
             "first differing element %" PRId64 " of %u: A 0x%0*x (%.9g), B 0x%0*x (%.9g), %" PRIu64
             " ULP; %u elements differ; max |d| %.6g, mean |d| %.6g",
             t->first_index, t->n_elems, bf ? 4 : 8, t->a_bits, t->a_value, bf ? 4 : 8, t->b_bits, t->b_value, t->ulp,
             t->n_differ, t->max_abs, t->mean_abs);
}

void ls_report_router_line(const ls_tensor_diff *t, char *buf, size_t n)
{
    buf[0] = 0;
    if (!t->present || t->dtype != LS_DUMP_ROUTER) return;
    size_t l = (size_t)snprintf(buf, n, "router top-%d ids A [", t->router_k);
    for (int i = 0; i < t->router_k && l < n; i++) l += (size_t)snprintf(buf + l, n - l, "%s%d", i ? " " : "", t->router_a[i]);
    if (l < n) l += (size_t)snprintf(buf + l, n - l, "], B [");
    for (int i = 0; i < t->router_k && l < n; i++) l += (size_t)snprintf(buf + l, n - l, "%s%d", i ? " " : "", t->router_b[i]);
    if (l < n)
        snprintf(buf + l, n - l, "]: %s", t->router_set_differs ? "expert sets differ"
                                           : t->router_order_differs ? "same experts, order differs"
                                                                     : "same experts and order, weights differ");
}

void ls_report_layer_name(const ls_compare_result *r, int layer, char *buf, size_t n)
{
    const ls_trace_layer *l = &r->layers[layer];
    if (l->decoder_layer >= 0)
        snprintf(buf, n, "layer %d (%s, decoder layer %d)", layer, ls_layer_family_name(l->family), l->decoder_layer);
    else
        snprintf(buf, n, "layer %d (%s)", layer, ls_layer_family_name(l->family));
}

/* "3/4 (75%)", or "-" when there is nothing to count. */
static const char *ratio(uint64_t x, uint64_t n, char *buf, size_t len)
{
    if (!n) snprintf(buf, len, "-");
    else snprintf(buf, len, "%" PRIu64 "/%" PRIu64 " (%.4g%%)", x, n, 100.0 * (double)x / (double)n);
    return buf;
}

void ls_report_stats_text(FILE *out, const ls_compare_result *r)
{
    const ls_compare_stats *a = &r->stats;
    char b1[64];
    fprintf(out, "\ndrift statistics (diagnostics: the verdict is bitwise)\n");
    fprintf(out, "  tokens agree: %s of the positions where both selected a next token\n",
            ratio(a->tokens_agree, a->steps, b1, sizeof b1));
    fprintf(out, "  |d logprob| of the selected token (same token, %" PRIu64 " positions): mean %.6g, p50 %.6g, p99 %.6g, max %.6g\n",
            a->dlogprob.n, a->dlogprob.mean, a->dlogprob.p50, a->dlogprob.p99, a->dlogprob.max);
    fprintf(out, "  |d prob|: mean %.6g, max %.6g\n", a->dprob_mean, a->dprob_max);
    fprintf(out, "  completion (%" PRIu64 " positions): mean |old_log_probs - rollout_log_probs| %.6g; |d prob| mean %.6g, "
                 "max %.6g, std %.6g\n", a->completion_n, a->completion_mean_abs_dlogprob, a->completion_mean_abs_dprob,
            a->completion_max_abs_dprob, a->completion_std_dprob);
    fprintf(out, "  top-%d overlap (%" PRIu64 " positions): mean %.6g, min %.6g; KL over the shared top-k: mean %.6g, "
                 "p50 %.6g, p99 %.6g, max %.6g\n", r->topk_compared, a->topk_positions, a->topk_overlap_mean,
            a->topk_overlap_min, a->kl_topk.mean, a->kl_topk.p50, a->kl_topk.p99, a->kl_topk.max);
    fprintf(out, "\n  %-8s %-20s %-11s %-11s %-11s %-11s %-11s %-11s\n", "seq", "tokens agree", "mean|dlp|", "p50|dlp|",
            "p99|dlp|", "max|dlp|", "top-k ovl", "mean KL");
    for (size_t i = 0; i < r->n_seqs; i++) {
        const ls_compare_stats *q = &r->seqs[i].stats;
        fprintf(out, "  %-8u %-20s %-11.4g %-11.4g %-11.4g %-11.4g %-11.4g %-11.4g\n", r->seqs[i].seq,
                ratio(q->tokens_agree, q->steps, b1, sizeof b1), q->dlogprob.mean, q->dlogprob.p50, q->dlogprob.p99,
                q->dlogprob.max, q->topk_overlap_mean, q->kl_topk.mean);
    }
    if (!r->layer_stats || !r->n_layers) return;
    fprintf(out, "\n  per layer: digests that differ; where both traces dumped the layer, max |d|, relative error "
                 "||a-b||/||a|| and cosine similarity (mean, min)\n");
    char name[96];
    for (int l = 0; l < r->n_layers; l++) {
        const ls_compare_layer_stats *ls = &r->layer_stats[l];
        ls_report_layer_name(r, l, name, sizeof name);
        fprintf(out, "  %-36s digests differ %s\n", name, ratio(ls->digests_differ, ls->digests_compared, b1, sizeof b1));
        for (int k = 0; k < LS_DIGEST_COUNT; k++) {
            const ls_compare_dump_stats *d = &ls->dumps[k];
            if (!d->positions) continue;
            fprintf(out, "  %-36s   %-10s dumps at %" PRIu64 " positions: max |d| %.6g, rel err %.6g, cos mean %.9g, min %.9g\n",
                    "", ls_digest_kind_name((ls_digest_kind)k), d->positions, d->max_abs, d->rel_err, d->cos_mean,
                    d->cos_min);
        }
    }
}

void ls_report_write_text(FILE *out, const ls_compare_result *r, int colour)
{
    const char *green = colour ? "\033[32m" : "", *red = colour ? "\033[31;1m" : "", *bold = colour ? "\033[1m" : "",
               *off = colour ? "\033[0m" : "";
    char kinds[128], line[1024];
    fprintf(out, "A: %s (%s, engine %s, %s, %" PRIu64 " records)\n", r->a.path, r->a.mode, r->a.engine,
            r->a.complete ? "complete" : "INCOMPLETE", r->a.records);
    fprintf(out, "B: %s (%s, engine %s, %s, %" PRIu64 " records)\n", r->b.path, r->b.mode, r->b.engine,
            r->b.complete ? "complete" : "INCOMPLETE", r->b.records);
    if (r->model_differs)
        fprintf(out, "model: %sDIFFERENT%s (A %s, B %s; compared as asked: allow_different_model)\n", red, off,
                r->a.model_fingerprint, r->b.model_fingerprint);
    else
        fprintf(out, "model: %s (same)\n", r->a.model_fingerprint);
    fprintf(out, "manifest: A %s, B %s\n", r->a.manifest_digest[0] ? r->a.manifest_digest : "(none)",
            r->b.manifest_digest[0] ? r->b.manifest_digest : "(none)");
    fprintf(out, "activations: A %s, B %s\n", r->a.activation_dtype, r->b.activation_dtype);
    if (r->topk_compared)
        fprintf(out, "compared: tokens, selected logprob bits, top-%d ids/order/logprob bits; digest kinds: %s\n",
                r->topk_compared, kinds_list(r->kinds_compared, kinds, sizeof kinds));
    else
        fprintf(out, "compared: tokens and selected logprob bits (no top-k); digest kinds: %s\n",
                kinds_list(r->kinds_compared, kinds, sizeof kinds));
    if (r->note[0]) fprintf(out, "note: %s\n", r->note);
    fprintf(out, "\n%-8s %-8s %-14s %-14s %-14s %-13s %-12s %-14s\n", "seq", "result", "positions", "tokens",
            "top-k sets", "max|dlogprob|", "max KL(topk)", "digests equal");
    size_t n_pass = 0;
    for (size_t i = 0; i < r->n_seqs; i++) {
        const ls_compare_seq *s = &r->seqs[i];
        char pos[32], tok[32], tk[32], dg[40];
        uint64_t total = s->positions_compared + s->positions_only_a + s->positions_only_b;
        snprintf(pos, sizeof pos, "%" PRIu64 "/%" PRIu64, s->positions_compared, total);
        snprintf(tok, sizeof tok, "%" PRIu64 "/%" PRIu64, s->tokens_equal, s->positions_compared);
        if (r->topk_compared) snprintf(tk, sizeof tk, "%" PRIu64 "/%" PRIu64, s->topk_set_equal, s->positions_compared);
        else snprintf(tk, sizeof tk, "-");
        snprintf(dg, sizeof dg, "%" PRIu64 "/%" PRIu64, s->digests_compared - s->digests_differ, s->digests_compared);
        fprintf(out, "%-8u %s%-8s%s %-14s %-14s %-14s %-13.6g %-12.6g %-14s\n", s->seq, s->pass ? green : red,
                s->pass ? "PASS" : "FAIL", off, pos, tok, tk, s->max_abs_dlogprob, s->max_kl_topk, dg);
        n_pass += s->pass;
    }
    for (size_t i = 0; i < r->n_seqs; i++) {
        const ls_compare_seq *s = &r->seqs[i];
        if (s->pass) continue;
        fprintf(out, "\n%sseq %u first drift%s%s: %s\n", bold, s->seq, (int)i == r->first_seq ? " (first overall)" : "",
                off, s->first.message);
        if (s->first.what == LS_DRIFT_DIGEST) {
            char ha[65], hb[65];
            ls_digest_to_hex(&s->first.a_digest, ha);
            ls_digest_to_hex(&s->first.b_digest, hb);
            fprintf(out, "  digest A %s\n  digest B %s\n", ha, hb);
            ls_report_tensor_line(&s->first.tensor, line, sizeof line);
            if (line[0]) fprintf(out, "  tensor: %s\n", line);
            else fprintf(out, "  tensor: not dumped in both traces (record layer dumps in both runs for element-level diagnosis)\n");
            ls_report_router_line(&s->first.tensor, line, sizeof line);
            if (line[0]) fprintf(out, "  %s\n", line);
        }
        if (s->first_token_divergence >= 0)
            fprintf(out, "  tokens diverge from pos %" PRId64 "\n", s->first_token_divergence);
        else
            fprintf(out, "  tokens never diverged (the drift stayed below the sampled tokens)\n");
    }
    int any_router = 0;
    for (int l = 0; l < r->n_layers; l++)
        if (r->router_differ_per_layer[l]) {
            if (!any_router) fprintf(out, "\nrouter differences (MoE router digest differs):\n");
            any_router = 1;
            ls_report_layer_name(r, l, line, sizeof line);
            fprintf(out, "  %s: %" PRIu64 " positions\n", line, r->router_differ_per_layer[l]);
        }
    if (r->has_stats) ls_report_stats_text(out, r);
    double secs = (double)r->elapsed_ns / 1e9;
    fprintf(out, "\n%s%s%s: %zu/%zu sequences bitwise equal (%.1f MB of records in %.3f s)\n",
            r->equal ? green : red, r->equal ? "PASS" : "FAIL", off, n_pass, r->n_seqs,
            (double)r->bytes_compared / 1e6, secs);
}
