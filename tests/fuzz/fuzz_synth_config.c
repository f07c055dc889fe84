/* libFuzzer target: synth's config.json reader. Any input either fails with
 * a one-line message naming the file, or parses into a config whose rendering
 * parses back to the same rendering (synth's config output is a fixed point). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "synth/synth.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static ls_synth_config a, b; /* large (layer table): keep off the stack */
    ls_error err;
    ls_error_clear(&err);
    if (ls_synth_config_parse("fuzz.json", (const char *)data, size, &a, &err) != LS_OK) {
        if (strncmp(err.msg, "fuzz.json: ", 11) != 0 || strchr(err.msg, '\n')) abort();
        return 0;
    }
    char *t1 = NULL, *t2 = NULL;
    size_t n1 = 0, n2 = 0;
    if (ls_synth_config_render(&a, &t1, &n1, &err) != LS_OK) abort();
    if (ls_synth_config_parse("rendered", t1, n1, &b, &err) != LS_OK) abort();
    if (ls_synth_config_render(&b, &t2, &n2, &err) != LS_OK) abort();
    if (n1 != n2 || memcmp(t1, t2, n1) != 0) abort();
    free(t1);
    free(t2);
    return 0;
}
