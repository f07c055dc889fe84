/* lockstep — drift statistics (see compare_stats.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compare/compare_stats.h"

/* What one sequence gathered. */
typedef struct seq_acc {
    float *dl; size_t n_dl, cap_dl;      /* |Δ selected-token logprob| per position */
    float *kl; size_t n_kl, cap_kl;      /* top-k KL per position */
    uint64_t steps, agree;
    double dprob_sum, dprob_max;
    uint64_t c_n;                        /* completion positions */
    double c_dl_sum, c_dp_sum, c_dp_sq, c_dp_max;
    uint64_t topk_n;
    double ov_sum, ov_min;
} seq_acc;

struct ls_stats {
    seq_acc *seqs; size_t n, cap;        /* indexed like the result's unsorted sequences */
};

ls_status ls_stats_create(ls_stats **out, ls_error *err)
{
    *out = calloc(1, sizeof **out);
    return *out ? LS_OK : ls_fail(err, LS_E_NOMEM, "out of memory (statistics)");
}

void ls_stats_free(ls_stats *st)
{
    if (!st) return;
    for (size_t i = 0; i < st->n; i++) {
        free(st->seqs[i].dl);
        free(st->seqs[i].kl);
    }
    free(st->seqs);
    free(st);
}

static ls_status push(float **v, size_t *n, size_t *cap, double x, ls_error *err)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 256;
        float *q = realloc(*v, c * sizeof *q);
        if (!q) return ls_fail(err, LS_E_NOMEM, "out of memory (statistics)");
        *v = q;
        *cap = c;
    }
    (*v)[(*n)++] = (float)x;
    return LS_OK;
}

