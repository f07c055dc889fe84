/* lockstep CLI — option value parsing shared by the subcommands. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

ls_status ls_cli_parse_long(const char *opt, const char *v, long lo, long hi, long *out, ls_error *err)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return ls_fail(err, LS_E_USAGE, "%s '%s': expected an integer in %ld..%ld", opt, v, lo, hi);
    *out = x;
    return LS_OK;
}

ls_status ls_cli_parse_kv_page(const char *opt, const char *v, long *out, ls_error *err)
{
    LS_TRY(ls_cli_parse_long(opt, v, LONG_MIN, LONG_MAX, out, err));
    if (*out < 1)
        return ls_fail(err, LS_E_USAGE, "%s %ld: a page holds at least 1 position (leave %s out for one "
                       "contiguous cache per sequence)", opt, *out, opt);
    return LS_OK;
}

ls_status ls_cli_parse_afd(const char *opt, const char *v, int *attention, int *ffn, ls_error *err)
{
    char *end;
    errno = 0;
    long a = isdigit((unsigned char)v[0]) ? strtol(v, &end, 10) : -1;
    long f = a >= 1 && *end == ':' && isdigit((unsigned char)end[1]) ? strtol(end + 1, &end, 10) : -1;
    if (errno || a < 1 || f < 1 || *end || a > 1 << 20 || f > 1 << 20)
        return ls_fail(err, LS_E_USAGE, "%s '%s': expected A:F, the attention and FFN ranks (e.g. 1:1)", opt, v);
    *attention = (int)a;
    *ffn = (int)f;
    return LS_OK;
}

ls_status ls_cli_parse_gpu(const char *opt, const char *v, int *out, ls_error *err)
{
    long x;
    LS_TRY(ls_cli_parse_long(opt, v, INT_MIN, INT_MAX, &x, err));
    *out = (int)x;
    return LS_OK;
}

ls_status ls_cli_check_gpu(const char *backend, int given, ls_error *err)
{
    if (given && backend && strcmp(backend, "cuda"))
        return ls_fail(err, LS_E_USAGE, "--gpu applies to --backend cuda only (the backend is %s)",
                       backend);
    return LS_OK;
}

/* Library messages name option fields; the user typed flags. A field name
 * inside a longer name or a dotted path (a manifest's serving.kv_page, a
 * JSON field) is left as it is: that is a field of a file, not an option. */
static const char *const field_flags[][2] = {
    {"allow_different_model", "--allow-different-model"},
    {"allow_incomplete", "--allow-incomplete"},
    {"max_shard_bytes", "--max-shard-bytes"},
    {"the force option", "--force"},
    {"max_rows", "--max-rows"},
    {"kv_page", "--kv-page"},
    {"the prompt_len option", "--prompt-len"},
    {"the logprobs_only option", "--logprobs-only"},
    {"^layers ", "--layers "},          /* '^': only at the start of the message */
    /* the engine's tensor-parallel refusals ("num_attention_heads 4 is not
     * a multiple of tp 3", "... rows per rank at tp 2 split ...") */
    {"of tp ", "of --tp "},
    {"at tp ", "at --tp "},
};

void ls_cli_flag_names(const char *msg, char *out, size_t out_size)
{
    size_t n = 0;
    const char *start = msg;
    while (*msg && n + 1 < out_size) {
        size_t k = 0, nf = sizeof field_flags / sizeof field_flags[0];
        for (; k < nf; k++) {
            const char *f = field_flags[k][0];
            if (*f == '^' && (msg != start || strncmp(msg, f + 1, strlen(f + 1)) != 0)) continue;
            if (*f != '^' && strncmp(msg, f, strlen(f)) != 0) continue;
            if (*f != '^' && msg > start && (isalnum((unsigned char)msg[-1]) || msg[-1] == '_' || msg[-1] == '.'))
                continue;
            break;
        }
        if (k < nf) {
            const char *f = field_flags[k][0] + (field_flags[k][0][0] == '^');
            n += (size_t)snprintf(out + n, out_size - n, "%s", field_flags[k][1]);
            if (n >= out_size) n = out_size - 1;
            msg += strlen(f);
        } else {
            out[n++] = *msg++;
        }
    }
    out[n] = '\0';
}
