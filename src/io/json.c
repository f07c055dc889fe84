/* lockstep — strict JSON loading (jansson) and canonical output. */
#include "io/json.h"

#include <stdlib.h>

#include "core/util.h"

/* Duplicate keys are rejected; everything else is jansson's strict default
 * (UTF-8 checked, "\u0000" refused, trailing garbage refused). */
#define LS_JSON_LOAD_FLAGS (JSON_REJECT_DUPLICATES | JSON_DECODE_ANY)

ls_status ls_json_load_buf(const char *label, const void *buf, size_t len, json_t **out,
                           ls_error *err)
{
    if (!out) return ls_fail(err, LS_E_USAGE, "ls_json_load_buf: out is NULL");
    *out = NULL;
    if (!buf && len) return ls_fail(err, LS_E_USAGE, "ls_json_load_buf: buf is NULL");
    json_error_t je;
    json_t *j = json_loadb(buf ? (const char *)buf : "", len, LS_JSON_LOAD_FLAGS, &je);
    if (!j) {
        return ls_fail(err, LS_E_INPUT,
                       "%s: invalid JSON at line %d, column %d (byte offset %d): %s",
                       label ? label : "<json>", je.line, je.column, je.position, je.text);
    }
    *out = j;
    return LS_OK;
}

ls_status ls_json_load_file(const char *path, json_t **out, ls_error *err)
{
    if (!out) return ls_fail(err, LS_E_USAGE, "ls_json_load_file: out is NULL");
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    LS_TRY(ls_read_file(path, &text, &len, err));
    ls_status st = ls_json_load_buf(path, text, len, out, err);
    free(text);
    return st;
}

char *ls_json_canonical(const json_t *j)
{
    if (!j) return NULL;
    /* JSON_REAL_PRECISION(17): every double round-trips; the header documents
     * the exact spelling jansson produces with it. */
    return json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
}
