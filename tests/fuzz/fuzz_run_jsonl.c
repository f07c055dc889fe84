/* libFuzzer: the run layer's prompts and tokens JSONL loaders on arbitrary
 * bytes (both parsers; a batch that parses is checked for the invariants
 * the drivers rely on). */
#include <stdint.h>
#include <stdlib.h>

#include "run/load.h"

static void check(const ls_run_batch *b, int full)
{
    for (long i = 0; i < b->n; i++) {
        const ls_sequence *s = &b->seqs[i];
        if (s->n_tokens < (full ? 2 : 1) || !s->tokens) abort();
        if (full && (s->prompt_len < 1 || s->prompt_len >= s->n_tokens)) abort();
        for (long t = 0; t < s->n_tokens; t++)
            if (s->tokens[t] < 0 || s->tokens[t] >= 1000) abort();
        for (long j = 0; j < i; j++)
            if (b->seqs[j].id == s->id) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int full = 0; full < 2; full++) {
        ls_run_batch b;
        ls_error err;
        ls_status st = full ? ls_run_parse_tokens("fuzz.jsonl", (const char *)data, size, 1000, &b, &err)
                            : ls_run_parse_prompts("fuzz.jsonl", (const char *)data, size, 1000, &b, &err);
        if (st == LS_OK) {
            check(&b, full);
            ls_run_batch_free(&b);
        } else if (b.n != 0 || b.seqs != NULL) {
            abort(); /* a failed load leaves nothing behind */
        }
    }
    return 0;
}
