/* lockstep — engine internals shared by the state and step API (engine.c)
 * and the forward with its digest queue (engine_forward.c). Not installed. */
#ifndef LS_ENGINE_ENGINE_INTERNAL_H
#define LS_ENGINE_ENGINE_INTERNAL_H

#include "backend/backend.h"
#include "engine/engine.h"

typedef struct layer_w {
    ls_buf *in_norm, *post_norm;          /* [D] */
    ls_bweight qkvz, ba, conv, out_proj;  /* gdn (qkvz, ba: Qwen3-Next) */
    ls_bweight in_qkv, in_z, in_b, in_a;  /* gdn, Qwen3.5: split projections */
    ls_bweight in_k, in_v;                /* Qwen3.5 under TP: in_qkv holds this rank's q rows,
                                             these its k and v rows */
    ls_buf *A_log, *dt_bias, *gnorm;      /* [Hv], [Hv], [dv] */
    ls_bweight q, k, v, o;                /* attention */
    ls_buf *q_norm, *k_norm;              /* [d] */
    ls_bweight router;
    ls_bweight *experts;                  /* [3E]: gate, up, down */
    ls_bweight shg, shu, shd, shw;
    ls_bmoe moe;
} layer_w;

typedef struct seq_state {
    int active;                           /* joined */
    uint32_t id;                          /* sequence id */
    long prompt_len;                      /* 0 = unknown */
    long len;                             /* tokens processed */
    ls_buf **conv, **gdn;                 /* [L] (NULL for attention layers): [C, K], [Hv, dk, dv] */
    ls_buf **kc, **vc;                    /* [L] (NULL for gdn layers): contiguous [Hkv, cap, d]
                                             each, or (paged) the pool's [pool_pages, Hkv, page, d] */
    long npages;                          /* paged: pool pages held (its table's first entries) */
} seq_state;

typedef struct seg {
    long slot;                            /* sequence slot */
    const int32_t *tokens;                /* [n] */
    long n;
    long row0;                            /* first packed row */
    long pos0;                            /* position of the first token */
    int last;                             /* the last token is the sequence's last position */
    int follows;                          /* tokens[n] is the token after the last (ls_engine_item) */
} seg;

/* A snapshot's carried state (engine.h); its buffers are the backend's. */
struct ls_engine_snapshot {
    ls_engine *owner;                     /* the engine whose backend holds the buffers */
    const ls_model *model;                /* what it was computed with */
    int act_bf16, fp8_w8a8, perturb_layer;
    ls_perturb_op perturb_op;
    uint32_t id;                          /* the sequence it was taken from */
    long len, prompt_len;                 /* positions held; the sequence's prompt length */
    long kv_cap;                          /* positions the KV buffers hold, >= len */
    ls_buf **conv, **gdn;                 /* [L] as seq_state */
    ls_buf **kc, **vc;                    /* [L]: [Hkv, kv_cap, d] each */
    int in_use;                           /* 0 = in the engine's free pool */
    struct ls_engine_snapshot *next;      /* every snapshot of the engine */
};

#define N_KINDS LS_DIGEST_COUNT

