/* lockstep — ablation; see ablate.h. */
#include "run/ablate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "fingerprint/fingerprint.h"
#include "io/checkpoint.h"
#include "trace/trace.h"

/* ---- families and layers ---------------------------------------------------- */

/* Causal order within a decoder layer, then the head. */
static const ls_perturb_op families[] = {
    LS_PERTURB_NORM,   LS_PERTURB_CONV,    LS_PERTURB_GDN,     LS_PERTURB_ATTENTION,
    LS_PERTURB_ROUTER, LS_PERTURB_EXPERTS, LS_PERTURB_COMBINE, LS_PERTURB_LM_HEAD,
};
_Static_assert(sizeof families / sizeof families[0] == LS_PERTURB_COUNT - 1,
               "every perturbation op is an ablation family");

const ls_perturb_op *ls_ablate_families(int *n)
{
    *n = (int)(sizeof families / sizeof families[0]);
    return families;
}

const char *ls_ablate_outcome_name(ls_ablate_outcome o)
{
    switch (o) {
    case LS_ABLATE_NO_DRIFT: return "no_drift";
    case LS_ABLATE_DRIFT: return "drift";
    case LS_ABLATE_UNSUPPORTED: return "unsupported";
    }
    return "?";
}

/* The decimal layers of a comma list into out (room for every entry; NULL:
 * syntax only), their count into *n (may be NULL); LS_E_USAGE on a syntax
 * error, a repeat, or a layer above max_layer (when >= 0). */
static ls_status parse_list(const char *s, long max_layer, int *out, int *n, ls_error *err)
{
    int count = 0;
    const char *p = s;
    for (;;) {
        char *end;
        if (*p < '0' || *p > '9')
            return ls_fail(err, LS_E_USAGE, "layers (--layers) '%s': expected sample, all or decoder "
                           "layers L,L,...", s);
        long l = strtol(p, &end, 10);
        if (l > 1000000) return ls_fail(err, LS_E_USAGE, "layers (--layers) '%s': layer %ld is too large", s, l);
        if (max_layer >= 0 && l > max_layer)
            return ls_fail(err, LS_E_USAGE, "layers (--layers): layer %ld is outside the model's decoder "
                           "layers 0..%ld", l, max_layer);
        for (int i = 0; out && i < count; i++)
            if (out[i] == (int)l)
                return ls_fail(err, LS_E_USAGE, "layers (--layers) '%s': layer %ld is listed twice", s, l);
        if (out) out[count] = (int)l;
        count++;
        if (*end == '\0') break;
        if (*end != ',')
            return ls_fail(err, LS_E_USAGE, "layers (--layers) '%s': expected sample, all or decoder "
                           "layers L,L,...", s);
        p = end + 1;
    }
    if (n) *n = count;
    return LS_OK;
}

