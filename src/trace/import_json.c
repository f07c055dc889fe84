/* lockstep — a JSON reader that keeps the text of every number, for the
 * engine importers (see import_internal.h for why not jansson).
 *
 * Values are built bottom-up: the children of an open container sit on a
 * value stack; when it closes they are copied into the arena as its kids
 * array and the container itself is pushed. The arena is emptied before each
 * top-level value, so memory is bounded by the largest one (a JSONL file of
 * one response per line never holds more than one line's tree). */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "trace/import_internal.h"

#define JSON_MAX_DEPTH 64
#define NUMBER_MAX_CHARS 127   /* longer number texts are refused (no engine writes them) */
#define ARENA_BLOCK_BYTES ((size_t)1 << 20)

typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    /* data follows, 16-byte aligned */
} arena_block;

struct ls_jparse {
    const char *label;
    const char *base, *p, *end;
    arena_block *blocks;            /* most recent first */
    ls_jv *stack; size_t n_stack, stack_cap;
};

/* ---- memory ------------------------------------------------------------------------- */

static void *arena_alloc(ls_jparse *j, size_t bytes)
{
    bytes = (bytes + 15) & ~(size_t)15;
    arena_block *b = j->blocks;
    if (!b || b->cap - b->used < bytes) {
        size_t cap = bytes > ARENA_BLOCK_BYTES ? bytes : ARENA_BLOCK_BYTES;
        b = malloc(sizeof(arena_block) + 16 + cap);
        if (!b) return NULL;
        b->next = j->blocks;
        b->used = 0;
        b->cap = cap;
        j->blocks = b;
    }
    char *data = (char *)b + ((sizeof(arena_block) + 15) & ~(size_t)15);
    void *r = data + b->used;
    b->used += bytes;
    return r;
}

static void arena_reset(ls_jparse *j)
{
    while (j->blocks) {
        arena_block *n = j->blocks->next;
        free(j->blocks);
        j->blocks = n;
    }
}

static ls_status push(ls_jparse *j, const ls_jv *v, ls_error *err)
{
    if (j->n_stack == j->stack_cap) {
        size_t nc = j->stack_cap ? 2 * j->stack_cap : 256;
        ls_jv *s = realloc(j->stack, nc * sizeof *s);
        if (!s) return ls_fail_nomem(err, nc * sizeof *s, "%s: reading JSON", j->label);
        j->stack = s;
        j->stack_cap = nc;
    }
    j->stack[j->n_stack++] = *v;
    return LS_OK;
}

/* ---- messages ------------------------------------------------------------------------ */

uint64_t ls_jparse_line(const ls_jparse *j, uint64_t at)
{
    uint64_t line = 1;
    const char *stop = j->base + (at < (uint64_t)(j->end - j->base) ? at : (uint64_t)(j->end - j->base));
    for (const char *q = j->base; q < stop; q++) line += *q == '\n';
    return line;
}

const char *ls_jparse_label(const ls_jparse *j) { return j->label; }

static ls_status fail_at(ls_jparse *j, const char *at, const char *what, ls_error *err)
{
    uint64_t off = (uint64_t)(at - j->base);
    return ls_fail(err, LS_E_INPUT, "%s: invalid JSON at line %" PRIu64 ", byte offset %" PRIu64 ": %s", j->label,
                   ls_jparse_line(j, off), off, what);
}

/* ---- scanning --------------------------------------------------------------------------- */

static void ws(ls_jparse *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_hex4(const char *p, const char *end, uint32_t *u)
{
    if (end - p < 4) return -1;
    *u = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p[i]);
        if (h < 0) return -1;
        *u = *u << 4 | (uint32_t)h;
    }
    return 0;
}

