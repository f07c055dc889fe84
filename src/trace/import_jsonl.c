/* lockstep — import of per-token logprob dumps (JSONL) as emitted by
 * inference servers. Numbers are parsed from their exact text with strtof
 * (never through double), so the fp32 bits are those of the decimal or hex
 * text the server wrote. A small purpose-built JSON scanner is used because
 * jansson converts numbers to double first. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trace/import.h"
#include "trace/import_internal.h"
#include "trace/trace_internal.h"

typedef struct scan {
    const char *p, *end, *line_start;
    const char *path;
    uint64_t line;
    uint64_t line_offset;    /* byte offset of the line in the file */
    ls_error *err;
} scan;

static ls_status bad(scan *s, const char *what)
{
    return ls_fail(s->err, LS_E_INPUT, "%s: line %" PRIu64 ", byte offset %" PRIu64 ": %s", s->path, s->line,
                   s->line_offset + (uint64_t)(s->p - s->line_start), what);
}

static void ws(scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\r')) s->p++;
}

/* A JSON string without escapes beyond \" \\ \/ (keys and numeric strings). */
static ls_status str(scan *s, char *out, size_t cap)
{
    if (s->p >= s->end || *s->p != '"') return bad(s, "expected a string");
    s->p++;
    size_t n = 0;
    while (s->p < s->end && *s->p != '"') {
        char c = *s->p++;
        if ((unsigned char)c < 0x20) return bad(s, "control character in string");
        if (c == '\\') {
            if (s->p >= s->end) break;
            c = *s->p++;
            if (c == 'u') {
                if (s->end - s->p < 4) return bad(s, "bad \\u escape");
                s->p += 4;
                c = '?';
            } else if (!strchr("\"\\/bfnrt", c)) {
                return bad(s, "bad escape in string");
            }
        }
        if (n + 1 < cap) out[n++] = c;
    }
    if (s->p >= s->end) return bad(s, "unterminated string");
    s->p++;
    if (cap) out[n] = 0;
    return LS_OK;
}

static ls_status skip_value(scan *s, int depth);

/* A number's text: JSON digits, or NaN / Infinity / -Infinity (and nan, inf,
 * -inf) as Python's json and C's printf write non-finite floats. */
static ls_status number_text(scan *s, char *out, size_t cap)
{
    const char *b = s->p;
    size_t word = ls_json_nonfinite_len(s->p, s->end);
    if (word) s->p += word;
    else
        while (s->p < s->end && *s->p && strchr("+-0123456789.eE", *s->p)) s->p++;
    size_t n = (size_t)(s->p - b);
    if (n == 0 || n + 1 > cap) return bad(s, "expected a number");
    memcpy(out, b, n);
    out[n] = 0;
    return LS_OK;
}

static ls_status skip_value(scan *s, int depth)
{
    char tmp[64];
    ws(s);
    if (depth > 32) return bad(s, "nesting too deep");
    if (s->p >= s->end) return bad(s, "expected a value");
    char c = *s->p;
    if (c == '"') return str(s, tmp, 0);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        s->p++;
        ws(s);
        if (s->p < s->end && *s->p == close) { s->p++; return LS_OK; }
        for (;;) {
            if (c == '{') {
                ws(s);
                LS_TRY(str(s, tmp, 0));
                ws(s);
                if (s->p >= s->end || *s->p != ':') return bad(s, "expected ':'");
                s->p++;
            }
            LS_TRY(skip_value(s, depth + 1));
            ws(s);
            if (s->p < s->end && *s->p == ',') { s->p++; continue; }
            if (s->p < s->end && *s->p == close) { s->p++; return LS_OK; }
            return bad(s, "expected ',' or a closing bracket");
        }
    }
    static const char *const words[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(s->end - s->p) >= n && !memcmp(s->p, words[i], n)) { s->p += n; return LS_OK; }
    }
    return number_text(s, tmp, sizeof tmp);
}

/* An fp32 from a JSON number or a string holding a decimal/hex float, "inf", "-inf", "nan". */
static ls_status parse_f32(scan *s, uint32_t *bits)
{
    char text[80];
    ws(s);
    if (s->p < s->end && *s->p == '"') LS_TRY(str(s, text, sizeof text));
    else LS_TRY(number_text(s, text, sizeof text));
    char *e;
    errno = 0;
    float f = strtof(text, &e); /* exact: the text is rounded once, to fp32 */
    if (e == text || *e) return bad(s, "not a float");
    memcpy(bits, &f, 4);
    return LS_OK;
}

static ls_status parse_int(scan *s, int64_t lo, int64_t hi, int64_t *v)
{
    char text[32];
    ws(s);
    LS_TRY(number_text(s, text, sizeof text));
    char *e;
    errno = 0;
    long long x = strtoll(text, &e, 10);
    if (*e || errno || x < lo || x > hi) return bad(s, "expected an integer in range");
    *v = x;
    return LS_OK;
}

