/* libFuzzer target: the manifest reader (parse + validate), then a diff of
 * the manifest against itself (must find nothing) and its digest. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "manifest/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ls_error err;
    ls_error_clear(&err);
    json_t *m = NULL;
    if (ls_manifest_parse("fuzz.json", (const char *)data, size, &m, &err) != LS_OK) return 0;
    ls_manifest_delta d;
    if (ls_manifest_diff(m, m, &d, &err) == LS_OK) {
        if (d.count != 0) abort(); /* a manifest differs from itself: a bug */
        ls_manifest_diff_free(&d);
    }
    ls_digest dig;
    (void)ls_manifest_digest(m, &dig, &err);
    json_decref(m);
    return 0;
}
