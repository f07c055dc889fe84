/* lockstep — drift statistics for the comparator (internal to compare/).
 *
 * The comparator hands every position present in both traces to
 * ls_stats_position; ls_stats_finish turns what was gathered into the
 * figures of compare.h (ls_compare_stats per sequence and overall, the dump
 * figures per layer). Memory: two floats per compared position (|Δ logprob|
 * and the top-k KL, for exact percentiles), kept until the end. */
#ifndef LS_COMPARE_COMPARE_STATS_H
#define LS_COMPARE_COMPARE_STATS_H

#include <stddef.h>

#include "compare/compare.h"

typedef struct ls_stats ls_stats;

ls_status ls_stats_create(ls_stats **out, ls_error *err);
/* One position present in both traces, of the sequence at index si of the
 * result's (unsorted) sequence array. a and b have their dumps decoded when
 * they carry any. k: top-k slots compared. layers: [n_layers] per-layer
 * figures to add the dump errors to. */
ls_status ls_stats_position(ls_stats *st, size_t si, uint32_t prompt_len, const ls_trace_record *a,
                            const ls_trace_record *b, int k, ls_compare_layer_stats *layers, ls_error *err);
/* Fills r->seqs[i].stats (i in the unsorted order ls_stats_position saw),
 * r->stats and the derived per-layer dump figures; sets r->has_stats. */
ls_status ls_stats_finish(ls_stats *st, ls_compare_result *r, ls_error *err);
void ls_stats_free(ls_stats *st);

#endif