static double bits_f(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static int used_slots(const ls_trace_record *r, int k)
{
    int n = 0;
    while (n < k && r->topk_ids[n] >= 0) n++; /* unused slots trail (docs/trace-format.md §5) */
    return n;
}

/* Element-level error of one (layer, kind) both records dumped. */
static void dump_pair(const ls_trace_dump *da, const ls_trace_dump *db, ls_compare_dump_stats *d)
{
    if (da->dtype != db->dtype || da->n_elems != db->n_elems) return;
    uint32_t from = da->dtype == LS_DUMP_ROUTER ? da->n_elems / 2 : 0; /* router: the weights, not the ids */
    double d2 = 0, a2 = 0, b2 = 0, ab = 0, mx = 0;
    for (uint32_t i = from; i < da->n_elems; i++) {
        double x = ls_compare_dump_value(da, i, NULL), y = ls_compare_dump_value(db, i, NULL);
        if (!isfinite(x) || !isfinite(y)) continue;
        double e = x - y;
        d2 += e * e;
        a2 += x * x;
        b2 += y * y;
        ab += x * y;
        if (fabs(e) > mx) mx = fabs(e);
    }
    /* cosine of two zero vectors: 1 when equal (both zero), else 0 */
    double cs = a2 > 0 && b2 > 0 ? ab / sqrt(a2 * b2) : (a2 == 0 && b2 == 0 ? 1.0 : 0.0);
    if (!d->positions || cs < d->cos_min) d->cos_min = cs;
    d->positions++;
    d->sum_d2 += d2;
    d->sum_a2 += a2;
    d->cos_sum += cs;
    if (mx > d->max_abs) d->max_abs = mx;
}

ls_status ls_stats_position(ls_stats *st, size_t si, uint32_t prompt_len, const ls_trace_record *a,
                            const ls_trace_record *b, int k, ls_compare_layer_stats *layers, ls_error *err)
{
    if (si >= st->n) {
        size_t n = si + 1;
        if (n > st->cap) {
            size_t c = st->cap ? st->cap : 16;
            while (c < n) c *= 2;
            seq_acc *q = realloc(st->seqs, c * sizeof *q);
            if (!q) return ls_fail(err, LS_E_NOMEM, "out of memory (statistics)");
            st->seqs = q;
            st->cap = c;
        }
        memset(st->seqs + st->n, 0, (n - st->n) * sizeof *st->seqs);
        st->n = n;
    }
    seq_acc *s = &st->seqs[si];
    /* selected next token */
    if (a->next_token >= 0 && b->next_token >= 0) {
        s->steps++;
        if (a->next_token == b->next_token) {
            s->agree++;
            double x = bits_f(a->logprob_bits), y = bits_f(b->logprob_bits);
            double dl = fabs(x - y), dp = fabs(exp(x) - exp(y));
            if (x == y) dl = dp = 0; /* equal infinities too */
            if (isfinite(dl)) {
                LS_TRY(push(&s->dl, &s->n_dl, &s->cap_dl, dl, err));
                s->dprob_sum += dp;
                if (dp > s->dprob_max) s->dprob_max = dp;
                if (a->pos + 1 >= prompt_len) { /* predicts a generated token */
                    s->c_n++;
                    s->c_dl_sum += dl;
                    s->c_dp_sum += dp;
                    s->c_dp_sq += dp * dp;
                    if (dp > s->c_dp_max) s->c_dp_max = dp;
                }
            }
        }
    }
    /* top-k: overlap of the used ids, and KL(A||B) over the shared ones */
    int na = used_slots(a, k), nb = used_slots(b, k);
    if (na || nb) {
        int shared = 0;
        double pa_sum = 0, pb_sum = 0;
        for (int x = 0; x < na; x++)
            for (int y = 0; y < nb; y++)
                if (a->topk_ids[x] == b->topk_ids[y]) {
                    shared++;
                    double la = bits_f(a->topk_logprob_bits[x]), lb = bits_f(b->topk_logprob_bits[y]);
                    if (isfinite(la) && isfinite(lb)) pa_sum += exp(la), pb_sum += exp(lb);
                }
        double ov = (double)shared / (na > nb ? na : nb);
        if (!s->topk_n || ov < s->ov_min) s->ov_min = ov;
        s->topk_n++;
        s->ov_sum += ov;
        double kl = 0;
        if (pa_sum > 0 && pb_sum > 0)
            for (int x = 0; x < na; x++)
                for (int y = 0; y < nb; y++)
                    if (a->topk_ids[x] == b->topk_ids[y]) {
                        double la = bits_f(a->topk_logprob_bits[x]), lb = bits_f(b->topk_logprob_bits[y]);
                        if (!isfinite(la) || !isfinite(lb)) continue;
                        double pa = exp(la) / pa_sum, pb = exp(lb) / pb_sum;
                        if (pa > 0 && pb > 0) kl += pa * log(pa / pb);
                    }
        if (shared) LS_TRY(push(&s->kl, &s->n_kl, &s->cap_kl, kl > 0 ? kl : 0, err));
    }
    /* dumps of the same (layer, kind) in both records (both ordered by (layer, kind)) */
    uint32_t i = 0, j = 0;
    while (layers && i < a->n_dumps && j < b->n_dumps) {
        const ls_trace_dump *x = &a->dumps[i], *y = &b->dumps[j];
        int kx = x->layer * LS_DIGEST_COUNT + x->kind, ky = y->layer * LS_DIGEST_COUNT + y->kind;
        if (kx < ky) { i++; continue; }
        if (ky < kx) { j++; continue; }
        dump_pair(x, y, &layers[x->layer].dumps[x->kind]);
        i++, j++;
    }
    return LS_OK;
}

static int cmp_float(const void *x, const void *y)
{
    float a = *(const float *)x, b = *(const float *)y;
    return a < b ? -1 : a > b;
}

/* Nearest-rank percentile of sorted v[0..n). */
static double rank(const float *v, size_t n, double q)
{
    size_t r = (size_t)ceil(q * (double)n);
    return v[r ? r - 1 : 0];
}

/* Mean, p50, p99 and max of v[0..n) (sorted in place). */
static void dist(float *v, size_t n, ls_compare_dist *d)
{
    memset(d, 0, sizeof *d);
    if (!n) return;
    qsort(v, n, sizeof *v, cmp_float);
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += v[i];
    d->n = n;
    d->mean = sum / (double)n;
    d->p50 = rank(v, n, 0.50);
    d->p99 = rank(v, n, 0.99);
    d->max = v[n - 1];
}

/* Fills out from acc; dl and kl sorted in place. */
static void fill(seq_acc *acc, ls_compare_stats *out)
{
    memset(out, 0, sizeof *out);
    out->steps = acc->steps;
    out->tokens_agree = acc->agree;
    dist(acc->dl, acc->n_dl, &out->dlogprob);
    out->dprob_mean = acc->n_dl ? acc->dprob_sum / (double)acc->n_dl : 0;
    out->dprob_max = acc->dprob_max;
    out->completion_n = acc->c_n;
    if (acc->c_n) {
        double n = (double)acc->c_n, m = acc->c_dp_sum / n, var = acc->c_dp_sq / n - m * m;
        out->completion_mean_abs_dlogprob = acc->c_dl_sum / n;
        out->completion_mean_abs_dprob = m;
        out->completion_max_abs_dprob = acc->c_dp_max;
        out->completion_std_dprob = var > 0 ? sqrt(var) : 0;
    }
    out->topk_positions = acc->topk_n;
    out->topk_overlap_mean = acc->topk_n ? acc->ov_sum / (double)acc->topk_n : 0;
    out->topk_overlap_min = acc->ov_min;
    dist(acc->kl, acc->n_kl, &out->kl_topk);
}

static ls_status append(float **v, size_t *n, const float *src, size_t m, ls_error *err)
{
    if (!m) return LS_OK;
    float *q = realloc(*v, (*n + m) * sizeof *q);
    if (!q) return ls_fail(err, LS_E_NOMEM, "out of memory (statistics)");
    memcpy(q + *n, src, m * sizeof *q);
    *v = q;
    *n += m;
    return LS_OK;
}

ls_status ls_stats_finish(ls_stats *st, ls_compare_result *r, ls_error *err)
{
    seq_acc all = {0};
    ls_status s = LS_OK;
    for (size_t i = 0; i < r->n_seqs && s == LS_OK; i++) {
        if (i >= st->n) {
            memset(&r->seqs[i].stats, 0, sizeof r->seqs[i].stats);
            continue;
        }
        seq_acc *a = &st->seqs[i];
        s = append(&all.dl, &all.n_dl, a->dl, a->n_dl, err);
        if (s == LS_OK) s = append(&all.kl, &all.n_kl, a->kl, a->n_kl, err);
        all.steps += a->steps;
        all.agree += a->agree;
        all.dprob_sum += a->dprob_sum;
        if (a->dprob_max > all.dprob_max) all.dprob_max = a->dprob_max;
        all.c_n += a->c_n;
        all.c_dl_sum += a->c_dl_sum;
        all.c_dp_sum += a->c_dp_sum;
        all.c_dp_sq += a->c_dp_sq;
        if (a->c_dp_max > all.c_dp_max) all.c_dp_max = a->c_dp_max;
        if (a->topk_n && (!all.topk_n || a->ov_min < all.ov_min)) all.ov_min = a->ov_min;
        all.topk_n += a->topk_n;
        all.ov_sum += a->ov_sum;
        fill(a, &r->seqs[i].stats);
    }
    if (s == LS_OK) fill(&all, &r->stats);
    free(all.dl);
    free(all.kl);
    for (int l = 0; s == LS_OK && r->layer_stats && l < r->n_layers; l++)
        for (int k = 0; k < LS_DIGEST_COUNT; k++) {
            ls_compare_dump_stats *d = &r->layer_stats[l].dumps[k];
            if (!d->positions) continue;
            d->rel_err = d->sum_a2 > 0 ? sqrt(d->sum_d2 / d->sum_a2) : d->sum_d2 > 0 ? INFINITY : 0;
            d->cos_mean = d->cos_sum / (double)d->positions;
        }
    if (s == LS_OK) r->has_stats = 1;
    return s;
}
