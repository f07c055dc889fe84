/* libFuzzer: record decoding behind a valid frame. The input is one segment
 * (seq, first position, count: 12 bytes) and an uncompressed payload; the
 * target wraps it in a correct file header and frame checksums, so the
 * fuzzer reaches record validation, which the checksums otherwise guard. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zstd.h>

#include "trace/trace_internal.h"

static const ls_trace_layer layers[] = {{0, LS_FAMILY_EMBED, -1}, {1, LS_FAMILY_GDN, 0}, {2, LS_FAMILY_MOE, 0}};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 12 || size > (1u << 20)) return 0;
    char path[64];
    snprintf(path, sizeof path, "/tmp/fuzz_records_%d.trace", (int)getpid());
    ls_trace_header h = {.mode = "replay", .model_fingerprint = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                         .topk = 2, .digest_kinds_mask = 0x1f, .n_layers = 3, .layers = layers};
    ls_error err;
    ls_trace_writer *w;
    if (ls_trace_writer_open(path, &h, &w, &err) != LS_OK) abort();
    ls_trace_writer_abort(w); /* only to validate h; the file is built by hand below */
    char *json;
    if (ls_trace_header_to_json(&h, &json, &err) != LS_OK) abort();
    size_t jlen = strlen(json);
    uint8_t head[16];
    memcpy(head, LS_TRACE_MAGIC, 8);
    ls_wr16(head + 8, 1);
    ls_wr16(head + 10, 0);
    ls_wr32(head + 12, (uint32_t)jlen);
    ls_sha256 sh;
    ls_digest d;
    ls_sha256_init(&sh, NULL);
    ls_sha256_update(&sh, head, 16, NULL);
    ls_sha256_update(&sh, json, jlen, NULL);
    ls_sha256_final(&sh, &d, NULL);
    FILE *f = fopen(path, "wb");
    fwrite(head, 1, 16, f);
    fwrite(json, 1, jlen, f);
    fwrite(d.bytes, 1, 32, f);
    free(json);
    const uint8_t *payload = data + 12;
    size_t plen = size - 12;
    uint32_t n_pos = ls_rd32(data + 8) % 64 + 1;
    size_t bound = ZSTD_compressBound(plen);
    uint8_t *comp = malloc(bound);
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
    size_t clen = ZSTD_compress2(cctx, comp, bound, payload, plen);
    ZSTD_freeCCtx(cctx);
    if (ZSTD_isError(clen)) abort();
    uint8_t fh[LS_TRACE_FRAME_FIXED_BYTES + LS_TRACE_SEGMENT_BYTES + 32];
    memset(fh, 0, sizeof fh);
    memcpy(fh, LS_TRACE_FRAME_MAGIC, 4);
    fh[4] = LS_FRAME_CHUNK;
    ls_wr32(fh + 12, n_pos);
    ls_wr32(fh + 16, 1);
    ls_wr32(fh + 20, ls_rd32(comp + clen - 4));
    ls_wr64(fh + 24, plen);
    ls_wr64(fh + 32, clen);
    ls_wr32(fh + 40, ls_rd32(data));
    ls_wr32(fh + 44, ls_rd32(data + 4));
    ls_wr32(fh + 48, n_pos);
    ls_sha256_buf(fh, 52, &d, NULL);
    memcpy(fh + 52, d.bytes, 32);
    fwrite(fh, 1, sizeof fh, f);
    fwrite(comp, 1, clen, f);
    free(comp);
    fclose(f);
    ls_trace_reader *r;
    if (ls_trace_reader_open(path, &r, &err) == LS_OK) {
        const ls_trace_record *rec;
        while (ls_trace_reader_next(r, &rec, &err) == LS_OK && rec) {
            volatile uint32_t sink = rec->seq + rec->pos;
            for (uint32_t i = 0; i < rec->n_dumps; i++)
                sink += ((const uint8_t *)rec->dumps[i].data)[rec->dumps[i].n_elems * ls_dump_dtype_size(rec->dumps[i].dtype) - 1];
            (void)sink;
        }
        ls_trace_reader_close(r);
    }
    unlink(path);
    return 0;
}
