/* lockstep trace dump FILE — print a trace's header and records. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "core/util.h"
#include "trace/trace.h"

static const char usage_text[] =
    "usage: lockstep trace dump FILE [--json] [--seq S] [--positions A-B] [--layers SPEC]\n"
    "\n"
    "Prints the header (mode, engine, model fingerprint, manifest digest, run\n"
    "parameters, layer table, digest kinds, top-k width) and every record: token,\n"
    "selected next token and its logprob (fp32 bits and value), top-k ids and\n"
    "logprobs, and per (layer, kind) digests, plus dumped tensors' sizes. Verifies\n"
    "every checksum while reading; a corrupt or truncated trace is an error naming\n"
    "the byte offset; a trace without a trailer is reported as incomplete.\n"
    "\n"
    "options:\n"
    "  --json            JSON Lines: {\"header\":...}, one {\"record\":...} per record,\n"
    "                    then {\"end\":{\"complete\":..,\"frames\":..,\"records\":..}}\n"
    "  --seq S           only sequence S\n"
    "  --positions A-B   only positions A..B (inclusive; 'A' alone is one position)\n"
    "  --layers SPEC     only digests of these layers: comma-separated indexes or ranges (0,3-5)\n"
    "\n"
    "Under 'lockstep --quiet' only --json prints; the exit status still checks the trace.\n"
    "exit status: 0 read completely, 2 corrupt, truncated or incomplete trace, or usage\n";

static int parse_range(const char *s, long *lo, long *hi)
{
    char *e;
    *lo = strtol(s, &e, 10);
    if (e == s || *lo < 0) return 0;
    if (*e == '-') {
        const char *t = e + 1;
        *hi = strtol(t, &e, 10);
        if (e == t || *hi < *lo) return 0;
    } else {
        *hi = *lo;
    }
    return *e == 0 || *e == ',';
}

static int layer_selected(const char *spec, long layer)
{
    if (!spec) return 1;
    for (const char *p = spec; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
        long lo, hi;
        if (parse_range(p, &lo, &hi) && layer >= lo && layer <= hi) return 1;
    }
    return 0;
}

static float f32(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static void print_json_record(const ls_trace_record *r, const ls_trace_header *h, const char *layers)
{
    json_t *tk = json_array(), *dg = json_array(), *dm = json_array();
    char buf[16];
    for (int k = 0; k < h->topk; k++) {
        snprintf(buf, sizeof buf, "0x%08x", r->topk_logprob_bits[k]);
        json_array_append_new(tk, json_pack("{s:i,s:s}", "id", r->topk_ids[k], "logprob_bits", buf));
    }
    for (uint32_t i = 0; i < r->n_digests; i++) {
        if (!layer_selected(layers, r->digests[i].layer)) continue;
        char hex[65];
        ls_digest_to_hex(&r->digests[i].digest, hex);
        json_array_append_new(dg, json_pack("{s:i,s:s,s:s}", "layer", r->digests[i].layer, "kind",
                                            ls_digest_kind_name((ls_digest_kind)r->digests[i].kind), "sha256", hex));
    }
    for (uint32_t i = 0; i < r->n_dumps; i++) {
        if (!layer_selected(layers, r->dumps[i].layer)) continue;
        json_array_append_new(dm, json_pack("{s:i,s:s,s:i,s:i}", "layer", r->dumps[i].layer, "kind",
                                            ls_digest_kind_name((ls_digest_kind)r->dumps[i].kind), "dtype",
                                            r->dumps[i].dtype, "n_elems", (int)r->dumps[i].n_elems));
    }
    snprintf(buf, sizeof buf, "0x%08x", r->logprob_bits);
    json_t *o = json_pack("{s:{s:I,s:I,s:i,s:i,s:s,s:o,s:o,s:o}}", "record", "seq", (json_int_t)r->seq, "pos",
                          (json_int_t)r->pos, "token", r->token, "next_token", r->next_token, "logprob_bits", buf,
                          "topk", tk, "digests", dg, "dumps", dm);
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (s) ls_stdout_puts(s, NULL); /* a failure is reported by main */
    free(s);
    json_decref(o);
}