struct ls_engine {
    const ls_model *m;
    ls_model_config c;
    ls_engine_opts o;
    ls_backend *be;
    long max_seqs, cap, T;                /* T = max rows per forward */
    /* KV layout (ls_cpu_kv_row): contiguous = page cap, no table; paged =
     * pages of `page` from a pool of pool_pages shared by every slot */
    int paged;
    long page, max_pages, kv_cap;         /* positions per page; table entries per slot;
                                             positions a table covers (max_pages * page) */
    long pool_pages, n_free;
    int32_t *free_pages;                  /* [pool_pages] stack of free pool pages */
    int32_t *h_pt;                        /* [max_seqs, max_pages] page tables (host) */
    unsigned char *pt_dirty;              /* [max_seqs] table changed since its upload */
    ls_buf *pt;                           /* [max_seqs, max_pages] page tables (backend) */
    ls_buf **kpool, **vpool;              /* [L] paged: the pools (NULL for gdn layers) */
    long conv_dim, wqkvz;
    long gdn_floats;                      /* a GDN layer's carried state: [Hv, dk, dv], and with
                                             o.gdn_chunked the chunk's rows (LS_GDN_CHUNK_STATE_FLOATS) */
    ls_buf *gdn_mat;                      /* o.gdn_chunked: [Hv, dk, dv] a state materialised for its digest */
    ls_bweight embed, lm_head;
    ls_buf *final_norm;
    layer_w *lw;                          /* [L] */
    seq_state *ss;                        /* [max_seqs] */
    ls_engine_snapshot *snaps;            /* every snapshot taken (in use or pooled) */
    /* work buffers, [T, ...]; the hidden rows H and H_next swap at each
     * residual add, so that a queued digest of H stays valid across one */
    ls_buf *H, *H_next, *XN, *A, *P, *BA, *X, *Z, *Bv, *Av, *Y, *Q, *K, *V;
    ls_view gq, gk, gv;                   /* a GDN layer's q, k and v rows: Q, K, V, or ranges of Y */
    ls_buf *beta, *alpha, *O, *QG, *G, *probs, *ids, *wts, *logits, *lp;
    ls_buf *lps;                          /* u32 [T, LS_LP_SUMMARY_WORDS(lp_k)] the step's summary */
    /* a step's inputs, uploaded in one transfer: for the step's T rows,
     * tokens [T], next tokens [T], positions [T], cos [T, R/2], sin [T, R/2]
     * one after the other (in_layout); h_in is the host copy */
    ls_buf *inb;                          /* [3 max_rows + max_rows R] */
    ls_view v_tok, v_next, v_pos, v_cos, v_sin;
    /* host */
    uint32_t *h_in;                       /* [3 max_rows + max_rows R] */
    int32_t *h_tok, *h_next, *h_pos;      /* [T] in h_in; h_next -1: not known */
    float *h_cos, *h_sin;                 /* [T, R/2] in h_in */
    float *h_lp;                          /* [T, V] the step's logprob rows, once lp_full */
    uint32_t *h_lps;                      /* [T, LS_LP_SUMMARY_WORDS(lp_k)] */
    long lp_k;                            /* top entries of a record: min(5, V) */
    int lp_full;                          /* h_lp holds this step's rows */
    float *h_tmp;                         /* [max tensor] download scratch */
    unsigned char *h_bytes;               /* [4 * max tensor] canonical bytes */
    size_t tmp_elems;
    int n_tl;                             /* trace layers */
    ls_trace_layer *layers;               /* [n_tl] */
    int *slot_of;                         /* [n_tl * N_KINDS] digest slot or -1 */
    int n_slots;
    /* what a step's digests are written into and its records read: the last
     * begun step's bank of two (ls_engine_step_begin), so that one step's
     * digests may still be hashing while the next step runs */
    ls_trace_digest *dig;                 /* [T, n_slots] */
    unsigned char *have;                  /* [T, n_slots] */
    ls_trace_record *recs;                /* [T] */
    ls_trace_digest *rec_dig;             /* [T, n_slots] compacted */
    ls_sha256 *lg_run;                    /* [T] the logits rows' running hashes (lm_head) */
    int bank;                             /* the last begun step's */
    struct ls_engine_bank {
        ls_trace_digest *dig;
        unsigned char *have;
        ls_trace_record *recs;
        ls_trace_digest *rec_dig;
        ls_sha256 *lg_run;
        int pending;                      /* begun, not ended */
        long rows;
        uint64_t mark;                    /* be->digest_mark after the step's digest calls */
    } banks[2];                           /* bank 0's arrays hold both banks' */
    int32_t *sample_ids;                  /* [V] */
    /* digest queue: jobs wait until a buffer they read is about to change */
    ls_digest_job *jobs;                  /* [jobs_cap] */
    long n_jobs, jobs_cap;
    /* the last step */
    seg *sg;                              /* [T] segments */
    long step_rows;
    int32_t *row_seq;                     /* [T] sequence id of each row */
    /* layer dumps (dump_decoder_layers) */
    int dumping;
    int step_alone;                       /* the step is waited for before the next begins */
    /* step graphs (engine_forward.c, graph_step): per bank, the recorded
     * device work of a one-row decode step of slot `slot` (-1: none) */
    struct ls_engine_graph {
        ls_graph *g;
        long slot;
        ls_buf *H;                        /* e->H when it was recorded */
        unsigned char *have;              /* [n_slots] the row's digests it records */
        ls_trace_digest *dig;             /* [n_slots] their layers and kinds */
    } graphs[2];                          /* graphs[0]'s arrays hold both */
    int graphs_on;                        /* o.step_graphs, until a recording fails */
    int graph_warm;                       /* a step that could be recorded ran as it is */
    long graph_records, graph_launches;
    char graph_off[LS_ERROR_MSG_BYTES];   /* why a recording failed, or "" */
    unsigned char *dump_data;             /* [T, n_slots, dump_bytes] canonical bytes */
    size_t dump_bytes;
    ls_trace_dump *dumps;                 /* [T, n_slots] */
    uint32_t *dump_elems;                 /* [T, n_slots] 0 = none */
    uint8_t *dump_dtype;                  /* [T, n_slots] */
    ls_trace_dump *rec_dumps;             /* [T, n_slots] compacted */
    /* expert parallelism (o.ep_comm; ep 0 = off): this rank owns experts
     * ep_rank * ep_per .. (ep_rank + 1) * ep_per - 1, and the shared slot of
     * tokens t with t % ep == ep_rank (docs/parallel.md §3.1) */
    int ep, ep_rank;
    long ep_per;
    ls_buf *ep_pairs;                     /* i32 [T * (k+1), 2] this rank's (token, slot) pairs */
    ls_buf *ep_rows;                      /* [T * (k+1), D] their slot rows */
    ls_buf *ep_all;                       /* [T, k+1, D] every slot row, in slot order */
    int32_t *h_ids;                       /* [T, k] the router's expert ids */
    int32_t *h_pairs;                     /* [T * (k+1), 2] */
    float *h_rows;                        /* [T * (k+1), D] this rank's rows; then all, slot order */
    float *h_all;                         /* [T * (k+1), D] every rank's rows, rank by rank */
    size_t *ep_bytes;                     /* [ep] bytes of each rank's rows */
    long *ep_base;                        /* [ep] each rank's first row in h_all, then a cursor */
    ls_comm *moe_comm;                    /* the communicator the experts are split over:
                                             ep_comm, else tp_comm */
    /* tensor parallelism (o.tp_comm; tp 0 = off): this rank holds rows
     * tp_rank * N/tp .. of each sharded projection (docs/parallel.md §3.3) */
    int tp, tp_rank;
    ls_buf *tp_out;                       /* [T, max N / tp] this rank's outputs */
    float *h_tp_a, *h_tp_b;               /* [T, max N] host staging: own rows, every rank's */
    long tp_max_n;                        /* the widest sharded projection's N */
    long kv_head0;                        /* this rank's first KV head (c.n_kv_heads of them) */
    int kv_share;                         /* consecutive ranks holding the same KV heads */
    ls_buf *tp_in;                        /* [T, Hq d] the gathered attention output */
    ls_buf *k_full, *v_full;              /* [T, Hkv d] every KV head's rows, for the digests */
    ls_buf *gdn_full, *conv_full;         /* a full GDN state and conv state, for their digests */
    unsigned char **conv_w;               /* [L] TP: this rank's conv weight rows (host), or NULL */
    size_t weight_bytes;                  /* matrices and FP8 scales this engine wrapped */
    /* attention-FFN disaggregation (o.afd_comm; afd 0 = off): afd_rank
     * 0 .. afd_att - 1 run the mixers, afd_att .. afd - 1 the MoE
     * (docs/parallel.md §3.2); afd is the communicator's size, A + F */
    int afd, afd_rank, afd_att;
    float *h_afd;                         /* [T * (D + 2k)]: rows, then ids (int32 bits), weights */
    /* per decoder layer, this rank's wall time (ns) over the engine's
     * steps: [2L] busy, then waiting on the other rank (ls_afd_balance) */
    uint64_t *afd_ns;
    uint64_t afd_head_ns;                 /* rank 0: embedding, final norm, lm_head, logprobs */
    long afd_steps, afd_rows;
};

#define BEV(b) ((ls_view){(b), 0})
#define AT(b, off) ((ls_view){(b), (size_t)(off)})

/* The page table view of a slot: NULL buf (identity) when contiguous. */
static inline ls_view ls_engine_slot_pt(const ls_engine *e, long slot)
{
    ls_view v = {e->paged ? e->pt : NULL, e->paged ? (size_t)(slot * e->max_pages) : 0};
    return v;
}

/* One packed forward over the step's segments (engine_forward.c). */
ls_status ls_engine_forward(ls_engine *e, const seg *sg, long nseg, ls_error *err);
/* The step's logprob rows into h_lp (one transfer; nothing once lp_full). */
ls_status ls_engine_lp_rows(ls_engine *e, ls_error *err);

#endif
