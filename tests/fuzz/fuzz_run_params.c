/* libFuzzer: the lenient run_params parser (ls_trace_run_params_parse, used
 * by run --from to read the rollout's batch). run_params is opaque to the
 * trace format, so this parse must accept every JSON object a strict parser
 * accepts, and give the same value; what it adds (an out-of-range number kept
 * as the string of its text, "\u0000" in strings) must survive a round trip:
 * its output, printed and parsed again, is the same object. A refusal names
 * run_params and a byte. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "trace/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1u << 16)) return 0;
    char *text = malloc(size + 1); /* a C string: the header's text stops at a NUL */
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    ls_error err;
    ls_error_clear(&err);
    json_t *j = ls_trace_run_params_parse(text, &err);
    json_error_t je;
    json_t *strict = json_loadb(text, strlen(text), JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!j) {
        if (strncmp(err.msg, "run_params: ", 12) != 0) abort();
        /* what a strict parser reads as an object, the lenient one reads too */
        if (strict && json_is_object(strict)) abort();
        json_decref(strict);
        free(text);
        return 0;
    }
    if (!json_is_object(j)) abort();
    if (strict && !json_equal(strict, j)) abort();
    char *again = json_dumps(j, JSON_COMPACT);
    if (!again) abort();
    json_t *k = ls_trace_run_params_parse(again, &err);
    if (!k || !json_equal(j, k)) abort();
    json_decref(k);
    free(again);
    json_decref(strict);
    json_decref(j);
    free(text);
    return 0;
}