ls_status ls_ablate_layers_check(const char *layers, ls_error *err)
{
    if (!layers || !strcmp(layers, "sample") || !strcmp(layers, "all")) return LS_OK;
    /* syntax and repeats here; the model's range when the model is known */
    size_t most = 1;
    for (const char *p = layers; *p; p++) most += *p == ',';
    int *seen = malloc(sizeof(int) * most);
    if (!seen) return ls_fail(err, LS_E_NOMEM, "ablate: out of memory");
    int n;
    ls_status st = parse_list(layers, -1, seen, &n, err);
    free(seen);
    return st;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

ls_status ls_ablate_layers(const ls_model_config *c, ls_perturb_op op, const char *layers, int *out, int *n,
                           ls_error *err)
{
    *n = 0;
    if (op == LS_PERTURB_LM_HEAD) {
        if (layers && strcmp(layers, "sample") && strcmp(layers, "all"))
            LS_TRY(parse_list(layers, c->n_layers - 1, NULL, NULL, err)); /* still a valid list */
        out[(*n)++] = -1;
        return LS_OK;
    }
    int m = 0; /* the layers where op exists, ascending */
    for (long l = 0; l < c->n_layers; l++)
        if (ls_perturb_op_in_layer(c, op, l)) out[m++] = (int)l;
    if (!layers || !strcmp(layers, "sample")) {
        if (m == 0) return LS_OK;
        int pick[3] = {out[0], out[(m - 1) / 2], out[m - 1]}, k = 0;
        for (int i = 0; i < 3; i++)
            if (k == 0 || pick[i] != out[k - 1]) out[k++] = pick[i];
        *n = k;
        return LS_OK;
    }
    if (!strcmp(layers, "all")) {
        *n = m;
        return LS_OK;
    }
    int *listed = malloc(sizeof(int) * (size_t)(c->n_layers > 0 ? c->n_layers : 1));
    if (!listed) return ls_fail(err, LS_E_NOMEM, "ablate: out of memory");
    int nl = 0;
    /* parse_list refuses repeats and layers past the model, so nl <= n_layers */
    ls_status st = parse_list(layers, c->n_layers - 1, listed, &nl, err);
    if (st == LS_OK) {
        qsort(listed, (size_t)nl, sizeof *listed, cmp_int);
        int k = 0;
        for (int i = 0; i < nl; i++)
            if (ls_perturb_op_in_layer(c, op, listed[i])) out[k++] = listed[i];
        *n = k;
    }
    free(listed);
    return st;
}

/* The trace layer whose output op in decoder layer `layer` reaches first:
 * the layer's mixer (norm: input_layernorm feeds it; conv, gdn, attention
 * are in it), its MoE (router, experts, combine), or the lm_head layer. */
static int planted_trace_layer(const ls_compare_result *c, ls_perturb_op op, int layer)
{
    for (int i = 0; i < c->n_layers; i++) {
        const ls_trace_layer *t = &c->layers[i];
        switch (op) {
        case LS_PERTURB_LM_HEAD:
            if (t->family == LS_FAMILY_LM_HEAD) return i;
            break;
        case LS_PERTURB_ROUTER:
        case LS_PERTURB_EXPERTS:
        case LS_PERTURB_COMBINE:
            if (t->family == LS_FAMILY_MOE && t->decoder_layer == layer) return i;
            break;
        default:
            if ((t->family == LS_FAMILY_GDN || t->family == LS_FAMILY_ATTENTION) && t->decoder_layer == layer)
                return i;
            break;
        }
    }
    return -1;
}

/* ---- measuring one pair of traces ------------------------------------------- */

typedef struct prompt_lens {
    long n;
    const ls_sequence *seqs;       /* the prompts, borrowed */
} prompt_lens;

static long prompt_len_of(const prompt_lens *p, uint32_t seq)
{
    for (long i = 0; i < p->n; i++)
        if (p->seqs[i].id == seq) return p->seqs[i].n_tokens;
    return 0;
}

static const ls_compare_seq *seq_of(const ls_compare_result *c, uint32_t seq)
{
    for (size_t i = 0; i < c->n_seqs; i++)
        if (c->seqs[i].seq == seq) return &c->seqs[i];
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest rank, as compare's statistics. */
static double rank(const double *v, size_t n, double q)
{
    size_t r = (size_t)ceil(q * (double)n);
    return v[r ? r - 1 : 0];
}

static double bits_float(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* Walks the strict trace in record order and finds each position in the
 * ablated one: |Δ logprob| where the context is the same, and the first
 * completion position of each sequence where the top-1 token differs. */
static ls_status measure(const char *strict_path, const char *other_path, const ls_compare_result *c,
                         const prompt_lens *pl, ls_ablate_cell *cell, ls_error *err)
{
    ls_trace_reader *ra = NULL;
    ls_trace_index *ix = NULL;
    double *dl = NULL;
    size_t n_dl = 0, cap = 0;
    int64_t *first_div = calloc(c->n_seqs ? c->n_seqs : 1, sizeof *first_div);
    if (!first_div) return ls_fail(err, LS_E_NOMEM, "ablate: out of memory");
    for (size_t i = 0; i < c->n_seqs; i++) first_div[i] = -1;
    ls_status st = ls_trace_reader_open(strict_path, &ra, err);
    if (st == LS_OK) st = ls_trace_index_open(other_path, &ix, err);
    const ls_trace_record *a, *b;
    while (st == LS_OK && (st = ls_trace_reader_next(ra, &a, err)) == LS_OK && a) {
        const ls_compare_seq *s = seq_of(c, a->seq);
        if (!s) continue;
        /* The context at pos is the same when every earlier token is: before
         * the first position whose input or next token differs, and at it
         * when its input token is still the same. */
        int64_t ftd = s->first_token_divergence;
        uint32_t seq = a->seq, pos = a->pos;
        /* a stays valid: the index reads the other file */
        st = ls_trace_index_find(ix, seq, pos, &b, err);
        if (st != LS_OK) break;
        if (!b || (ftd >= 0 && (int64_t)pos > ftd) || b->token != a->token) continue;
        cell->positions++;
        if (!ls_trace_record_bytes_equal(a, b)) cell->positions_differ++;
        if (a->next_token >= 0 && a->next_token == b->next_token) {
            double x = bits_float(a->logprob_bits), y = bits_float(b->logprob_bits);
            if (x == x && y == y) {
                if (n_dl == cap) {
                    size_t nc = cap ? cap * 2 : 256;
                    double *g = realloc(dl, nc * sizeof *dl);
                    if (!g) {
                        st = ls_fail(err, LS_E_NOMEM, "ablate: out of memory");
                        break;
                    }
                    dl = g, cap = nc;
                }
                dl[n_dl++] = fabs(x - y);
            }
        }
        long plen = prompt_len_of(pl, seq);
        size_t si = (size_t)(s - c->seqs);
        if ((int64_t)pos + 1 >= plen && a->topk_ids[0] != b->topk_ids[0] &&
            (first_div[si] < 0 || (int64_t)pos < first_div[si]))
            first_div[si] = pos;
    }
    if (st == LS_OK && ix) st = ls_trace_index_verify(ix, err);
    if (st == LS_OK) {
        memset(&cell->dlogprob, 0, sizeof cell->dlogprob);
        if (n_dl) {
            qsort(dl, n_dl, sizeof *dl, cmp_double);
            double sum = 0;
            for (size_t i = 0; i < n_dl; i++) sum += dl[i];
            cell->dlogprob.n = n_dl;
            cell->dlogprob.mean = sum / (double)n_dl;
            cell->dlogprob.p50 = rank(dl, n_dl, 0.50);
            cell->dlogprob.p99 = rank(dl, n_dl, 0.99);
            cell->dlogprob.max = dl[n_dl - 1];
        }
        cell->seqs = (long)c->n_seqs;
        cell->diverge_seq = cell->diverge_pos = cell->tokens_until_divergence = -1;
        for (size_t i = 0; i < c->n_seqs; i++) {
            if (first_div[i] < 0) continue;
            cell->seqs_diverged++;
            long plen = prompt_len_of(pl, c->seqs[i].seq);
            int64_t tokens = first_div[i] - (plen > 0 ? plen - 1 : 0);
            if (cell->tokens_until_divergence < 0 || tokens < cell->tokens_until_divergence) {
                cell->tokens_until_divergence = tokens;
                cell->diverge_seq = c->seqs[i].seq;
                cell->diverge_pos = first_div[i];
            }
        }
    }
    free(dl);
    free(first_div);
    ls_trace_index_close(ix);
    ls_trace_reader_close(ra);
    return st;
}

/* Compares other with the strict trace and fills cell (outcome, first
 * drift, figures). keep (may be NULL) receives the comparison, for its
 * layer table: free it with ls_compare_result_free. */
static ls_status judge(const char *strict_path, const char *other_path, const prompt_lens *pl,
                       ls_ablate_cell *cell, ls_compare_result *keep, ls_error *err)
{
    ls_compare_result c;
    ls_status st = ls_compare_files(strict_path, other_path, NULL, &c, err);
    if (st == LS_OK) {
        cell->outcome = c.equal ? LS_ABLATE_NO_DRIFT : LS_ABLATE_DRIFT;
        if (c.first_seq >= 0) cell->first = c.seqs[c.first_seq].first;
        else if (!c.equal)
            /* positions held by one trace only, no differing bits: said by the note */
            snprintf(cell->first.message, sizeof cell->first.message, "%.500s", c.note);
        st = measure(strict_path, other_path, &c, pl, cell, err);
    }
    if (st == LS_OK && keep) *keep = c;
    else ls_compare_result_free(&c);
    return st;
}

/* ---- the ablation ------------------------------------------------------------ */

void ls_ablate_result_free(ls_ablate_result *r)
{
    free(r->cells);
    r->cells = NULL;
    r->n_cells = 0;
}

const char *ls_ablate_substitute(const ls_ablate_opts *o, int *fast_twin)
{
    *fast_twin = o->backend && !strcmp(o->backend, "cuda");
    return *fast_twin ? LS_ABLATE_SUBSTITUTE_TWIN : LS_ABLATE_SUBSTITUTE_PLANTED;
}

static const char *family_label(ls_perturb_op op)
{
    return op == LS_PERTURB_NONE ? "control" : ls_perturb_op_name(op);
}

static void report_cell(const ls_ablate_cell *w, size_t i, size_t n)
{
    char where[48] = "";
    if (w->layer >= 0) snprintf(where, sizeof where, " layer %d", w->layer);
    char head[96];
    if (w->op == LS_PERTURB_NONE) snprintf(head, sizeof head, "ablate: control (strict again)");
    else snprintf(head, sizeof head, "ablate: [%zu/%zu] %s%s", i + 1, n, family_label(w->op), where);
    switch (w->outcome) {
    case LS_ABLATE_UNSUPPORTED:
        fprintf(stderr, "%s: not ablatable on this backend (%s)\n", head, w->note);
        break;
    case LS_ABLATE_NO_DRIFT:
        fprintf(stderr, "%s: no drift (%.2f s)\n", head, w->seconds);
        break;
    case LS_ABLATE_DRIFT:
        fprintf(stderr, "%s: drift at sequence %u position %u, trace layer %d; max |dlogprob| %.3g; %ld/%ld "
                "sequences diverge (%.2f s)\n", head, w->first.seq, w->first.pos, w->first.layer,
                w->dlogprob.max, w->seqs_diverged, w->seqs, w->seconds);
        break;
    }
    fflush(stderr);
}

ls_status ls_ablate_run(const ls_ablate_opts *o, const ls_run_batch *batch, ls_ablate_result *r,
                        ls_error *err)
{
    memset(r, 0, sizeof *r);
    const char *mode = o->mode ? o->mode : "rollout";
    int replay = !strcmp(mode, "replay");
    if (!replay && strcmp(mode, "rollout"))
        return ls_fail(err, LS_E_USAGE, "mode (--mode) '%s': expected rollout or replay", mode);
    if (o->max_new < 1)
        return ls_fail(err, LS_E_USAGE, "max_new (--max-new-tokens) %ld: expected >= 1", o->max_new);
    int twin;
    ls_ablate_substitute(o, &twin);
    if (o->tier == LS_TIER_FAST || (o->tier != LS_TIER_PORTABLE && !twin))
        return ls_fail(err, LS_E_USAGE, "tier (--tier) %s: the strict run's tier is portable, or tc on the cuda "
                       "backend", ls_run_tier_name(o->tier));
    LS_TRY(ls_ablate_layers_check(o->layers, err));
    snprintf(r->mode, sizeof r->mode, "%s", mode);

    ls_checkpoint *ck = NULL;
    ls_fingerprint fp = {0};
    ls_model_config cfg;
    ls_status st = ls_run_checkpoint_open(o->checkpoint, &ck, NULL, err);
    if (st == LS_OK) st = ls_model_parse_config(ls_checkpoint_config_json(ck), &cfg, err);
    /* the cells, decided before any run so that a bad layer list costs nothing */
    int nf;
    const ls_perturb_op *fam = ls_ablate_families(&nf);
    int *lay = NULL;
    if (st == LS_OK) {
        r->n_layers = cfg.n_layers;
        lay = malloc(sizeof(int) * (size_t)(cfg.n_layers + 1));
        r->cells = calloc((size_t)nf * (size_t)(cfg.n_layers + 1), sizeof *r->cells);
        if (!lay || !r->cells) st = ls_fail(err, LS_E_NOMEM, "ablate: out of memory");
    }
    for (int f = 0; st == LS_OK && f < nf; f++) {
        int n;
        st = ls_ablate_layers(&cfg, fam[f], o->layers, lay, &n, err);
        for (int i = 0; st == LS_OK && i < n; i++) {
            ls_ablate_cell *w = &r->cells[r->n_cells++];
            w->op = fam[f];
            w->layer = lay[i];
        }
    }
    free(lay); /* never no cell: lm_head is ablated whatever the layers */
    /* Hash the checkpoint once: every run pins the same checkpoint section. */
    if (st == LS_OK) st = ls_run_fingerprint(ck, o->hash_cache, o->progress, &fp, err);

    char dir[4096] = "", strict[4200], first[4200], path[4300];
    int temporary = 0, have_dir = 0;
    if (st == LS_OK) st = ls_run_workdir(o->workdir, "ablate", dir, sizeof dir, &temporary, err);
    have_dir = st == LS_OK;
    ls_run_spec s;
    ls_run_spec_default(&s);
    s.checkpoint = o->checkpoint;
    s.mode = "rollout";
    s.batch = batch;
    s.max_new = o->max_new;
    s.backend = o->backend ? o->backend : "cpu";
    s.gpu = o->gpu;
    s.tier = o->tier;
    s.threads = o->threads > 0 ? o->threads : 1;
    s.fp8 = o->fp8;
    s.fingerprint = &fp;
    s.hash_cache = o->hash_cache;
    s.progress = o->progress;
    ls_run_result res;
    ls_run_batch full = {0, NULL};
    ls_run_rollout_info info;
    snprintf(first, sizeof first, "%s/rollout.trace", dir);
    snprintf(strict, sizeof strict, "%s/strict.trace", dir);
    if (st == LS_OK) {
        /* The strict run: the rollout; in replay mode, the rollout's
         * sequences then recomputed teacher-forced, whole. */
        s.out = replay ? first : strict;
        st = ls_run_execute(&s, &res, err);
        if (st == LS_OK) {
            free(res.completions);
            memcpy(r->merkle_root, res.merkle_root, 65);
            memcpy(r->manifest_digest, res.manifest_digest, 65);
            r->strict_positions = res.positions;
            r->strict_seconds = res.seconds;
        }
    }
    if (st == LS_OK && replay) {
        st = ls_run_load_rollout(first, &full, &info, err);
        s.mode = "replay";
        s.max_new = 0;
        s.batch = &full;
        s.act_bf16 = info.act_bf16;
        s.state_digest_every = info.state_digest_every;
        s.expect_merkle_root = info.model_fingerprint;
        s.expect_source = first;
        s.fp8 = info.fp8[0] ? info.fp8 : NULL;
        s.gdn_chunked = info.gdn_chunked;
        s.out = strict;
        if (st == LS_OK) st = ls_run_execute(&s, &res, err);
        if (st == LS_OK) {
            free(res.completions);
            memcpy(r->manifest_digest, res.manifest_digest, 65);
            r->strict_positions = res.positions;
            r->strict_seconds = res.seconds;
        }
    }
    r->n_seqs = batch->n;
    prompt_lens pl = {batch->n, batch->seqs};
    if (st == LS_OK && o->progress)
        fprintf(stderr, "ablate: strict %s: %ld sequences, %llu positions in %.2f s; %zu ablated runs follow\n",
                mode, batch->n, (unsigned long long)r->strict_positions, r->strict_seconds, r->n_cells);
    /* The control: the strict run again must be bitwise equal, or no drift
     * below can be laid at a family's door. */
    ls_compare_result layout;
    int have_layout = 0;
    r->control.op = LS_PERTURB_NONE;
    r->control.layer = r->control.planted_tl = -1;
    if (st == LS_OK) {
        snprintf(path, sizeof path, "%s/control.trace", dir);
        s.out = path;
        st = ls_run_execute(&s, &res, err);
        if (st == LS_OK) {
            free(res.completions);
            r->control.seconds = res.seconds;
            st = judge(strict, path, &pl, &r->control, &layout, err);
            have_layout = st == LS_OK;
        }
        if (st == LS_OK && !o->workdir) remove(path);
        if (st == LS_OK && o->progress) report_cell(&r->control, 0, 1);
    }
    char spec[64];
    for (size_t i = 0; st == LS_OK && i < r->n_cells; i++) {
        ls_ablate_cell *w = &r->cells[i];
        w->planted_tl = planted_trace_layer(&layout, w->op, w->layer);
        snprintf(spec, sizeof spec, "layer=%d,op=%s%s", w->layer < 0 ? 0 : w->layer, ls_perturb_op_name(w->op),
                 twin ? ",twin=fast" : "");
        if (w->layer < 0) snprintf(path, sizeof path, "%s/%s.trace", dir, ls_perturb_op_name(w->op));
        else snprintf(path, sizeof path, "%s/%s-%d.trace", dir, ls_perturb_op_name(w->op), w->layer);
        s.perturb = spec;
        s.out = path;
        ls_error inner;
        ls_error_clear(&inner);
        ls_status rs = ls_run_execute(&s, &res, &inner);
        if (rs == LS_E_UNSUPPORTED) {
            w->outcome = LS_ABLATE_UNSUPPORTED;
            snprintf(w->note, sizeof w->note, "%s", inner.msg);
        } else if (rs != LS_OK) {
            st = ls_fail(err, rs, "ablate: %s: %s", spec, inner.msg);
        } else {
            free(res.completions);
            w->seconds = res.seconds;
            st = judge(strict, path, &pl, w, NULL, err);
            if (!o->workdir) remove(path);
        }
        if (st == LS_OK && o->progress) report_cell(w, i, r->n_cells);
    }
    s.perturb = NULL;
    if (have_layout) ls_compare_result_free(&layout);
    ls_run_batch_free(&full);
    ls_fingerprint_free(&fp);
    ls_checkpoint_close(ck);
    if (have_dir && temporary) ls_run_workdir_remove(dir);
    return st;
}
