/* libFuzzer target: the fingerprint cache entry decoder (fingerprint/cache.h).
 * A rejected input must say where (a byte offset); an accepted one must
 * re-encode to exactly the input bytes, since the format has one encoding of
 * each entry and the decoder accepts nothing else. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fingerprint/cache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ls_fpcache_entry e;
    ls_error err;
    ls_error_clear(&err);
    if (ls_fpcache_decode("fuzz.fpc", data, size, &e, &err) != LS_OK) {
        if (err.status != LS_E_INPUT && err.status != LS_E_NOMEM) abort();
        if (err.status == LS_E_INPUT &&
            (strncmp(err.msg, "fuzz.fpc: ", 10) != 0 || !strstr(err.msg, "(byte offset ")))
            abort();
        if (e.tensors || e.path || e.count) abort();
        return 0;
    }
    uint8_t *again = NULL;
    size_t len = 0;
    if (ls_fpcache_encode(&e, &again, &len, &err) != LS_OK) abort();
    if (len != size || memcmp(again, data, size) != 0) abort();
    free(again);
    ls_fpcache_entry_free(&e);
    return 0;
}
