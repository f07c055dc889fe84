/* lockstep — comparison reports: text, JSON, JUnit XML, HTML. Each writer
 * renders one ls_compare_result; the files go through ls_outfile (temporary
 * name + rename), "-" is stdout. */
#ifndef LS_REPORT_REPORT_H
#define LS_REPORT_REPORT_H

#include <stdio.h>

#include "compare/compare.h"

/* Human text (the AFD-gate style table plus the first drift). colour: ANSI
 * colours (the CLI enables them only on a terminal). */
void ls_report_write_text(FILE *out, const ls_compare_result *r, int colour);
/* JSON; schema in docs/compare-json.schema.json. */
ls_status ls_report_write_json(const char *path, const ls_compare_result *r, ls_error *err);
/* JUnit XML: one testsuite per comparison, one testcase per sequence. */
ls_status ls_report_write_junit(const char *path, const ls_compare_result *r, ls_error *err);
/* One self-contained HTML page: layers x positions heat map, |Δ logprob| plot. */
ls_status ls_report_write_html(const char *path, const ls_compare_result *r, ls_error *err);

/* GitHub Actions workflow commands on out: one ::error annotation per
 * failing sequence (its first drift; at most 10, GitHub's limit per step,
 * the last one counting the rest), or one ::notice when all pass. */
void ls_report_write_github_annotations(FILE *out, const ls_compare_result *r);
/* Appends a Markdown step summary (verdict, notes, per-sequence table, drift
 * statistics when present) to path, the file GitHub names in
 * GITHUB_STEP_SUMMARY. Appended, not replaced: GitHub collects it that way. */
ls_status ls_report_write_github_summary(const char *path, const ls_compare_result *r, ls_error *err);

/* Writes s with XML/HTML special characters escaped (control characters other
 * than newline and tab become '?'), for other writers of JUnit or HTML. */
void ls_report_xml_escape(FILE *f, const char *s);

/* ---- the gate's summary (src/run/gate.h fills it) ------------------------------ */

#define LS_GATE_MAX_VARIANTS 8

typedef struct ls_gate_row {
    char name[48];
    int perturbed;
    int equal;
    uint64_t positions, positions_total, tokens_equal, topk_equal;
    double max_dlogprob;
    int has_drift;                 /* first drift below */
    char first[512];               /* its one-line message */
    uint32_t seq, pos;
    int layer, decoder_layer;
    ls_layer_family family;
    ls_digest_kind kind;
    int digest_drift;              /* the first drift is a layer digest */
    double seconds;
} ls_gate_row;

typedef struct ls_gate_result {
    int all_equal;                 /* every strict variant bitwise equal */
    int n_rows;
    ls_gate_row rows[LS_GATE_MAX_VARIANTS];
    char merkle_root[65];
    char manifest_digest[65];
    uint64_t rollout_positions;
    double rollout_seconds;
} ls_gate_result;

/* JUnit XML: one testsuite per replay, each holding one testcase (the
 * replay compared with the rollout); a failure carries the first drift.
 * A perturbed replay fails when it is NOT detected. */
ls_status ls_report_write_gate_junit(const char *path, const ls_gate_result *r, ls_error *err);
/* JSON summary: verdict, model, manifest, per replay the counts and first
 * drift; path "-" is stdout. Schema in docs/gate-json.schema.json: every
 * field but the wall times (rollout_seconds, per-replay seconds) is a
 * function of the inputs. */
ls_status ls_report_write_gate_json(const char *path, const char *backend, long max_new,
                                    const ls_gate_result *r, ls_error *err);

#endif