static size_t utf8_put(char *o, uint32_t u)
{
    if (u < 0x80) { o[0] = (char)u; return 1; }
    if (u < 0x800) { o[0] = (char)(0xc0 | u >> 6); o[1] = (char)(0x80 | (u & 0x3f)); return 2; }
    if (u < 0x10000) {
        o[0] = (char)(0xe0 | u >> 12); o[1] = (char)(0x80 | (u >> 6 & 0x3f)); o[2] = (char)(0x80 | (u & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | u >> 18); o[1] = (char)(0x80 | (u >> 12 & 0x3f));
    o[2] = (char)(0x80 | (u >> 6 & 0x3f)); o[3] = (char)(0x80 | (u & 0x3f));
    return 4;
}

/* A string at j->p ('"'): v->s points into the document when it has no
 * escapes, else to a decoded copy in the arena. */
static ls_status scan_string(ls_jparse *j, ls_jv *v, ls_error *err)
{
    const char *start = ++j->p;
    int escaped = 0;
    while (j->p < j->end && *j->p != '"') {
        unsigned char c = (unsigned char)*j->p;
        if (c < 0x20) return fail_at(j, j->p, "control character in a string (must be escaped)", err);
        if (c == '\\') {
            escaped = 1;
            if (++j->p >= j->end) break;
        }
        j->p++;
    }
    if (j->p >= j->end) return fail_at(j, start - 1, "unterminated string", err);
    size_t raw = (size_t)(j->p - start);
    j->p++;
    v->type = LS_JV_STRING;
    if (!escaped) {
        v->s = start;
        v->n = (uint32_t)raw;
        return raw > UINT32_MAX ? fail_at(j, start, "string too long", err) : LS_OK;
    }
    char *o = arena_alloc(j, raw + 1);
    if (!o) return ls_fail_nomem(err, raw + 1, "%s: reading JSON", j->label);
    size_t n = 0;
    for (const char *q = start; q < start + raw;) {
        if (*q != '\\') { o[n++] = *q++; continue; }
        char e = q[1];
        q += 2;
        switch (e) {
        case '"': o[n++] = '"'; break;
        case '\\': o[n++] = '\\'; break;
        case '/': o[n++] = '/'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'n': o[n++] = '\n'; break;
        case 'r': o[n++] = '\r'; break;
        case 't': o[n++] = '\t'; break;
        case 'u': {
            uint32_t u, lo;
            if (read_hex4(q, start + raw, &u)) return fail_at(j, q - 2, "bad \\u escape", err);
            q += 4;
            if (u >= 0xd800 && u < 0xdc00) {
                /* a high surrogate must be followed by a low one */
                if (start + raw - q < 6 || q[0] != '\\' || q[1] != 'u' || read_hex4(q + 2, start + raw, &lo) ||
                    lo < 0xdc00 || lo > 0xdfff)
                    return fail_at(j, q - 6, "unpaired surrogate in a \\u escape", err);
                q += 6;
                u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
            } else if (u >= 0xdc00 && u < 0xe000) {
                return fail_at(j, q - 6, "unpaired surrogate in a \\u escape", err);
            }
            n += utf8_put(o + n, u); /* at most 4 bytes for the 6 (or 12) escape bytes */
            break;
        }
        default: return fail_at(j, q - 2, "bad escape in a string", err);
        }
    }
    v->s = o;
    v->n = (uint32_t)n;
    return LS_OK;
}

/* The non-finite spellings engines write as bare tokens. */
size_t ls_json_nonfinite_len(const char *p, const char *end)
{
    static const char *const words[] = {"infinity", "inf", "nan"};
    const char *q = p;
    if (q < end && (*q == '-' || *q == '+')) q++;
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(end - q) >= n && !strncasecmp(q, words[i], n) &&
            (q + n == end || !((q[n] >= 'a' && q[n] <= 'z') || (q[n] >= 'A' && q[n] <= 'Z') ||
                               (q[n] >= '0' && q[n] <= '9') || q[n] == '_')))
            return (size_t)(q + n - p);
    }
    return 0;
}

