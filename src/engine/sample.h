/* lockstep — token selection (docs/numerics.md §6 and rule 9).
 *
 * Greedy: the largest logprob, ties to the lower token id.
 *
 * Seeded: one uniform draw per (seed, sequence id, position of the drawn
 * token), from a counter-based generator, so a draw never depends on the
 * batch, the thread count or what was drawn before:
 *
 *   x = seed; x = mix(x ^ 0x6c6f636b73746570); x = mix(x ^ seq); x = mix(x ^ pos)
 *   mix = SplitMix64's finaliser (z ^= z>>30; z *= 0xbf58476d1ce4e5b9;
 *         z ^= z>>27; z *= 0x94d049bb133111eb; z ^= z>>31) applied to z + 0x9e3779b97f4a7c15
 *   u = (x >> 40) · 2^-24                        (24 bits, exact in fp32, u in [0, 1))
 *
 * Procedure, all fp32 with the project's ls_expf:
 *   1. candidates = token ids sorted by logprob descending, ties to the lower id;
 *   2. top-k: keep the first k (k = 0: all);
 *   3. z_i = lp_i / temperature;  e_i = exp(z_i − z_0)  (e_0 = 1);
 *   4. top-p (0 < p ≤ 1): keep the shortest prefix whose sequential sum of e
 *      reaches p · (sequential sum of all kept e);
 *   5. target = u · S where S is the sequential sum of the kept e; the token
 *      is the first candidate whose running sequential sum exceeds target (the
 *      last kept candidate if rounding leaves none).
 * temperature must be > 0 (use greedy for temperature 0). */
#ifndef LS_ENGINE_SAMPLE_H
#define LS_ENGINE_SAMPLE_H

#include <stdint.h>

#include "core/status.h"

typedef enum ls_sampling_kind {
    LS_SAMPLING_GREEDY,
    LS_SAMPLING_SEEDED
} ls_sampling_kind;

typedef struct ls_sampling {
    ls_sampling_kind kind;
    uint64_t seed;
    float temperature;         /* > 0 */
    long top_k;                /* 0 = no truncation */
    float top_p;               /* (0, 1]; 1 = no truncation */
} ls_sampling;

/* The uniform draw for (seed, seq, pos), in [0, 1). */
float ls_sample_uniform(uint64_t seed, uint32_t seq, uint32_t pos);

/* Selects a token from one row of logprobs [V]. scratch_ids [V] is caller
 * scratch. pos = the position the drawn token will occupy. */
ls_status ls_sample_select(const ls_sampling *s, const float *lp /* [V] */, long V, uint32_t seq,
                           uint32_t pos, int32_t *scratch_ids /* [V] */, int32_t *token,
                           ls_error *err);

#endif
