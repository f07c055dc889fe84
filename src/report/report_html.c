/* lockstep — one self-contained HTML page per comparison: summary table, a
 * layers x positions heat map per sequence (first drift marked) and a plot of
 * |d logprob| per position. Inline SVG and CSS only: no scripts, no network. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "report/report.h"
#include "report/report_internal.h"

static const char *cell_colour(uint8_t c)
{
    switch (c) {
    case LS_CELL_EQUAL: return "#2e7d32";
    case LS_CELL_DIFFERS: return "#f9a825";
    case LS_CELL_FIRST: return "#d50000";
    default: return "#e0e0e0";
    }
}

static void row_label(const ls_compare_result *r, int row, char *buf, size_t n)
{
    if (row == 0) snprintf(buf, n, "input token");
    else if (row == r->n_layers + 1) snprintf(buf, n, "next token / logprob");
    else if (row == r->n_layers + 2) snprintf(buf, n, "top-%d", r->topk_compared);
    else {
        const ls_trace_layer *l = &r->layers[row - 1];
        if (l->decoder_layer >= 0) snprintf(buf, n, "%d %s (L%d)", row - 1, ls_layer_family_name(l->family), l->decoder_layer);
        else snprintf(buf, n, "%d %s", row - 1, ls_layer_family_name(l->family));
    }
}

static const char *cell_state(uint8_t v)
{
    return v == LS_CELL_FIRST ? "FIRST DRIFT" : v == LS_CELL_DIFFERS ? "differs" : v == LS_CELL_EQUAL ? "equal" : "not compared";
}

/* The x of the prompt/completion boundary (between positions prompt_len - 1
 * and prompt_len) in a row of `cols` columns of width cw from x0, or -1. */
static int boundary_x(const ls_compare_seq *s, int x0, double cw)
{
    if (!s->prompt_len || !s->pos_per_col || s->prompt_len >= s->pos_end) return -1;
    return x0 + (int)((double)s->prompt_len / s->pos_per_col * cw);
}

/* A coordinate for an SVG attribute: an integer as such, else one decimal. */
static void svg_num(FILE *f, double v)
{
    if (v == (double)(long)v) fprintf(f, "%ld", (long)v);
    else fprintf(f, "%.1f", v);
}

/* Rows with more runs of equal cells than this are drawn compactly. */
#define HTML_DENSE_RUNS 8

/* Last position of columns [c, e) of s, for a tooltip. */
static uint32_t run_last_pos(const ls_compare_seq *s, uint32_t e)
{
    return e * s->pos_per_col - 1 < s->pos_end ? e * s->pos_per_col - 1 : s->pos_end - 1;
}

/* One row of s->cols cells from x0, cw wide each (gap: blank pixels at each
 * run's right), at y, h high, drawn as runs of equal cells. A row of few runs
 * draws a rectangle per run whose tooltip gives its positions. A dense row
 * (sporadic differences, as between two engines that are nearly equal) draws
 * one background rectangle in its commonest state and one path per other
 * state at a dozen bytes per run, under one tooltip for the row: 32
 * sequences x 99 layers of such rows weigh a few MB, not tens. A first-drift
 * cell is always a rectangle of its own (outlined when stroke_first).
 * Tooltips start with `prefix`. */
