/* lockstep — run_params, the header's opaque object (docs/trace-format.md,
 * section 3): a JSON syntax check that locates it in the header text, and a
 * lenient parse for the readers that need some of its fields.
 *
 * Why not jansson alone: jansson refuses integers beyond int64, numbers beyond
 * double range and "\u0000" (without flags), all valid JSON that another
 * engine may well write into run_params (a u64 seed). The format calls
 * run_params opaque, so the reader checks its syntax only and keeps its text
 * byte for byte; the rest of the header is parsed strictly, with the
 * run_params value blanked to "{}" and spaces (same length, so jansson's
 * byte positions stay those of the file). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "trace/trace_internal.h"

/* Deeper nesting than jansson accepts (2048) is refused here too. */
#define SCAN_MAX_DEPTH 2048

typedef struct scan {
    const char *s;
    size_t n, i;
    int depth;
    const char *why;             /* first syntax error, NULL while none */
    const char *key;             /* member of the top-level object to locate, or NULL */
    size_t key_at, key_len;      /* its value's span */
    int key_found;
    /* lenient rewrite: numbers out of range become strings */
    int rewrite;
    char *out;
    size_t out_len, out_cap, copied;
} scan;

static int fail(scan *c, const char *why)
{
    if (!c->why) c->why = why;
    return -1;
}

static void skip_ws(scan *c)
{
    while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\n' || c->s[c->i] == '\r')) c->i++;
}

