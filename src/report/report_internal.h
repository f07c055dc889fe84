/* lockstep — helpers shared by the report writers (not public). */
#ifndef LS_REPORT_REPORT_INTERNAL_H
#define LS_REPORT_REPORT_INTERNAL_H

#include <stddef.h>
#include <stdio.h>

#include "compare/compare.h"

/* One line describing a tensor difference ("" when no dump). */
void ls_report_tensor_line(const ls_tensor_diff *t, char *buf, size_t n);
/* One line describing router ids of both sides ("" when not a router dump). */
void ls_report_router_line(const ls_tensor_diff *t, char *buf, size_t n);
/* "layer 3 (attention, decoder layer 1)". */
void ls_report_layer_name(const ls_compare_result *r, int layer, char *buf, size_t n);

/* The drift statistics section of the text report (r->has_stats). */
void ls_report_stats_text(FILE *out, const ls_compare_result *r);

#endif
