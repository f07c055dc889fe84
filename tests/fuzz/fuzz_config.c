/* libFuzzer target: strict JSON loading and the canonical form. Checks the
 * canonical text is a fixed point: parse(canonical(x)) has the same canonical
 * text, otherwise digests of configs would depend on formatting. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *j = NULL;
    ls_error err;
    ls_error_clear(&err);
    if (ls_json_load_buf("fuzz.json", data, size, &j, &err) != LS_OK) {
        if (strncmp(err.msg, "fuzz.json: invalid JSON at line ", 32) != 0) abort();
        return 0;
    }
    char *c = ls_json_canonical(j);
    if (!c) abort();
    json_t *k = NULL;
    if (ls_json_load_buf("canonical", c, strlen(c), &k, &err) != LS_OK) abort();
    char *c2 = ls_json_canonical(k);
    if (!c2 || strcmp(c, c2) != 0) abort();
    if (!json_equal(j, k)) abort();
    free(c);
    free(c2);
    json_decref(k);
    json_decref(j);
    return 0;
}