static void cell_row(FILE *f, const ls_compare_seq *s, const uint8_t *cells, double x0, double cw, double gap, int y,
                     int h, const char *prefix, int stroke_first)
{
    uint32_t runs = 0, count[4] = {0, 0, 0, 0};
    for (uint32_t c = 0; c < s->cols;) {
        uint32_t e = c + 1;
        while (e < s->cols && cells[e] == cells[c] && cells[c] != LS_CELL_FIRST) e++;
        runs++;
        count[cells[c] & 3] += e - c;
        c = e;
    }
    int dense = runs > HTML_DENSE_RUNS;
    uint8_t bg = LS_CELL_EQUAL;
    if (dense) {
        for (uint8_t v = LS_CELL_NONE; v <= LS_CELL_DIFFERS; v++)
            if (count[v] > count[bg]) bg = v;
        fprintf(f, "<g><title>%s: %u runs of equal cells (the axis gives the positions per column)</title><rect x=\"", prefix,
                runs);
        svg_num(f, x0);
        fprintf(f, "\" y=\"%d\" width=\"", y);
        svg_num(f, s->cols * cw - gap);
        fprintf(f, "\" height=\"%d\" fill=\"%s\"/>", h, cell_colour(bg));
        for (uint8_t v = LS_CELL_NONE; v <= LS_CELL_DIFFERS; v++) {
            if (v == bg || !count[v]) continue;
            fprintf(f, "<path fill=\"%s\" d=\"", cell_colour(v));
            double last = -1;
            for (uint32_t c = 0; c < s->cols;) {
                uint32_t e = c + 1;
                while (e < s->cols && cells[e] == cells[c] && cells[c] != LS_CELL_FIRST) e++;
                if (cells[c] == v) {
                    /* after 'z' the pen is back at the run's corner: the next run is a relative move,
                     * from coordinates rounded to the 0.1 printed so that the moves do not drift */
                    double x = round((x0 + c * cw) * 10) / 10, w = round(((e - c) * cw - gap) * 10) / 10;
                    if (last < 0) {
                        fputc('M', f);
                        svg_num(f, x);
                        fprintf(f, " %d", y);
                    } else {
                        fputc('m', f);
                        svg_num(f, x - last);
                        fputs(" 0", f);
                    }
                    fputc('h', f);
                    svg_num(f, w);
                    fprintf(f, "v%dh", h);
                    svg_num(f, -w);
                    fputc('z', f);
                    last = x;
                }
                c = e;
            }
            fputs("\"/>", f);
        }
    }
    for (uint32_t c = 0; c < s->cols;) {
        uint32_t e = c + 1;
        while (e < s->cols && cells[e] == cells[c] && cells[c] != LS_CELL_FIRST) e++;
        uint8_t v = cells[c];
        if (!dense || v == LS_CELL_FIRST) {
            fputs("<rect x=\"", f);
            svg_num(f, x0 + c * cw);
            fprintf(f, "\" y=\"%d\" width=\"", y);
            svg_num(f, (e - c) * cw - gap);
            fprintf(f, "\" height=\"%d\" fill=\"%s\"%s><title>%s, positions %u..%u: %s</title></rect>", h, cell_colour(v),
                    v == LS_CELL_FIRST && stroke_first ? " stroke=\"#000\" stroke-width=\"2\"" : "", prefix,
                    c * s->pos_per_col, run_last_pos(s, e), cell_state(v));
        }
        c = e;
    }
    if (dense) fputs("</g>", f);
    fputc('\n', f);
}

/* One sequence's layers x positions map, each row drawn by cell_row. */
static void heatmap(FILE *f, const ls_compare_result *r, const ls_compare_seq *s)
{
    int rows = r->n_layers + 3;
    int cw = s->cols ? (int)(900 / s->cols) : 8, ch = rows > 60 ? 6 : 12;
    if (cw > 16) cw = 16;
    if (cw < 2) cw = 2;
    int lw = 170, top = 24, w = lw + cw * (int)s->cols + 10, h = top + ch * rows + 28;
    fprintf(f, "<svg class=\"hm\" width=\"%d\" height=\"%d\" role=\"img\" aria-label=\"heat map seq %u\">\n", w, h, s->seq);
    fprintf(f, "<text x=\"%d\" y=\"14\" class=\"ax\">positions 0..%u (%u per column)</text>\n", lw, s->pos_end ? s->pos_end - 1 : 0,
            s->pos_per_col);
    for (int row = 0; row < rows; row++) {
        char label[96];
        row_label(r, row, label, sizeof label);
        if (rows <= 60 || row % 4 == 0 || row == rows - 1 || row == rows - 2)
            fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"rl\" text-anchor=\"end\">%s</text>\n", lw - 6,
                    top + row * ch + ch - 2, label);
        cell_row(f, s, s->cells + (size_t)row * s->cols, lw, cw, cw > 2, top + row * ch, ch - 1, label, 1);
    }
    int bx = boundary_x(s, lw, cw);
    if (bx >= 0) {
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#1565c0\" stroke-dasharray=\"6,3\"/>\n", bx, top - 4,
                bx, top + rows * ch + 4);
        fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"ax\" text-anchor=\"end\">prompt | completion (pos %u)</text>\n", bx - 4,
                top + rows * ch + 18, s->prompt_len);
    }
    if (!s->pass && s->first.pos < s->pos_end && s->pos_per_col) {
        int x = lw + (int)(s->first.pos / s->pos_per_col) * cw + cw / 2;
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#d50000\" stroke-dasharray=\"3,2\"/>\n", x, top - 4, x,
                top + rows * ch + 4);
        fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"fd\">first drift: pos %u</text>\n", x + 4, top + rows * ch + 18, s->first.pos);
    }
    fputs("</svg>\n", f);
}

