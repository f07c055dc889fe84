/* lockstep — JSON comparison report (schema: docs/compare-json.schema.json). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "core/util.h"
#include "io/json.h"
#include "report/report.h"

static json_t *jreal(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *side_json(const ls_compare_side *s)
{
    return json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:b,s:I}", "path", s->path, "mode", s->mode, "engine", s->engine,
                     "model_fingerprint", s->model_fingerprint, "manifest_digest", s->manifest_digest,
                     "activation_dtype", s->activation_dtype, "complete", s->complete, "records", (json_int_t)s->records);
}

static json_t *drift_json(const ls_compare_result *r, const ls_compare_drift *d)
{
    if (d->what == LS_DRIFT_NONE) return json_null();
    json_t *o = json_pack("{s:s,s:I,s:I,s:s}", "what", ls_drift_what_name(d->what), "seq", (json_int_t)d->seq, "pos",
                          (json_int_t)d->pos, "message", d->message);
    if (d->layer >= 0) {
        json_object_set_new(o, "layer", json_integer(d->layer));
        json_object_set_new(o, "family", json_string(ls_layer_family_name(r->layers[d->layer].family)));
        json_object_set_new(o, "decoder_layer", json_integer(r->layers[d->layer].decoder_layer));
    } else {
        json_object_set_new(o, "layer", json_null());
        json_object_set_new(o, "family", json_null());
        json_object_set_new(o, "decoder_layer", json_null());
    }
    if (d->what == LS_DRIFT_DIGEST) {
        char ha[65], hb[65];
        ls_digest_to_hex(&d->a_digest, ha);
        ls_digest_to_hex(&d->b_digest, hb);
        json_object_set_new(o, "kind", json_string(ls_digest_kind_name(d->kind)));
        json_object_set_new(o, "a_digest", json_string(ha));
        json_object_set_new(o, "b_digest", json_string(hb));
    } else {
        json_object_set_new(o, "kind", json_null());
        json_object_set_new(o, "a", json_integer(d->a_value));
        json_object_set_new(o, "b", json_integer(d->b_value));
    }
    json_object_set_new(o, "topk_slot", d->topk_slot >= 0 ? json_integer(d->topk_slot) : json_null());
    const ls_tensor_diff *t = &d->tensor;
    if (t->present) {
        char ab[16], bb[16];
        int w = t->dtype == LS_DUMP_BF16 ? 4 : 8;
        snprintf(ab, sizeof ab, "0x%0*x", w, t->a_bits);
        snprintf(bb, sizeof bb, "0x%0*x", w, t->b_bits);
        const char *dt = t->dtype == LS_DUMP_BF16 ? "bf16" : t->dtype == LS_DUMP_FP32 ? "fp32" : "router";
        json_t *to = json_pack("{s:s,s:I,s:I,s:I,s:o,s:o,s:o}", "dtype", dt, "n_elems", (json_int_t)t->n_elems,
                               "first_index", (json_int_t)t->first_index, "n_differ", (json_int_t)t->n_differ,
                               "max_abs", jreal(t->max_abs), "mean_abs", jreal(t->mean_abs), "ulp",
                               json_integer((json_int_t)t->ulp));
        if (t->first_index >= 0) {
            json_object_set_new(to, "a_bits", json_string(ab));
            json_object_set_new(to, "b_bits", json_string(bb));
            json_object_set_new(to, "a_value", jreal(t->a_value));
            json_object_set_new(to, "b_value", jreal(t->b_value));
        }
        if (t->dtype == LS_DUMP_ROUTER) {
            json_t *ra = json_array(), *rb = json_array();
            for (int i = 0; i < t->router_k; i++) {
                json_array_append_new(ra, json_integer(t->router_a[i]));
                json_array_append_new(rb, json_integer(t->router_b[i]));
            }
            json_object_set_new(to, "router", json_pack("{s:o,s:o,s:b,s:b}", "a", ra, "b", rb, "set_differs",
                                                        t->router_set_differs, "order_differs", t->router_order_differs));
        }
        json_object_set_new(o, "tensor", to);
    } else {
        json_object_set_new(o, "tensor", json_null());
    }
    return o;
}

static json_t *dist_json(const ls_compare_dist *d)
{
    return json_pack("{s:I,s:o,s:o,s:o,s:o}", "n", (json_int_t)d->n, "mean", jreal(d->mean), "p50", jreal(d->p50), "p99",
                     jreal(d->p99), "max", jreal(d->max));
}

/* Drift statistics of a sequence or of all (with the per-layer figures when layers). */
static json_t *stats_json(const ls_compare_result *r, const ls_compare_stats *s, int layers)
{
    if (!r->has_stats) return json_null();
    json_t *o = json_pack(
        "{s:I,s:I,s:o,s:o,s:{s:o,s:o},s:{s:I,s:o,s:o,s:o,s:o},s:{s:I,s:o,s:o},s:o}", "steps", (json_int_t)s->steps,
        "tokens_agree", (json_int_t)s->tokens_agree, "token_agreement",
        s->steps ? jreal((double)s->tokens_agree / (double)s->steps) : json_null(), "dlogprob", dist_json(&s->dlogprob),
        "dprob", "mean", jreal(s->dprob_mean), "max", jreal(s->dprob_max), "completion", "positions",
        (json_int_t)s->completion_n, "mean_abs_logprob_diff", jreal(s->completion_mean_abs_dlogprob),
        "mean_abs_prob_diff", jreal(s->completion_mean_abs_dprob), "max_abs_prob_diff", jreal(s->completion_max_abs_dprob),
        "std_prob_diff", jreal(s->completion_std_dprob), "topk_overlap", "positions", (json_int_t)s->topk_positions,
        "mean", jreal(s->topk_overlap_mean), "min", jreal(s->topk_overlap_min), "kl_topk", dist_json(&s->kl_topk));
    if (!layers || !o) return o;
    json_t *arr = json_array();
    for (int l = 0; r->layer_stats && l < r->n_layers; l++) {
        const ls_compare_layer_stats *ls = &r->layer_stats[l];
        json_t *dumps = json_array();
        for (int k = 0; k < LS_DIGEST_COUNT; k++) {
            const ls_compare_dump_stats *d = &ls->dumps[k];
            if (!d->positions) continue;
            json_array_append_new(dumps, json_pack("{s:s,s:I,s:o,s:o,s:o,s:o}", "kind", ls_digest_kind_name((ls_digest_kind)k),
                                                   "positions", (json_int_t)d->positions, "max_abs", jreal(d->max_abs),
                                                   "rel_err", jreal(d->rel_err), "cos_mean", jreal(d->cos_mean),
                                                   "cos_min", jreal(d->cos_min)));
        }
        json_array_append_new(arr, json_pack("{s:i,s:I,s:I,s:o}", "layer", l, "digests_compared",
                                             (json_int_t)ls->digests_compared, "digests_differ",
                                             (json_int_t)ls->digests_differ, "dumps", dumps));
    }
    json_object_set_new(o, "layers", arr);
    return o;
}