static int dump(const char *path, int as_json, long seq, long p_lo, long p_hi, const char *layers)
{
    ls_error err;
    ls_error_clear(&err);
    ls_trace_reader *r;
    if (ls_trace_reader_open(path, &r, &err)) return ls_cli_report("trace", &err);
    const ls_trace_header *h = ls_trace_reader_header(r);
    /* Under --quiet the trace is still read and checked (the exit code says
     * whether it is complete and intact); only --json output is printed. */
    int text = !as_json && !ls_log_quiet();
    if (as_json) {
        json_t *ly = json_array(), *kinds = json_array();
        for (int i = 0; i < h->n_layers; i++)
            json_array_append_new(ly, json_pack("{s:i,s:s,s:i}", "index", i, "family",
                                                ls_layer_family_name(h->layers[i].family), "decoder_layer",
                                                h->layers[i].decoder_layer));
        for (int k = 0; k < LS_DIGEST_COUNT; k++)
            if (h->digest_kinds_mask & (1u << k)) json_array_append_new(kinds, json_string(ls_digest_kind_name((ls_digest_kind)k)));
        json_t *params = ls_trace_run_params_parse(h->run_params_json, NULL);
        json_t *o = json_pack("{s:{s:i,s:i,s:s,s:s,s:s,s:s,s:o,s:i,s:o,s:i,s:s,s:o}}", "header", "version_major",
                              (int)h->version_major, "version_minor", (int)h->version_minor, "mode", h->mode, "engine",
                              h->engine, "model_fingerprint", h->model_fingerprint, "manifest_digest", h->manifest_digest,
                              "run_params", params ? params : json_object(), "topk", h->topk, "digest_kinds", kinds,
                              "state_digest_every", (int)h->state_digest_every, "activation_dtype", h->activation_dtype,
                              "layers", ly);
        char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (s) ls_stdout_puts(s, NULL); /* a failure is reported by main */
        free(s);
        json_decref(o);
    } else if (text) {
        printf("trace format %u.%u, mode %s, engine %s\nmodel %s\nmanifest %s\nrun params %s\n", h->version_major,
               h->version_minor, h->mode, h->engine, h->model_fingerprint, h->manifest_digest[0] ? h->manifest_digest : "(none)",
               h->run_params_json);
        printf("top-k %d, activations %s, carried-state digests every %u positions, digest kinds:", h->topk,
               h->activation_dtype, h->state_digest_every);
        for (int k = 0; k < LS_DIGEST_COUNT; k++)
            if (h->digest_kinds_mask & (1u << k)) printf(" %s", ls_digest_kind_name((ls_digest_kind)k));
        printf("\nlayers (%d):", h->n_layers);
        for (int i = 0; i < h->n_layers; i++)
            printf(" %d:%s%s", i, ls_layer_family_name(h->layers[i].family), i + 1 < h->n_layers ? "," : "");
        printf("\n");
    }
    ls_status st;
    const ls_trace_record *rec;
    while ((st = ls_trace_reader_next(r, &rec, &err)) == LS_OK && rec) {
        /* stdout gone (full disk, closed pipe): stop now, not after the trace */
        if (ferror(stdout) && (st = ls_stdout_check(&err)) != LS_OK) break;
        if ((seq >= 0 && rec->seq != (uint32_t)seq) || (p_lo >= 0 && (rec->pos < (uint32_t)p_lo || rec->pos > (uint32_t)p_hi)))
            continue;
        if (as_json) {
            print_json_record(rec, h, layers);
            continue;
        }
        if (!text) continue;
        printf("seq %u pos %u: token %d -> next %d logprob 0x%08x (%.9g) top-%d", rec->seq, rec->pos, rec->token,
               rec->next_token, rec->logprob_bits, f32(rec->logprob_bits), h->topk);
        for (int k = 0; k < h->topk; k++) printf(" %d:%.9g", rec->topk_ids[k], f32(rec->topk_logprob_bits[k]));
        printf("\n");
        for (uint32_t i = 0; i < rec->n_digests; i++) {
            if (!layer_selected(layers, rec->digests[i].layer)) continue;
            char hex[65];
            ls_digest_to_hex(&rec->digests[i].digest, hex);
            printf("  layer %u %-10s %s\n", rec->digests[i].layer, ls_digest_kind_name((ls_digest_kind)rec->digests[i].kind), hex);
        }
        for (uint32_t i = 0; i < rec->n_dumps; i++)
            if (layer_selected(layers, rec->dumps[i].layer))
                printf("  layer %u %-10s dump: %u elements (dtype %u)\n", rec->dumps[i].layer,
                       ls_digest_kind_name((ls_digest_kind)rec->dumps[i].kind), rec->dumps[i].n_elems, rec->dumps[i].dtype);
    }
    int complete = ls_trace_reader_complete(r);
    uint64_t frames = ls_trace_reader_frames(r), records = ls_trace_reader_records(r);
    ls_trace_reader_close(r);
    fflush(stdout);
    if (st) return ls_cli_report("trace", &err);
    if (as_json)
        printf("{\"end\":{\"complete\":%s,\"frames\":%" PRIu64 ",\"records\":%" PRIu64 "}}\n", complete ? "true" : "false",
               frames, records);
    else if (text)
        printf("end: %s, %" PRIu64 " frames, %" PRIu64 " records\n", complete ? "complete" : "INCOMPLETE (no trailer)",
               frames, records);
    if (!complete) {
        fprintf(stderr, "lockstep trace: %s: incomplete trace: no trailer after frame %" PRIu64 " (the run stopped early)\n",
                path, frames);
        return 2;
    }
    return 0;
}