/* Every sequence in one map: a row per sequence, each column the worst cell
 * of any layer at those positions (runs of equal cells drawn once). A
 * failing sequence's row links to its full heat map. */
static void overview(FILE *f, const ls_compare_result *r)
{
    int rows = r->n_layers + 3, lw = 170, pw = 900, top = 24;
    int ch = r->n_seqs > 64 ? 4 : 12;
    fprintf(f, "<svg class=\"hm\" width=\"%d\" height=\"%d\" role=\"img\" aria-label=\"all sequences\">\n", lw + pw + 10,
            top + ch * (int)r->n_seqs + 10);
    fputs("<text x=\"170\" y=\"14\" class=\"ax\">every sequence: the worst cell of any layer per column "
          "(each row spans its own positions)</text>\n", f);
    uint8_t *col = NULL;
    size_t col_cap = 0;
    for (size_t i = 0; i < r->n_seqs; i++) {
        const ls_compare_seq *s = &r->seqs[i];
        int y = top + (int)i * ch;
        if (!s->pass) fprintf(f, "<a href=\"#seq-%u\">", s->seq);
        if (ch >= 8) fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"rl\" text-anchor=\"end\">seq %u</text>", lw - 6, y + ch - 2, s->seq);
        if (s->cols > col_cap) {
            uint8_t *q = realloc(col, s->cols);
            if (!q) break;
            col = q;
            col_cap = s->cols;
        }
        for (uint32_t c = 0; c < s->cols; c++) {
            uint8_t m = 0;
            for (int row = 0; row < rows; row++) {
                uint8_t v = s->cells[(size_t)row * s->cols + c];
                if (v > m) m = v;
            }
            col[c] = m;
        }
        double cw = s->cols ? (double)pw / s->cols : pw;
        char prefix[32];
        snprintf(prefix, sizeof prefix, "seq %u", s->seq);
        cell_row(f, s, col, lw, cw, 0, y, ch - 1, prefix, 0);
        int bx = boundary_x(s, lw, cw);
        if (bx >= 0)
            fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#1565c0\"/>", bx, y, bx, y + ch - 1);
        fputs(s->pass ? "\n" : "</a>\n", f);
    }
    free(col);
    fputs("</svg>\n", f);
}

static void plot(FILE *f, const ls_compare_seq *s)
{
    int lw = 170, pw = 900, ph = 120, top = 10;
    float mx = 0;
    for (uint32_t c = 0; c < s->cols; c++)
        if (s->dlogprob[c] > mx) mx = s->dlogprob[c];
    fprintf(f, "<svg class=\"plot\" width=\"%d\" height=\"%d\" role=\"img\" aria-label=\"dlogprob seq %u\">\n", lw + pw + 20,
            ph + 40, s->seq);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fafafa\" stroke=\"#999\"/>\n", lw, top, pw, ph);
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"rl\" text-anchor=\"end\">%.3g</text>\n", lw - 6, top + 10, (double)mx);
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"rl\" text-anchor=\"end\">0</text>\n", lw - 6, top + ph);
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"rl\" text-anchor=\"end\">max |&#916; logprob|</text>\n", lw - 6, top + ph / 2);
    if (s->cols) {
        fputs("<polyline fill=\"none\" stroke=\"#1565c0\" stroke-width=\"1.5\" points=\"", f);
        for (uint32_t c = 0; c < s->cols; c++) {
            double x = lw + (s->cols > 1 ? (double)c * pw / (s->cols - 1) : pw / 2.0);
            double y = top + ph - (mx > 0 ? (double)s->dlogprob[c] / mx * (ph - 4) : 0);
            fprintf(f, "%.1f,%.1f ", x, y);
        }
        fputs("\"/>\n", f);
    }
    int bx = s->cols > 1 && s->prompt_len && s->prompt_len < s->pos_end
                 ? lw + (int)((double)s->prompt_len / s->pos_per_col * pw / (s->cols - 1)) : -1;
    if (bx >= 0 && bx <= lw + pw)
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#1565c0\" stroke-dasharray=\"6,3\"/>\n", bx, top, bx,
                top + ph);
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"ax\">position (0..%u)</text>\n", lw, top + ph + 16, s->pos_end ? s->pos_end - 1 : 0);
    fputs("</svg>\n", f);
}

