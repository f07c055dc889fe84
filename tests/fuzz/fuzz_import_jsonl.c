/* libFuzzer: the JSONL importer on arbitrary bytes. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "trace/import.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char out[64];
    snprintf(out, sizeof out, "/tmp/fuzz_import_%d.trace", (int)getpid());
    ls_import_opts o = {.model_fingerprint = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", .topk = 3};
    ls_error err;
    uint64_t n;
    ls_import_jsonl("fuzz.jsonl", (const char *)data, size, &o, out, &n, &err);
    unlink(out);
    return 0;
}
