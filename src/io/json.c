/* lockstep — strict JSON loading (jansson) and canonical output. */
#include "io/json.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

/* Duplicate keys are rejected; everything else is jansson's strict default
 * (UTF-8 checked, "\u0000" refused, trailing garbage refused). */
#define LS_JSON_LOAD_FLAGS (JSON_REJECT_DUPLICATES | JSON_DECODE_ANY)

/* ---- where a number error sits --------------------------------------------------------- */

#define PATH_DEPTH_MAX 32            /* deeper nesting is named by its outer levels only */
#define PATH_KEY_SHOWN_BYTES 64      /* a longer key is cut there */

/* One open container while walking the text: an object (with the key of the
 * member being read) or an array (with the element's index). */
typedef struct path_frame {
    int is_object;
    const char *key;                 /* raw key bytes (escapes as written); objects only */
    size_t key_len;
    long index;                      /* arrays only */
    int want_key;                    /* objects: the next string is a key */
} path_frame;

/* Skips a string starting at its opening quote; returns the index after the
 * closing quote, or end when it is not closed before end. */
static size_t skip_string(const char *s, size_t i, size_t end)
{
    for (i++; i < end; i++) {
        if (s[i] == '\\') i++;
        else if (s[i] == '"') return i + 1;
    }
    return end;
}

/* The member path of the value that ends at byte end of s ("hidden_size",
 * "rope_parameters.rope_theta", "eos_token_id[2]"), written to out; "" when
 * the value is the document itself. jansson reports a number it cannot hold
 * (an integer beyond 64 bits, a real that overflows) only by position; the
 * text before that position parsed, so a plain walk over it finds the
 * container and the key or index the number belongs to. */
static void value_path(const char *s, size_t end, char *out, size_t cap)
{
    path_frame st[PATH_DEPTH_MAX];
    int depth = 0, skipped = 0;      /* skipped: levels beyond PATH_DEPTH_MAX */
    out[0] = '\0';
    for (size_t i = 0; i < end;) {
        char c = s[i];
        path_frame *top = depth > 0 && !skipped ? &st[depth - 1] : NULL;
        if (c == '{' || c == '[') {
            if (depth < PATH_DEPTH_MAX && !skipped)
                st[depth++] = (path_frame){c == '{', NULL, 0, 0, c == '{'};
            else
                skipped++;
            i++;
        } else if (c == '}' || c == ']') {
            if (skipped) skipped--;
            else if (depth > 0) depth--;
            i++;
        } else if (c == ',') {
            if (top && top->is_object) top->want_key = 1;
            else if (top) top->index++;
            i++;
        } else if (c == '"') {
            size_t j = skip_string(s, i, end);
            if (top && top->is_object && top->want_key) {
                top->key = s + i + 1;
                top->key_len = j > i + 1 ? j - i - 2 : 0;
                top->want_key = 0;
            }
            i = j;
        } else {
            i++;
        }
    }
    size_t n = 0;
    for (int d = 0; d < depth && n < cap; d++) {
        if (st[d].is_object) {
            int shown = (int)(st[d].key_len < PATH_KEY_SHOWN_BYTES ? st[d].key_len : PATH_KEY_SHOWN_BYTES);
            n += (size_t)snprintf(out + n, cap - n, "%s%.*s%s", n ? "." : "", shown,
                                  st[d].key ? st[d].key : "", shown < (int)st[d].key_len ? "..." : "");
        } else {
            n += (size_t)snprintf(out + n, cap - n, "[%ld]", st[d].index);
        }
    }
}