/* A number for a table cell: "-" when not finite. */
static void num(FILE *f, double v)
{
    if (v == v && v - v == 0) fprintf(f, "<td>%.4g</td>", v);
    else fputs("<td>-</td>", f);
}

static void stats_row(FILE *f, const char *label, const ls_compare_stats *s)
{
    fprintf(f, "<tr><td>%s</td><td>%" PRIu64 "/%" PRIu64 "</td>", label, s->tokens_agree, s->steps);
    num(f, s->dlogprob.mean);
    num(f, s->dlogprob.p50);
    num(f, s->dlogprob.p99);
    num(f, s->dlogprob.max);
    num(f, s->completion_mean_abs_dlogprob);
    num(f, s->topk_overlap_mean);
    num(f, s->topk_overlap_min);
    num(f, s->kl_topk.mean);
    num(f, s->kl_topk.max);
    fputs("</tr>\n", f);
}

/* Per layer: the share of digests that differ (bars) and, where both traces
 * dumped the layer, the relative error of its hidden rows (a log-scale
 * line): where the error starts to grow shows even when every digest differs. */
static void layer_chart(FILE *f, const ls_compare_result *r)
{
    int n = r->n_layers, lw = 60, bw = n ? (900 / n > 24 ? 24 : 900 / n > 3 ? 900 / n : 3) : 8, ph = 140, top = 16;
    double lo = 0, hi = 0;
    int any = 0;
    for (int l = 0; l < n; l++) {
        const ls_compare_dump_stats *d = &r->layer_stats[l].dumps[LS_DIGEST_HIDDEN];
        if (!d->positions || !(d->rel_err > 0) || d->rel_err - d->rel_err != 0) continue;
        double v = log10(d->rel_err);
        if (!any || v < lo) lo = v;
        if (!any || v > hi) hi = v;
        any = 1;
    }
    if (any && hi - lo < 1) lo = hi - 1;
    fprintf(f, "<svg class=\"plot\" width=\"%d\" height=\"%d\" role=\"img\" aria-label=\"per-layer error\">\n", lw + bw * n + 80,
            ph + top + 40);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fafafa\" stroke=\"#999\"/>\n", lw, top, bw * n, ph);
    for (int l = 0; l < n; l++) {
        const ls_compare_layer_stats *ls = &r->layer_stats[l];
        double frac = ls->digests_compared ? (double)ls->digests_differ / (double)ls->digests_compared : 0;
        int h = (int)(frac * (ph - 2));
        char name[96];
        ls_report_layer_name(r, l, name, sizeof name);
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#f9a825\"><title>%s: %" PRIu64 "/%" PRIu64
                   " digests differ</title></rect>\n", lw + l * bw, top + ph - h, bw > 2 ? bw - 1 : bw, h, name,
                ls->digests_differ, ls->digests_compared);
    }
    if (any) {
        fputs("<polyline fill=\"none\" stroke=\"#1565c0\" stroke-width=\"1.5\" points=\"", f);
        for (int l = 0; l < n; l++) {
            const ls_compare_dump_stats *d = &r->layer_stats[l].dumps[LS_DIGEST_HIDDEN];
            if (!d->positions || !(d->rel_err > 0) || d->rel_err - d->rel_err != 0) continue;
            double y = top + ph - (log10(d->rel_err) - lo) / (hi - lo) * (ph - 4);
            fprintf(f, "%.1f,%.1f ", lw + l * bw + bw / 2.0, y);
        }
        fputs("\"/>\n", f);
        fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"rl\">1e%.1f</text>\n", lw + bw * n + 4, top + 10, hi);
        fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"rl\">1e%.1f</text>\n", lw + bw * n + 4, top + ph, lo);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"ax\">layers 0..%d: bars, share of digests that differ (0..1); line, "
               "relative error of the dumped hidden rows (log scale, right)</text>\n", lw, top + ph + 16, n ? n - 1 : 0);
    fputs("</svg>\n", f);
}