static int out_put(scan *c, const char *p, size_t n)
{
    if (c->out_len + n + 1 > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 256;
        while (cap < c->out_len + n + 1) cap *= 2;
        char *q = realloc(c->out, cap);
        if (!q) return fail(c, "out of memory");
        c->out = q;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
    c->out[c->out_len] = 0;
    return 0;
}

/* One UTF-8 sequence at c->i (a byte >= 0x80): well formed, shortest form,
 * no surrogates, at most U+10FFFF (RFC 3629). */
static int scan_utf8(scan *c)
{
    const unsigned char *p = (const unsigned char *)c->s + c->i;
    size_t left = c->n - c->i;
    unsigned b = p[0], len;
    uint32_t cp;
    if (b >= 0xc2 && b <= 0xdf) len = 2, cp = b & 0x1f;
    else if (b >= 0xe0 && b <= 0xef) len = 3, cp = b & 0x0f;
    else if (b >= 0xf0 && b <= 0xf4) len = 4, cp = b & 0x07;
    else return fail(c, "invalid UTF-8");
    if (left < len) return fail(c, "invalid UTF-8");
    for (unsigned k = 1; k < len; k++) {
        if ((p[k] & 0xc0) != 0x80) return fail(c, "invalid UTF-8");
        cp = cp << 6 | (p[k] & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
        return fail(c, "invalid UTF-8");
    c->i += len;
    return 0;
}

static int scan_string(scan *c)
{
    c->i++; /* the opening quote */
    while (c->i < c->n) {
        unsigned char ch = (unsigned char)c->s[c->i];
        if (ch == '"') {
            c->i++;
            return 0;
        }
        if (ch < 0x20) return fail(c, "control character in a string");
        if (ch >= 0x80) {
            if (scan_utf8(c)) return -1;
            continue;
        }
        if (ch == '\\') {
            if (++c->i >= c->n) break;
            char e = c->s[c->i];
            if (e == 'u') {
                for (int k = 1; k <= 4; k++)
                    if (c->i + k >= c->n || !strchr("0123456789abcdefABCDEF", c->s[c->i + k]) || !c->s[c->i + k])
                        return fail(c, "invalid \\u escape");
                c->i += 4;
            } else if (!strchr("\"\\/bfnrt", e) || !e) {
                return fail(c, "invalid escape in a string");
            }
        }
        c->i++;
    }
    return fail(c, "unterminated string");
}

static int digits(scan *c)
{
    size_t from = c->i;
    while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9') c->i++;
    return c->i > from ? 0 : fail(c, "invalid number");
}

/* A number (RFC 8259 grammar). When rewriting, one that jansson cannot hold
 * (an integer outside int64, a real beyond double range) becomes a string of
 * its text. */
static int scan_number(scan *c)
{
    size_t from = c->i;
    int real = 0;
    if (c->s[c->i] == '-') c->i++;
    if (c->i < c->n && c->s[c->i] == '0') c->i++;
    else if (digits(c)) return -1;
    if (c->i < c->n && c->s[c->i] == '.') {
        real = 1;
        c->i++;
        if (digits(c)) return -1;
    }
    if (c->i < c->n && (c->s[c->i] == 'e' || c->s[c->i] == 'E')) {
        real = 1;
        c->i++;
        if (c->i < c->n && (c->s[c->i] == '+' || c->s[c->i] == '-')) c->i++;
        if (digits(c)) return -1;
    }
    if (!c->rewrite) return 0;
    size_t len = c->i - from;
    /* A long text can still be an ordinary number (2.5 followed by a hundred
     * zeros): judge the whole text, as jansson will. */
    char small[64], *buf = len < sizeof small ? small : malloc(len + 1);
    if (!buf) return fail(c, "out of memory");
    memcpy(buf, c->s + from, len);
    buf[len] = 0;
    errno = 0;
    int out_of_range;
    if (real) {
        double v = strtod(buf, NULL);
        out_of_range = errno == ERANGE && isinf(v);
    } else {
        (void)strtoll(buf, NULL, 10);
        out_of_range = errno == ERANGE;
    }
    if (buf != small) free(buf);
    if (!out_of_range) return 0;
    if (out_put(c, c->s + c->copied, from - c->copied) || out_put(c, "\"", 1) || out_put(c, c->s + from, len) ||
        out_put(c, "\"", 1))
        return -1;
    c->copied = c->i;
    return 0;
}

static int scan_value(scan *c);

static int scan_container(scan *c, char close)
{
    if (++c->depth > SCAN_MAX_DEPTH) return fail(c, "nested too deeply");
    int top = c->depth == 1 && close == '}';
    c->i++;
    skip_ws(c);
    if (c->i < c->n && c->s[c->i] == close) {
        c->i++;
        c->depth--;
        return 0;
    }
    for (;;) {
        int is_key = 0;
        if (close == '}') {
            skip_ws(c);
            if (c->i >= c->n || c->s[c->i] != '"') return fail(c, "expected a string (a key)");
            size_t k0 = c->i;
            if (scan_string(c)) return -1;
            is_key = top && c->key && !c->key_found && c->i - k0 - 2 == strlen(c->key) &&
                     memcmp(c->s + k0 + 1, c->key, c->i - k0 - 2) == 0;
            skip_ws(c);
            if (c->i >= c->n || c->s[c->i] != ':') return fail(c, "expected ':'");
            c->i++;
        }
        skip_ws(c);
        size_t v0 = c->i;
        if (scan_value(c)) return -1;
        if (is_key) {
            c->key_found = 1;
            c->key_at = v0;
            c->key_len = c->i - v0;
        }
        skip_ws(c);
        if (c->i < c->n && c->s[c->i] == ',') {
            c->i++;
            continue;
        }
        if (c->i < c->n && c->s[c->i] == close) {
            c->i++;
            c->depth--;
            return 0;
        }
        return fail(c, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int scan_value(scan *c)
{
    skip_ws(c);
    if (c->i >= c->n) return fail(c, "expected a value");
    char ch = c->s[c->i];
    if (ch == '{') return scan_container(c, '}');
    if (ch == '[') return scan_container(c, ']');
    if (ch == '"') return scan_string(c);
    if (ch == '-' || (ch >= '0' && ch <= '9')) return scan_number(c);
    static const char *const lit[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t l = strlen(lit[k]);
        if (c->n - c->i >= l && memcmp(c->s + c->i, lit[k], l) == 0) {
            c->i += l;
            return 0;
        }
    }
    return fail(c, "expected a value");
}

/* Checks that s[0..n) is one JSON value; fills c->why and c->i on failure. */
static int scan_document(scan *c)
{
    if (scan_value(c)) return -1;
    skip_ws(c);
    return c->i == c->n ? 0 : fail(c, "text after the JSON value");
}

ls_status ls_trace_json_locate(const char *json, size_t len, const char *key, size_t *at, size_t *value_len,
                               const char *where, ls_error *err)
{
    scan c = {.s = json, .n = len, .key = key};
    *at = *value_len = 0;
    if (scan_document(&c))
        return ls_fail(err, LS_E_INPUT, "%s: header JSON: %s at JSON byte %zu", where, c.why, c.i);
    if (c.key_found) {
        *at = c.key_at;
        *value_len = c.key_len;
    }
    return LS_OK;
}

ls_status ls_trace_run_params_check(const char *text, ls_error *err)
{
    scan c = {.s = text, .n = strlen(text)};
    if (scan_document(&c))
        return ls_fail(err, LS_E_USAGE, "trace header: run_params_json is not JSON: %s at byte %zu", c.why, c.i);
    size_t i = 0;
    while (i < c.n && strchr(" \t\n\r", text[i])) i++;
    if (text[i] != '{') return ls_fail(err, LS_E_USAGE, "trace header: run_params_json is not a JSON object");
    return LS_OK;
}

json_t *ls_trace_run_params_parse(const char *text, ls_error *err)
{
    scan c = {.s = text ? text : "{}", .rewrite = 1};
    c.n = strlen(c.s);
    if (scan_document(&c) || out_put(&c, c.s + c.copied, c.n - c.copied)) {
        free(c.out);
        ls_fail(err, LS_E_INPUT, "run_params: %s at byte %zu", c.why, c.i);
        return NULL;
    }
    json_error_t je;
    json_t *j = json_loadb(c.out, c.out_len, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &je);
    free(c.out);
    if (!j || !json_is_object(j)) {
        ls_fail(err, LS_E_INPUT, "run_params: %s", j ? "not a JSON object" : je.text);
        json_decref(j);
        return NULL;
    }
    return j;
}
