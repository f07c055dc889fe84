/* lockstep — synth: the generator's pieces shared by its files. */
#ifndef LS_SYNTH_SYNTH_INTERNAL_H
#define LS_SYNTH_SYNTH_INTERNAL_H

#include <stdint.h>

#include "synth/synth.h"

/* Values first .. first + n - 1 of t's NORMAL (or ONE_PLUS_NORMAL) draw
 * keyed `key` (ls_synth_key of its name, or ls_synth_fused_key of a slice). */
void ls_synth_fill_normal_at(const ls_synth_tensor *t, uint64_t key, uint64_t first, uint64_t n, uint16_t *dst);

/* The key of expert e's slice `part` of a fused stack t: the per-expert
 * tensor's name (gate_proj for part 0 and up_proj for part 1 of a gate_up
 * stack, down_proj of a down stack). */
uint64_t ls_synth_fused_key(const ls_synth_tensor *t, uint64_t seed, int64_t e, int part);

#endif
