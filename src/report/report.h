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

/* Writes s with XML/HTML special characters escaped (control characters other
 * than newline and tab become '?'), for other writers of JUnit or HTML. */
void ls_report_xml_escape(FILE *f, const char *s);

#endif