int ls_cmd_trace(int argc, char **argv)
{
    enum { OPT_JSON = LS_CLI_LONG, OPT_SEQ, OPT_POSITIONS, OPT_LAYERS };
    static const ls_cli_opt opts[] = {
        {"json", OPT_JSON, 0},
        {"seq", OPT_SEQ, 1},
        {"positions", OPT_POSITIONS, 1},
        {"layers", OPT_LAYERS, 1},
        {NULL, 0, 0},
    };
    if (argc >= 2 && ls_cli_is_help(argv[1])) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (argc < 2 || strcmp(argv[1], "dump") != 0) return ls_cli_usage_error("trace", "expected 'trace dump FILE'");
    const char *path = NULL, *layers = NULL;
    int as_json = 0;
    long seq = -1, p_lo = -1, p_hi = -1;
    /* argv[1] = "dump"; its options and FILE follow. */
    ls_cli_args a = {.cmd = "trace", .usage = usage_text, .opts = opts, .argc = argc - 1, .argv = argv + 1};
    for (int c; (c = ls_cli_next(&a)) != LS_CLI_END;) {
        switch (c) {
        case LS_CLI_EXIT: return a.exit_code;
        case OPT_JSON: as_json = 1; break;
        case OPT_SEQ: {
            char *e;
            seq = strtol(a.arg, &e, 10);
            if (*e || seq < 0) return ls_cli_usage_error("trace", "--seq needs a sequence id");
            break;
        }
        case OPT_POSITIONS:
            if (!parse_range(a.arg, &p_lo, &p_hi) || strchr(a.arg, ','))
                return ls_cli_usage_error("trace", "--positions needs A or A-B");
            break;
        case OPT_LAYERS: {
            long lo, hi;
            layers = a.arg;
            for (const char *p = layers; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
                if (!parse_range(p, &lo, &hi))
                    return ls_cli_usage_error("trace", "--layers needs indexes or ranges, e.g. 0,3-5");
            break;
        }
        case LS_CLI_OPERAND:
            if (path) return ls_cli_usage_error("trace", "unexpected argument: %s", a.arg);
            path = a.arg;
            break;
        }
    }
    if (!path) return ls_cli_usage_error("trace", "expected 'trace dump FILE'");
    return dump(path, as_json, seq, p_lo, p_hi, layers);
}
