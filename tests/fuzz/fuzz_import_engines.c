/* libFuzzer: the engine-format importers (vllm, vllm-offline, sglang, verl)
 * on arbitrary bytes. The first byte picks the format; the rest is the file.
 * Every failure must carry a message naming the input. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trace/import.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const ls_import_format formats[] = {LS_IMPORT_VLLM, LS_IMPORT_VLLM_OFFLINE, LS_IMPORT_SGLANG,
                                               LS_IMPORT_VERL};
    if (size < 1) return 0;
    char out[64], tokens[64];
    snprintf(out, sizeof out, "/tmp/fuzz_import_engines_%d.trace", (int)getpid());
    snprintf(tokens, sizeof tokens, "/tmp/fuzz_import_engines_%d.tokens", (int)getpid());
    ls_import_format fmt = formats[data[0] % 4];
    ls_import_opts o = {.model_fingerprint = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                        .prompt_len = (data[0] & 4) ? 3 : 0, .topk = (data[0] >> 3) & 7,
                        .tokens_out = (data[0] & 0x40) ? tokens : NULL};
    ls_error err;
    ls_error_clear(&err);
    ls_import_summary sum;
    ls_status st = ls_import_mem(fmt, "fuzz.in", data + 1, size - 1, &o, out, &sum, &err);
    if (st == LS_E_INPUT && strncmp(err.msg, "fuzz.in", 7) != 0) abort();
    if (st == LS_OK && sum.records == 0) abort();
    unlink(out);
    unlink(tokens);
    return 0;
}