static ls_status scan_number(ls_jparse *j, ls_jv *v, ls_error *err)
{
    const char *b = j->p, *q = j->p;
    size_t word = ls_json_nonfinite_len(q, j->end);
    v->type = LS_JV_NUMBER;
    if (word) {
        j->p += word;
        v->s = b;
        v->n = (uint32_t)word;
        return LS_OK;
    }
    /* RFC 8259: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
    if (q < j->end && *q == '-') q++;
    if (q >= j->end || *q < '0' || *q > '9') return fail_at(j, b, "expected a value", err);
    if (*q == '0') q++;
    else
        while (q < j->end && *q >= '0' && *q <= '9') q++;
    int integer = 1;
    if (q < j->end && *q == '.') {
        integer = 0;
        q++;
        if (q >= j->end || *q < '0' || *q > '9') return fail_at(j, q, "expected a digit after '.'", err);
        while (q < j->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < j->end && (*q == 'e' || *q == 'E')) {
        integer = 0;
        q++;
        if (q < j->end && (*q == '+' || *q == '-')) q++;
        if (q >= j->end || *q < '0' || *q > '9') return fail_at(j, q, "expected a digit in the exponent", err);
        while (q < j->end && *q >= '0' && *q <= '9') q++;
    }
    if ((size_t)(q - b) > NUMBER_MAX_CHARS) return fail_at(j, b, "number text longer than 127 characters", err);
    j->p = q;
    v->s = b;
    v->n = (uint32_t)(q - b);
    v->integer = (uint8_t)integer;
    return LS_OK;
}

/* Closes the container opened at stack index `base - 1` whose children are
 * stack[base ...]: copies them into the arena. */
static ls_status close_container(ls_jparse *j, size_t base, ls_error *err)
{
    ls_jv *c = &j->stack[base - 1];
    size_t n = j->n_stack - base;
    ls_jv *kids = NULL;
    if (n) {
        kids = arena_alloc(j, n * sizeof *kids);
        if (!kids) return ls_fail_nomem(err, n * sizeof *kids, "%s: reading JSON", j->label);
        memcpy(kids, &j->stack[base], n * sizeof *kids);
    }
    c->kids = kids;
    c->n = (uint32_t)(c->type == LS_JV_OBJECT ? n / 2 : n);
    j->n_stack = base;
    return LS_OK;
}

/* Parses one value at j->p (after whitespace) and pushes it. Iterative over
 * containers: `open` holds the stack base of each open container. */
static ls_status parse_value(ls_jparse *j, ls_error *err)
{
    size_t open[JSON_MAX_DEPTH];
    int depth = 0;
    size_t bottom = j->n_stack;
    for (;;) {
        ws(j);
        if (j->p >= j->end) return fail_at(j, j->p, "unexpected end of input", err);
        ls_jv v = {0};
        v.at = (uint64_t)(j->p - j->base);
        char c = *j->p;
        int in_object = depth && j->stack[open[depth - 1] - 1].type == LS_JV_OBJECT;
        int want_key = in_object && (j->n_stack - open[depth - 1]) % 2 == 0;
        if (want_key && c != '"') return fail_at(j, j->p, "expected a string key", err);
        if (c == '{' || c == '[') {
            if (depth == JSON_MAX_DEPTH) return fail_at(j, j->p, "nesting deeper than 64", err);
            v.type = c == '{' ? LS_JV_OBJECT : LS_JV_ARRAY;
            j->p++;
            LS_TRY(push(j, &v, err));
            open[depth++] = j->n_stack;
            ws(j);
            if (j->p < j->end && *j->p == (c == '{' ? '}' : ']')) {
                j->p++;
                LS_TRY(close_container(j, open[--depth], err));
                goto after_value;
            }
            continue;
        } else if (c == '"') {
            LS_TRY(scan_string(j, &v, err));
        } else if (j->end - j->p >= 4 && !memcmp(j->p, "null", 4)) {
            v.type = LS_JV_NULL;
            j->p += 4;
        } else if (j->end - j->p >= 4 && !memcmp(j->p, "true", 4)) {
            v.type = LS_JV_BOOL;
            v.truth = 1;
            j->p += 4;
        } else if (j->end - j->p >= 5 && !memcmp(j->p, "false", 5)) {
            v.type = LS_JV_BOOL;
            j->p += 5;
        } else {
            LS_TRY(scan_number(j, &v, err));
        }
        LS_TRY(push(j, &v, err));
        if (want_key) {
            ws(j);
            if (j->p >= j->end || *j->p != ':') return fail_at(j, j->p, "expected ':' after an object key", err);
            j->p++;
            continue;
        }
    after_value:
        for (;;) {
            if (!depth) return j->n_stack == bottom + 1 ? LS_OK : fail_at(j, j->p, "internal: stack", err);
            ws(j);
            int obj = j->stack[open[depth - 1] - 1].type == LS_JV_OBJECT;
            char close = obj ? '}' : ']';
            if (j->p < j->end && *j->p == ',') {
                j->p++;
                break;
            }
            if (j->p < j->end && *j->p == close) {
                j->p++;
                LS_TRY(close_container(j, open[--depth], err));
                continue;
            }
            return fail_at(j, j->p, obj ? "expected ',' or '}'" : "expected ',' or ']'", err);
        }
    }
}

ls_status ls_jparse_new(const char *label, const char *data, size_t len, ls_jparse **out, ls_error *err)
{
    ls_jparse *j = calloc(1, sizeof *j);
    if (!j) return ls_fail(err, LS_E_NOMEM, "out of memory");
    j->label = label;
    j->base = j->p = data;
    j->end = data + len;
    *out = j;
    return LS_OK;
}

ls_status ls_jparse_next(ls_jparse *j, const ls_jv **out, ls_error *err)
{
    *out = NULL;
    arena_reset(j);
    j->n_stack = 0;
    ws(j);
    if (j->p == j->base && j->end - j->p >= 3 && !memcmp(j->p, "\xef\xbb\xbf", 3)) { /* UTF-8 byte order mark */
        j->p += 3;
        ws(j);
    }
    if (j->p >= j->end) return LS_OK;
    LS_TRY(parse_value(j, err));
    ls_jv *root = arena_alloc(j, sizeof *root);
    if (!root) return ls_fail_nomem(err, sizeof *root, "%s: reading JSON", j->label);
    *root = j->stack[0];
    j->n_stack = 0;
    *out = root;
    return LS_OK;
}

void ls_jparse_free(ls_jparse *j)
{
    if (!j) return;
    arena_reset(j);
    free(j->stack);
    free(j);
}

/* ---- access ----------------------------------------------------------------------------- */

const ls_jv *ls_jv_get(const ls_jv *v, const char *key)
{
    if (!v || v->type != LS_JV_OBJECT) return NULL;
    size_t n = strlen(key);
    const ls_jv *found = NULL;
    for (uint32_t i = 0; i < v->n; i++) {
        const ls_jv *k = &v->kids[2 * i];
        if (k->n == n && !memcmp(k->s, key, n)) found = &v->kids[2 * i + 1]; /* the last one wins, as in Python */
    }
    return found;
}

int ls_jv_str_is(const ls_jv *v, const char *text)
{
    return v && v->type == LS_JV_STRING && v->n == strlen(text) && !memcmp(v->s, text, v->n);
}

int ls_jv_f32(const ls_jv *v, uint32_t *bits)
{
    if (!v || (v->type != LS_JV_NUMBER && v->type != LS_JV_STRING) || v->n == 0 || v->n > NUMBER_MAX_CHARS)
        return -1;
    char text[NUMBER_MAX_CHARS + 1];
    memcpy(text, v->s, v->n);
    text[v->n] = 0;
    if (text[0] == ' ' || text[0] == '\t' || text[0] == '\n' || text[0] == '\r' || text[0] == '\f' || text[0] == '\v')
        return -1;
    /* Python spells them Infinity / NaN; strtof knows infinity and nan in any case. */
    const char *t = text;
    char *e;
    errno = 0;
    float f = strtof(t, &e); /* the text, rounded once to fp32 (glibc strtof is correctly rounded) */
    if (e == t || *e) return -1;
    memcpy(bits, &f, 4);
    return 0;
}

int ls_jv_int(const ls_jv *v, int64_t lo, int64_t hi, int64_t *out)
{
    if (!v || v->type != LS_JV_NUMBER || !v->integer || v->n > 20) return -1;
    char text[24];
    memcpy(text, v->s, v->n);
    text[v->n] = 0;
    char *e;
    errno = 0;
    long long x = strtoll(text, &e, 10);
    if (*e || errno || x < lo || x > hi) return -1;
    *out = x;
    return 0;
}

int ls_jv_token_id(const ls_jv *v, int prefixed, int32_t *out)
{
    int64_t x;
    if (v && v->type == LS_JV_NUMBER) {
        if (ls_jv_int(v, 0, INT32_MAX, &x)) return -1;
        *out = (int32_t)x;
        return 0;
    }
    if (!v || v->type != LS_JV_STRING) return -1;
    const char *s = v->s;
    size_t n = v->n;
    if (n > 9 && !memcmp(s, "token_id:", 9)) {
        s += 9;
        n -= 9;
    } else if (prefixed) {
        return -1;
    }
    if (n == 0 || n > 10) return -1;
    x = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        x = x * 10 + (s[i] - '0');
    }
    if (x > INT32_MAX || (n > 1 && s[0] == '0')) return -1;
    *out = (int32_t)x;
    return 0;
}
