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

/* jansson's json_loadb, safe when memory runs out. jansson reports a failed
 * allocation as a syntax error ("invalid token", "string or '}' expected"), as
 * nothing at all (line -1, empty text), or crashes. The first call wraps
 * jansson's allocator (json_set_alloc_funcs) with one that forwards to the
 * allocator installed before it and, while this thread is inside
 * ls_json_loadb, returns here instead of handing the parser a NULL (the
 * partial parse is leaked: an error path only). Returns a new reference, or
 * NULL with *je filled and *nomem_bytes the size of the failed allocation (0
 * when the input itself was at fault). All lockstep parsing of untrusted JSON
 * goes through here. A program that installs its own jansson allocator
 * afterwards loses this protection. */
json_t *ls_json_loadb(const void *buf, size_t len, size_t flags, json_error_t *je,
                      size_t *nomem_bytes);

/* Parses len bytes of buf (need not be NUL-terminated). On success *out is a
 * new reference owned by the caller (json_decref it). On failure returns
 * LS_E_INPUT with one line:
 *   "<label>: invalid JSON at line L, column C (byte offset P): <reason>"
 * where P counts bytes from the start of buf, and a duplicate key reads
 *   "... duplicate object key near '"name"'".
 * A number out of range (integer beyond 64 bits, real overflow) names the
 * member it is the value of:
 *   "... too big integer in field 'rope_parameters.rope_theta'"
 * (array elements as "eos_token_id[2]"). When memory ran out, LS_E_NOMEM:
 *   "<label>: parsing N bytes of JSON: out of memory (M bytes asked)". */
ls_status ls_json_load_buf(const char *label, const void *buf, size_t len, json_t **out,
                           ls_error *err);

/* Reads path (ls_read_file: a regular file of at most LS_READ_JSON_MAX_BYTES)
 * and parses it like ls_json_load_buf (label = path). I/O failures return
 * LS_E_IO, a FIFO, device or oversized file LS_E_INPUT. *out is owned by the
 * caller. */
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
 * of memory (or j is NULL); ls_json_failed_bytes then says how much jansson
 * asked for. */
char *ls_json_canonical(const json_t *j);

/* Writes doc as a report does: indented, members in insertion order, a
 * final newline, atomically (ls_write_file_atomic; "-" is stdout, checked).
 * Takes the caller's reference to doc; doc NULL (a document that could not be
 * built) or no memory for the text is LS_E_NOMEM, "<what>: out of memory". */
ls_status ls_json_write_doc(const char *path, json_t *doc, const char *what, ls_error *err);

/* Size of the last jansson allocation on this thread that failed since
 * ls_json_canonical or ls_json_loadb began; 0 if none failed (or a program
 * installed its own jansson allocator). */
size_t ls_json_failed_bytes(void);

#endif