static int starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* ---- allocation failures -----------------------------------------------------
 * jansson (2.14) does not survive a failed allocation inside its parser: the
 * lexer drops a failed append to its token buffer and reads on, which ends in
 * a wrong syntax error or a segmentation fault (seen under ulimit -v). So the
 * parser is never handed a NULL: during ls_json_loadb, the allocator below
 * jumps straight back to ls_json_loadb on a failed request. What the parse
 * had built so far is not freed (jansson's partial state cannot be walked);
 * the leak is bounded by the input and happens only on the way to an error. */

static json_malloc_t g_next_malloc;              /* the allocator jansson had before ours */
static _Thread_local size_t tl_failed_bytes;     /* size of the request that failed */
static _Thread_local jmp_buf *tl_oom_jump;       /* set while this thread is in json_loadb */
static pthread_once_t g_alloc_once = PTHREAD_ONCE_INIT;

static void *checked_malloc(size_t n)
{
    void *p = g_next_malloc(n);
    if (!p) {
        tl_failed_bytes = n ? n : 1;
        if (tl_oom_jump) longjmp(*tl_oom_jump, 1);
    }
    return p;
}

static void install_checked_malloc(void)
{
    json_free_t next_free;
    json_get_alloc_funcs(&g_next_malloc, &next_free);
    if (!g_next_malloc) g_next_malloc = malloc;
    json_set_alloc_funcs(checked_malloc, next_free ? next_free : free);
}

json_t *ls_json_loadb(const void *buf, size_t len, size_t flags, json_error_t *je,
                      size_t *nomem_bytes)
{
    pthread_once(&g_alloc_once, install_checked_malloc);
    memset(je, 0, sizeof *je);
    *nomem_bytes = 0;
    jmp_buf jump;
    if (setjmp(jump) != 0) {
        tl_oom_jump = NULL;
        *nomem_bytes = tl_failed_bytes;
        snprintf(je->text, sizeof je->text, "out of memory");
        return NULL;
    }
    tl_oom_jump = &jump;
    json_t *j = json_loadb(buf ? (const char *)buf : "", len, flags, je);
    tl_oom_jump = NULL;
    return j;
}

/* ---- loading -------------------------------------------------------------------- */

ls_status ls_json_load_buf(const char *label, const void *buf, size_t len, json_t **out,
                           ls_error *err)
{
    if (!out) return ls_fail(err, LS_E_USAGE, "ls_json_load_buf: out is NULL");
    *out = NULL;
    if (!buf && len) return ls_fail(err, LS_E_USAGE, "ls_json_load_buf: buf is NULL");
    json_error_t je;
    size_t nomem = 0;
    json_t *j = ls_json_loadb(buf, len, LS_JSON_LOAD_FLAGS, &je, &nomem);
    if (!j && nomem)
        return ls_fail_nomem(err, nomem, "%s: parsing %zu bytes of JSON", label ? label : "<json>", len);
    if (!j) {
        /* A number out of range names its field: "line 2, column 38" alone
         * leaves the reader counting characters in a one-line config. */
        char path[512] = "";
        if ((starts_with(je.text, "too big ") || starts_with(je.text, "real number overflow")) &&
            je.position >= 0 && (size_t)je.position <= len)
            value_path(buf, (size_t)je.position, path, sizeof path);
        return ls_fail(err, LS_E_INPUT,
                       "%s: invalid JSON at line %d, column %d (byte offset %d): %s%s%s%s",
                       label ? label : "<json>", je.line, je.column, je.position, je.text,
                       path[0] ? " in field '" : "", path, path[0] ? "'" : "");
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

size_t ls_json_failed_bytes(void)
{
    return tl_failed_bytes;
}

char *ls_json_canonical(const json_t *j)
{
    if (!j) return NULL;
    pthread_once(&g_alloc_once, install_checked_malloc);
    tl_failed_bytes = 0;
    /* JSON_REAL_PRECISION(17): every double round-trips; the header documents
     * the exact spelling jansson produces with it. */
    return json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
}

ls_status ls_json_write_doc(const char *path, json_t *doc, const char *what, ls_error *err)
{
    char *text = doc ? json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(doc);
    if (!text) return ls_fail(err, LS_E_NOMEM, "%s: out of memory", what);
    size_t n = strlen(text);
    text[n] = '\n'; /* json_dumps allocates one byte more than the text, for its NUL */
    ls_status st = ls_write_file_atomic(path, text, n + 1, err);
    free(text);
    return st;
}