static void stats_html(FILE *f, const ls_compare_result *r)
{
    fputs("<h2>Drift statistics</h2>\n<p>Diagnostics beside the bitwise verdict: |&#916; logprob| of the selected token "
          "where both traces selected the same one; the completion column is the mean |old_log_probs &#8722; "
          "rollout_log_probs| RL frameworks log.</p>\n", f);
    fputs("<table><tr><th>seq</th><th>tokens agree</th><th>mean |&#916; logprob|</th><th>p50</th><th>p99</th><th>max</th>"
          "<th>completion mean</th><th>top-k overlap mean</th><th>min</th><th>KL(top-k) mean</th><th>max</th></tr>\n", f);
    stats_row(f, "all", &r->stats);
    for (size_t i = 0; i < r->n_seqs; i++) {
        char label[32];
        snprintf(label, sizeof label, "%u", r->seqs[i].seq);
        stats_row(f, label, &r->seqs[i].stats);
    }
    fputs("</table>\n", f);
    if (!r->layer_stats || !r->n_layers) return;
    layer_chart(f, r);
    fputs("<table><tr><th>layer</th><th>digests differ</th><th>dumped kind</th><th>positions</th><th>max |&#916;|</th>"
          "<th>relative error</th><th>cos mean</th><th>cos min</th></tr>\n", f);
    for (int l = 0; l < r->n_layers; l++) {
        const ls_compare_layer_stats *ls = &r->layer_stats[l];
        char name[96];
        ls_report_layer_name(r, l, name, sizeof name);
        int shown = 0;
        for (int k = 0; k <= LS_DIGEST_COUNT; k++) {
            const ls_compare_dump_stats *d = k < LS_DIGEST_COUNT ? &ls->dumps[k] : NULL;
            if (d ? !d->positions : shown) continue;
            fprintf(f, "<tr><td>%s</td><td>%" PRIu64 "/%" PRIu64 "</td>", shown ? "" : name, ls->digests_differ,
                    ls->digests_compared);
            if (d) {
                fprintf(f, "<td>%s</td><td>%" PRIu64 "</td>", ls_digest_kind_name((ls_digest_kind)k), d->positions);
                num(f, d->max_abs);
                num(f, d->rel_err);
                num(f, d->cos_mean);
                num(f, d->cos_min);
            } else {
                fputs("<td></td><td></td><td></td><td></td><td></td><td></td>", f);
            }
            fputs("</tr>\n", f);
            shown = 1;
        }
    }
    fputs("</table>\n", f);
}

