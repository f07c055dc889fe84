/* libFuzzer: the trace reader (streaming) and the index on arbitrary bytes.
 * Any input must give LS_OK or an error message, never a crash or UB. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trace/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/fuzz_trace_%d.trace", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    ls_error err;
    ls_trace_reader *r;
    if (ls_trace_reader_open(path, &r, &err) == LS_OK) {
        const ls_trace_record *rec;
        while (ls_trace_reader_next(r, &rec, &err) == LS_OK && rec) {
            volatile uint32_t sink = rec->seq + rec->pos + rec->n_digests;
            for (uint32_t i = 0; i < rec->n_dumps; i++) sink += ((const uint8_t *)rec->dumps[i].data)[0];
            (void)sink;
        }
        ls_trace_reader_close(r);
    }
    ls_trace_index *ix;
    if (ls_trace_index_open(path, &ix, &err) == LS_OK) {
        for (size_t i = 0; i < ls_trace_index_n_seqs(ix) && i < 4; i++) {
            uint32_t seq = ls_trace_index_seq(ix, i), end = ls_trace_index_seq_end(ix, seq);
            for (uint32_t p = end > 64 ? end - 64 : 0; p < end; p++) {
                const ls_trace_record *rec;
                if (ls_trace_index_find(ix, seq, p, &rec, &err) != LS_OK) break;
            }
        }
        ls_trace_index_verify(ix, &err);
        ls_trace_index_close(ix);
    }
    unlink(path);
    return 0;
}