ls_status ls_report_write_json(const char *path, const ls_compare_result *r, ls_error *err)
{
    json_t *kinds = json_array(), *layers = json_array(), *router = json_array(), *seqs = json_array();
    for (int k = 0; k < LS_DIGEST_COUNT; k++)
        if (r->kinds_compared & (1u << k)) json_array_append_new(kinds, json_string(ls_digest_kind_name((ls_digest_kind)k)));
    for (int l = 0; l < r->n_layers; l++) {
        json_array_append_new(layers, json_pack("{s:i,s:s,s:i}", "index", l, "family",
                                                ls_layer_family_name(r->layers[l].family), "decoder_layer",
                                                r->layers[l].decoder_layer));
        if (r->router_differ_per_layer[l])
            json_array_append_new(router, json_pack("{s:i,s:I}", "layer", l, "positions",
                                                    (json_int_t)r->router_differ_per_layer[l]));
    }
    for (size_t i = 0; i < r->n_seqs; i++) {
        const ls_compare_seq *s = &r->seqs[i];
        json_array_append_new(
            seqs, json_pack("{s:I,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:o,s:o,s:o,s:o}", "seq", (json_int_t)s->seq,
                            "result", s->pass ? "PASS" : "FAIL", "positions_compared", (json_int_t)s->positions_compared,
                            "positions_only_a", (json_int_t)s->positions_only_a, "positions_only_b",
                            (json_int_t)s->positions_only_b, "steps", (json_int_t)s->steps, "tokens_equal",
                            (json_int_t)s->tokens_equal, "topk_set_equal", (json_int_t)s->topk_set_equal,
                            "digests_compared", (json_int_t)s->digests_compared, "digests_differ",
                            (json_int_t)s->digests_differ, "router_differ", (json_int_t)s->router_differ,
                            "max_abs_dlogprob", jreal(s->max_abs_dlogprob), "max_kl_topk", jreal(s->max_kl_topk),
                            "first_token_divergence",
                            s->first_token_divergence >= 0 ? json_integer(s->first_token_divergence) : json_null(),
                            "first_drift", drift_json(r, &s->first)));
        json_object_set_new(json_array_get(seqs, i), "stats", stats_json(r, &s->stats, 0));
    }
    json_t *params = json_array();
    for (int i = 0; i < r->n_param_diffs; i++)
        json_array_append_new(params, json_pack("{s:s,s:s,s:s}", "key", r->param_diffs[i].key, "a", r->param_diffs[i].a,
                                                "b", r->param_diffs[i].b));
    json_t *root = json_pack(
        "{s:s,s:s,s:b,s:o,s:o,s:b,s:o,s:i,s:s,s:o,s:o,s:o,s:o,s:o,s:I,s:o}", "schema", "lockstep-compare/1", "result",
        r->equal ? "PASS" : "FAIL", "equal", r->equal, "a", side_json(&r->a), "b", side_json(&r->b), "model_differs",
        r->model_differs, "digest_kinds_compared", kinds, "topk_compared", r->topk_compared, "note", r->note,
        "run_params_differ", params, "layers", layers, "router_differences", router, "sequences", seqs, "first_drift",
        r->first_seq >= 0 ? drift_json(r, &r->seqs[r->first_seq].first) : json_null(), "bytes_compared",
        (json_int_t)r->bytes_compared, "elapsed_s", jreal((double)r->elapsed_ns / 1e9));
    if (!root) return ls_fail(err, LS_E_INTERNAL, "json report: cannot build the document");
    json_object_set_new(root, "stats", stats_json(r, &r->stats, 1));
    return ls_json_write_doc(path, root, "json report", err);
}
