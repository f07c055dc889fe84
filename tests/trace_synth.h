/* Synthetic traces for the trace/compare tests: deterministic records from
 * (seq, pos), written in rollout shape (one prefill frame, then one frame per
 * decode step) or replay shape (chunks of C positions), with an optional
 * planted difference. Header-only (static) so each test can include it. */
#ifndef LS_TESTS_TRACE_SYNTH_H
#define LS_TESTS_TRACE_SYNTH_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fingerprint/sha256.h"
#include "trace/trace.h"

#define SYN_D 16   /* hidden size of the dumped rows */

typedef enum syn_plant_what {
    SYN_NONE, SYN_TOKEN, SYN_NEXT_TOKEN, SYN_LOGPROB, SYN_TOPK_ORDER, SYN_TOPK_SET, SYN_DIGEST
} syn_plant_what;

typedef struct syn_plant {
    syn_plant_what what;
    uint32_t seq, pos;
    int layer;        /* SYN_DIGEST */
    int kind;         /* SYN_DIGEST: ls_digest_kind */
    int elem;         /* SYN_DIGEST with dumps: element changed */
} syn_plant;

typedef struct syn_opts {
    int n_seqs;
    int prompt_len;   /* positions in the prefill */
    int gen_len;      /* decode steps after the prefill */
    int chunk;        /* 0 = rollout shape; C = replay chunks of C positions */
    int dumps;        /* 1: full hidden/router tensors at every (layer, pos) for layer 1 and 2 */
    int kinds_mask;   /* digest kinds (0: all, -1: none) */
    const char *model;/* fingerprint hex (default all 'a') */
    syn_plant plant;
} syn_opts;

static const ls_trace_layer syn_layers[] = {
    {0, LS_FAMILY_EMBED, -1}, {1, LS_FAMILY_GDN, 0},       {2, LS_FAMILY_MOE, 0},
    {3, LS_FAMILY_ATTENTION, 1}, {4, LS_FAMILY_MOE, 1},    {5, LS_FAMILY_NORM, -1},
    {6, LS_FAMILY_LM_HEAD, -1},
};
#define SYN_N_LAYERS 7

static uint32_t syn_hash(uint32_t a, uint32_t b, uint32_t c)
{
    uint32_t h = a * 0x9e3779b1u ^ (b + 0x7f4a7c15u) * 0x85ebca6bu ^ (c + 0x165667b1u) * 0xc2b2ae35u;
    h ^= h >> 15; h *= 0x2c1b3c6du; h ^= h >> 12;
    return h;
}

static int syn_kind_allowed(int layer, int kind)
{
    ls_layer_family f = syn_layers[layer].family;
    switch (kind) {
    case LS_DIGEST_HIDDEN: return 1;
    case LS_DIGEST_GDN_STATE: case LS_DIGEST_CONV_STATE: return f == LS_FAMILY_GDN;
    case LS_DIGEST_KV: return f == LS_FAMILY_ATTENTION;
    case LS_DIGEST_ROUTER: return f == LS_FAMILY_MOE;
    }
    return 0;
}

