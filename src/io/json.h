/* lockstep — strict JSON loading and the canonical JSON form used for digests.
 *
 * Every JSON document lockstep reads (config.json, safetensors headers,
 * sharded indexes, manifests) goes through these loaders so that the same
 * rules hold everywhere: valid UTF-8, no duplicate object keys (a duplicated
 * key would make "which value wins" depend on the parser), no NUL characters
 * in strings, nothing but whitespace after the value. Any JSON value may be at
 * the top level; callers check the type they need. */
#ifndef LS_IO_JSON_H
#define LS_IO_JSON_H

#include <stddef.h>

#include <jansson.h>

#include "core/status.h"

/* Parses len bytes of buf (need not be NUL-terminated). On success *out is a
 * new reference owned by the caller (json_decref it). On failure returns
 * LS_E_INPUT with one line:
 *   "<label>: invalid JSON at line L, column C (byte offset P): <reason>"
 * where P counts bytes from the start of buf, and a duplicate key reads
 *   "... duplicate object key near '"name"'".
 * A number out of range (integer beyond 64 bits, real overflow) names the
 * member it is the value of:
 *   "... too big integer in field 'rope_parameters.rope_theta'"
 * (array elements as "eos_token_id[2]"). */
ls_status ls_json_load_buf(const char *label, const void *buf, size_t len, json_t **out,
                           ls_error *err);

/* Reads path and parses it like ls_json_load_buf (label = path). I/O failures
 * return LS_E_IO. *out is owned by the caller. */
ls_status ls_json_load_file(const char *path, json_t **out, ls_error *err);

/* Canonical text of a JSON value, for digests: object keys sorted by byte
 * order (UTF-8 code units), compact (no whitespace at all), strings as UTF-8
 * with only '"', '\\' and control characters escaped (\b \f \n \r \t, others
 * as \u00XX; '/' is not escaped, non-ASCII is not escaped).
 *   integers: decimal, as parsed (JSON integers are 64-bit signed).
 *   reals:    printf "%.17g" (enough digits to round-trip every double), then
 *             ".0" appended when the result has neither '.' nor 'e', and the
 *             exponent written without '+' and without leading zeros:
 *             1.0 -> "1.0", 0.1 -> "0.10000000000000001", 1e-7 -> "9.9999999999999995e-8",
 *             1e20 -> "1e20". An integer and a real are never equal (1 vs 1.0).
 * Returns a malloc'd NUL-terminated string the caller frees, or NULL when out
 * of memory (or j is NULL). */
char *ls_json_canonical(const json_t *j);

#endif