static ls_status parse_line(scan *s, int topk, ls_trace_record *r)
{
    int64_t seq = -1, pos = -1, token = -1;
    int have_lp = 0, n_top = 0;
    memset(r, 0, sizeof *r);
    r->logprob_bits = 0x7fc00000u;
    for (int k = 0; k < LS_TRACE_TOPK_MAX; k++) {
        r->topk_ids[k] = -1;
        r->topk_logprob_bits[k] = 0x7fc00000u;
    }
    ws(s);
    if (s->p >= s->end || *s->p != '{') return bad(s, "expected a JSON object");
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == '}') return bad(s, "empty object");
    for (;;) {
        char key[32];
        ws(s);
        LS_TRY(str(s, key, sizeof key));
        ws(s);
        if (s->p >= s->end || *s->p != ':') return bad(s, "expected ':'");
        s->p++;
        if (!strcmp(key, "seq")) LS_TRY(parse_int(s, 0, UINT32_MAX, &seq));
        else if (!strcmp(key, "pos")) LS_TRY(parse_int(s, 1, UINT32_MAX, &pos));
        else if (!strcmp(key, "token")) LS_TRY(parse_int(s, 0, INT32_MAX, &token));
        else if (!strcmp(key, "logprob")) { LS_TRY(parse_f32(s, &r->logprob_bits)); have_lp = 1; }
        else if (!strcmp(key, "top_logprobs")) {
            ws(s);
            if (s->p >= s->end || *s->p != '{') return bad(s, "top_logprobs must be an object {\"id\": logprob}");
            s->p++;
            ws(s);
            if (s->p < s->end && *s->p == '}') s->p++;
            else
                for (;;) {
                    char id[24];
                    ws(s);
                    LS_TRY(str(s, id, sizeof id));
                    char *e;
                    errno = 0;
                    long long v = strtoll(id, &e, 10);
                    if (!id[0] || *e || errno || v < 0 || v > INT32_MAX) return bad(s, "top_logprobs key is not a token id");
                    ws(s);
                    if (s->p >= s->end || *s->p != ':') return bad(s, "expected ':'");
                    s->p++;
                    uint32_t bits;
                    LS_TRY(parse_f32(s, &bits));
                    if (n_top < topk) {
                        r->topk_ids[n_top] = (int32_t)v;
                        r->topk_logprob_bits[n_top] = bits;
                    }
                    n_top++;
                    ws(s);
                    if (s->p < s->end && *s->p == ',') { s->p++; continue; }
                    if (s->p < s->end && *s->p == '}') { s->p++; break; }
                    return bad(s, "expected ',' or '}' in top_logprobs");
                }
        } else {
            LS_TRY(skip_value(s, 1));
        }
        ws(s);
        if (s->p < s->end && *s->p == ',') { s->p++; continue; }
        if (s->p < s->end && *s->p == '}') { s->p++; break; }
        return bad(s, "expected ',' or '}'");
    }
    ws(s);
    if (s->p != s->end) return bad(s, "trailing characters after the object");
    if (seq < 0 || pos < 1 || token < 0 || !have_lp) return bad(s, "needs \"seq\", \"pos\" (>= 1), \"token\" and \"logprob\"");
    /* The line's token was generated at pos from the distribution after
     * reading 0..pos-1: that is the record at pos-1 (docs/trace-format.md). */
    r->seq = (uint32_t)seq;
    r->pos = (uint32_t)(pos - 1);
    r->token = -1;
    r->next_token = (int32_t)token;
    return LS_OK;
}

ls_status ls_import_jsonl(const char *in_path, const char *data, size_t len, const ls_import_opts *o,
                          const char *out_path, uint64_t *n_records, ls_error *err)
{
    ls_trace_header h = {0};
    h.mode = "import";
    h.engine = o->engine ? o->engine : "jsonl";
    h.model_fingerprint = o->model_fingerprint;
    h.manifest_digest = o->manifest_digest ? o->manifest_digest : "";
    h.run_params_json = "{}";
    h.topk = o->topk ? o->topk : 5;
    h.state_digest_every = 1;
    ls_trace_writer *w = NULL;
    LS_TRY(ls_trace_writer_open(out_path, &h, &w, err));
    scan s = {.path = in_path, .err = err};
    const char *p = data, *end = data + len;
    uint64_t in_frame = 0, total = 0;
    ls_status st = LS_OK;
    for (uint64_t line = 1; p < end && !st; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        s.p = s.line_start = p;
        s.end = le;
        s.line = line;
        s.line_offset = (uint64_t)(p - data);
        ws(&s);
        if (s.p != le) {
            ls_trace_record r;
            st = parse_line(&s, h.topk, &r);
            if (!st && in_frame == 0) st = ls_trace_writer_begin_frame(w, LS_FRAME_IMPORT, err);
            if (!st && (st = ls_trace_writer_add(w, &r, err)) != LS_OK)
                ls_fail(err, LS_E_INPUT, "%s: line %" PRIu64 ", byte offset %" PRIu64 ": seq %u pos %u: positions of "
                        "a sequence must increase through the file (sort by position within each sequence)",
                        in_path, line, s.line_offset, r.seq, r.pos + 1);
            if (!st && ++in_frame == 4096) {
                st = ls_trace_writer_end_frame(w, err);
                in_frame = 0;
            }
            total++;
        }
        p = nl ? nl + 1 : end;
    }
    if (!st && in_frame) st = ls_trace_writer_end_frame(w, err);
    if (!st && total == 0) st = ls_fail(err, LS_E_INPUT, "%s: no records", in_path);
    if (st) {
        ls_trace_writer_abort(w);
        return st;
    }
    if (n_records) *n_records = total;
    return ls_trace_writer_close(w, err);
}