/* Builds the record for (seq, pos) into rec, with storage from the caller. */
static void syn_record(const syn_opts *o, uint32_t seq, uint32_t pos, ls_trace_record *rec, ls_trace_digest *dg,
                       ls_trace_dump *dm, uint8_t dumpdata[][SYN_D * 4])
{
    const syn_plant *pl = &o->plant;
    int here = pl->what != SYN_NONE && pl->seq == seq && pl->pos == pos;
    memset(rec, 0, sizeof *rec);
    rec->seq = seq;
    rec->pos = pos;
    rec->token = (int32_t)(syn_hash(seq, pos, 1) % 1000);
    int last = (int)pos == o->prompt_len + o->gen_len - 1;
    rec->next_token = last ? -1 : (int32_t)(syn_hash(seq, pos + 1, 1) % 1000);
    float lp = -(float)(syn_hash(seq, pos, 2) % 1000) / 997.0f;
    memcpy(&rec->logprob_bits, &lp, 4);
    if (last) rec->logprob_bits = 0x7fc00000u;
    for (int k = 0; k < 5; k++) {
        /* distinct ids (the format requires it): redraw a repeated one */
        for (uint32_t salt = 10 + (uint32_t)k;; salt += 5) {
            rec->topk_ids[k] = (int32_t)(syn_hash(seq, pos, salt) % 1000);
            int seen = 0;
            for (int j = 0; j < k; j++) seen |= rec->topk_ids[j] == rec->topk_ids[k];
            if (!seen) break;
        }
        float v = -(float)k - 0.25f;
        memcpy(&rec->topk_logprob_bits[k], &v, 4);
    }
    if (here && pl->what == SYN_TOKEN) rec->token ^= 1;
    if (here && pl->what == SYN_NEXT_TOKEN) rec->next_token ^= 1;
    if (here && pl->what == SYN_LOGPROB) rec->logprob_bits ^= 1;
    if (here && pl->what == SYN_TOPK_ORDER) {
        int32_t t = rec->topk_ids[1]; rec->topk_ids[1] = rec->topk_ids[2]; rec->topk_ids[2] = t;
    }
    if (here && pl->what == SYN_TOPK_SET) rec->topk_ids[4] = 5000;
    uint32_t nd = 0, nm = 0;
    uint32_t mask = o->kinds_mask < 0 ? 0 : o->kinds_mask ? (uint32_t)o->kinds_mask : 0x1f;
    for (int l = 0; l < SYN_N_LAYERS; l++)
        for (int k = 0; k < LS_DIGEST_COUNT; k++) {
            if (!syn_kind_allowed(l, k) || !(mask & (1u << k))) continue;
            int planted = here && pl->what == SYN_DIGEST && pl->layer == l && pl->kind == k;
            int dump = o->dumps && (l == 1 || l == 2) && (k == LS_DIGEST_HIDDEN || k == LS_DIGEST_ROUTER);
            uint8_t *bytes = dumpdata[nm];
            uint32_t n;
            uint8_t dtype;
            if (k == LS_DIGEST_ROUTER) {
                n = 8; dtype = LS_DUMP_ROUTER;
                for (int i = 0; i < 4; i++) {
                    uint32_t id = syn_hash(l, pos, 100 + i) % 64;
                    float wgt = 0.25f + (float)i / 64.0f;
                    uint32_t wb; memcpy(&wb, &wgt, 4);
                    memcpy(bytes + 4 * i, &id, 4);
                    memcpy(bytes + 16 + 4 * i, &wb, 4);
                }
                if (planted) { uint32_t t; memcpy(&t, bytes, 4); memcpy(bytes, bytes + 4, 4); memcpy(bytes + 4, &t, 4); }
            } else {
                n = SYN_D; dtype = LS_DUMP_BF16;
                for (int i = 0; i < SYN_D; i++) {
                    uint16_t v = (uint16_t)(0x3f80 + (syn_hash(seq * 131 + l, pos, 200 + k * 64 + i) % 256));
                    if (planted && i == pl->elem) v += 3;
                    bytes[2 * i] = (uint8_t)v; bytes[2 * i + 1] = (uint8_t)(v >> 8);
                }
            }
            size_t nbytes = (size_t)n * 4 / (dtype == LS_DUMP_BF16 ? 2 : 1);
            if (dtype == LS_DUMP_ROUTER) nbytes = 32;
            dg[nd].layer = (uint16_t)l;
            dg[nd].kind = (uint8_t)k;
            if (!dump) {
                /* digest of a pretend tensor identified by (seq, pos, layer, kind) */
                uint32_t seed[4] = {seq, pos, (uint32_t)l, (uint32_t)k + (planted ? 100u : 0u)};
                ls_sha256_buf(seed, sizeof seed, &dg[nd].digest, NULL);
            } else {
                ls_sha256_buf(bytes, nbytes, &dg[nd].digest, NULL);
                dm[nm] = (ls_trace_dump){(uint16_t)l, (uint8_t)k, dtype, n, bytes};
                nm++;
            }
            nd++;
        }
    rec->n_digests = nd;
    rec->digests = dg;
    rec->n_dumps = nm;
    rec->dumps = dm;
}

/* Writes a synthetic trace; returns 0 on success (prints the error otherwise). */
static int syn_write(const char *path, const syn_opts *o)
{
    char model[65];
    memset(model, 'a', 64); model[64] = 0;
    ls_trace_header h = {0};
    h.mode = o->chunk ? "replay" : "rollout";
    h.engine = "synthetic";
    h.model_fingerprint = o->model ? o->model : model;
    h.manifest_digest = "";
    h.run_params_json = o->chunk ? "{\"chunk\":1}" : "{\"temperature\":0}";
    h.topk = 5;
    h.digest_kinds_mask = o->kinds_mask < 0 ? 0 : o->kinds_mask ? (uint32_t)o->kinds_mask : 0x1f;
    h.state_digest_every = 1;
    h.n_layers = SYN_N_LAYERS;
    h.layers = syn_layers;
    ls_error err;
    ls_error_clear(&err);
    ls_trace_writer *w;
    if (ls_trace_writer_open(path, &h, &w, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    ls_trace_digest dg[64];
    ls_trace_dump dm[16];
    uint8_t data[16][SYN_D * 4];
    ls_trace_record rec;
    int total = o->prompt_len + o->gen_len;
#define SYN_ADD(s, p)                                                  \
    do {                                                               \
        syn_record(o, (uint32_t)(s), (uint32_t)(p), &rec, dg, dm, data); \
        if (ls_trace_writer_add(w, &rec, &err)) goto fail;             \
    } while (0)
    if (!o->chunk) {
        if (ls_trace_writer_begin_frame(w, LS_FRAME_PREFILL, &err)) goto fail;
        for (int s = 0; s < o->n_seqs; s++)
            for (int p = 0; p < o->prompt_len; p++) SYN_ADD(s, p);
        if (ls_trace_writer_end_frame(w, &err)) goto fail;
        for (int p = o->prompt_len; p < total; p++) {
            if (ls_trace_writer_begin_frame(w, LS_FRAME_DECODE, &err)) goto fail;
            for (int s = 0; s < o->n_seqs; s++) SYN_ADD(s, p);
            if (ls_trace_writer_end_frame(w, &err)) goto fail;
        }
    } else {
        for (int c = 0; c < total; c += o->chunk) {
            if (ls_trace_writer_begin_frame(w, LS_FRAME_CHUNK, &err)) goto fail;
            for (int s = 0; s < o->n_seqs; s++)
                for (int p = c; p < c + o->chunk && p < total; p++) SYN_ADD(s, p);
            if (ls_trace_writer_end_frame(w, &err)) goto fail;
        }
    }
#undef SYN_ADD
    if (ls_trace_writer_close(w, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    return 0;
fail:
    fprintf(stderr, "%s\n", err.msg);
    ls_trace_writer_abort(w);
    return 1;
}

#endif