ls_status ls_report_write_html(const char *path, const ls_compare_result *r, ls_error *err)
{
    ls_outfile o;
    LS_TRY(ls_outfile_open(&o, path, err));
    FILE *f = o.fp;
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>lockstep compare</title>\n"
          "<style>body{font:14px system-ui,sans-serif;margin:24px;color:#222}h1{font-size:20px}"
          "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
          "th{background:#f0f0f0}.pass{color:#2e7d32;font-weight:bold}.fail{color:#d50000;font-weight:bold}"
          ".drift{background:#ffebee;border-left:4px solid #d50000;padding:8px 12px;margin:12px 0}"
          "code{font:12px monospace}.rl{font:10px monospace}.ax{font:11px sans-serif;fill:#555}.fd{font:11px sans-serif;fill:#d50000}"
          ".legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}</style>\n"
          "</head><body>\n", f);
    fprintf(f, "<h1>lockstep compare: <span class=\"%s\">%s</span></h1>\n", r->equal ? "pass" : "fail", r->equal ? "PASS" : "FAIL");
    fputs("<p>A: <code>", f);
    ls_report_xml_escape(f, r->a.path);
    fprintf(f, "</code> (%s, %s)<br>B: <code>", r->a.mode, r->a.complete ? "complete" : "incomplete");
    ls_report_xml_escape(f, r->b.path);
    fprintf(f, "</code> (%s, %s)<br>model <code>%s</code>%s<br>manifest A <code>%s</code>, B <code>%s</code>"
               "<br>activations A %s, B %s</p>\n", r->b.mode,
            r->b.complete ? "complete" : "incomplete", r->a.model_fingerprint, r->model_differs ? " (B DIFFERS)" : "",
            r->a.manifest_digest[0] ? r->a.manifest_digest : "none", r->b.manifest_digest[0] ? r->b.manifest_digest : "none",
            r->a.activation_dtype, r->b.activation_dtype);
    if (r->note[0]) {
        fputs("<p>note: ", f);
        ls_report_xml_escape(f, r->note);
        fputs("</p>\n", f);
    }
    if (r->n_param_diffs || r->activation_differs) {
        fputs("<table><tr><th>differs</th><th>A</th><th>B</th></tr>\n", f);
        if (r->activation_differs)
            fprintf(f, "<tr><td>activation dtype</td><td>%s</td><td>%s</td></tr>\n", r->a.activation_dtype, r->b.activation_dtype);
        for (int i = 0; i < r->n_param_diffs; i++) {
            fprintf(f, "<tr><td>run_params.%s</td><td><code>", r->param_diffs[i].key);
            ls_report_xml_escape(f, r->param_diffs[i].a);
            fputs("</code></td><td><code>", f);
            ls_report_xml_escape(f, r->param_diffs[i].b);
            fputs("</code></td></tr>\n", f);
        }
        fputs("</table>\n", f);
    }
    fputs("<table><tr><th>seq</th><th>result</th><th>positions</th><th>tokens equal</th><th>top-k sets equal</th>"
          "<th>max |&#916; logprob|</th><th>max KL(top-k)</th><th>digests differing</th></tr>\n", f);
    for (size_t i = 0; i < r->n_seqs; i++) {
        const ls_compare_seq *s = &r->seqs[i];
        if (s->pass) fprintf(f, "<tr><td>%u</td>", s->seq);
        else fprintf(f, "<tr><td><a href=\"#seq-%u\">%u</a></td>", s->seq, s->seq);
        fprintf(f, "<td class=\"%s\">%s</td><td>%" PRIu64 "</td><td>%" PRIu64 "</td><td>%" PRIu64
                   "</td><td>%.6g</td><td>%.6g</td><td>%" PRIu64 "/%" PRIu64 "</td></tr>\n",
                s->pass ? "pass" : "fail", s->pass ? "PASS" : "FAIL", s->positions_compared, s->tokens_equal,
                s->topk_set_equal, s->max_abs_dlogprob, s->max_kl_topk, s->digests_differ, s->digests_compared);
    }
    fputs("</table>\n", f);
    if (r->first_seq >= 0) {
        const ls_compare_seq *s = &r->seqs[r->first_seq];
        char line[1024];
        fputs("<div class=\"drift\"><b>First drift:</b> ", f);
        ls_report_xml_escape(f, s->first.message);
        ls_report_tensor_line(&s->first.tensor, line, sizeof line);
        if (line[0]) {
            fputs("<br>", f);
            ls_report_xml_escape(f, line);
        }
        ls_report_router_line(&s->first.tensor, line, sizeof line);
        if (line[0]) {
            fputs("<br>", f);
            ls_report_xml_escape(f, line);
        }
        if (s->first_token_divergence >= 0) fprintf(f, "<br>tokens diverge from position %" PRId64, s->first_token_divergence);
        else fputs("<br>tokens never diverged", f);
        fputs("</div>\n", f);
    }
    if (r->has_stats) stats_html(f, r);
    fputs("<p class=\"legend\">cells:<span style=\"background:#2e7d32\"></span>equal<span style=\"background:#f9a825\"></span>"
          "differs<span style=\"background:#d50000;outline:2px solid #000\"></span>first drift<span style=\"background:#e0e0e0\">"
          "</span>not compared</p>\n", f);
    /* Every sequence in one overview; failing ones drawn in full (the first
     * drift's first), passing ones summarised: a passing sequence's map is
     * all equal cells, and drawing every one made pages of tens of MB. */
    size_t n_fail = 0;
    for (size_t i = 0; i < r->n_seqs; i++) n_fail += !r->seqs[i].pass;
    int drawable = 0;
    for (size_t i = 0; i < r->n_seqs; i++) drawable |= r->seqs[i].cells != NULL;
    if (drawable) overview(f, r);
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < r->n_seqs; i++) {
            const ls_compare_seq *s = &r->seqs[i];
            if (s->pass || (pass == 0) != ((int)i == r->first_seq) || !s->cells) continue;
            fprintf(f, "<h2 id=\"seq-%u\">seq %u: <span class=\"fail\">FAIL</span></h2>\n", s->seq, s->seq);
            fputs("<p>", f);
            ls_report_xml_escape(f, s->first.message);
            fputs("</p>\n", f);
            heatmap(f, r, s);
            plot(f, s);
        }
    if (r->n_seqs > n_fail)
        fprintf(f, "<p>%zu passing sequence%s not drawn: each is bitwise equal at every position both traces hold "
                   "(the overview above shows their extent).</p>\n", r->n_seqs - n_fail, r->n_seqs - n_fail == 1 ? "" : "s");
    fputs("</body></html>\n", f);
    return ls_outfile_commit(&o, err);
}
