/* lockstep — one run of the model; see run.h. */
#include "run/run.h"

#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/thread.h"
#include "core/util.h"
#include "fingerprint/sha256.h"
#include "io/checkpoint.h"
#include "manifest/manifest.h"
#include "model/model.h"
#include "trace/trace.h"
#include "backend/backend_cuda.h"
#include "backend/providers.h"
#include "code/code.h"
#include "core/build_info.h"
#include "run/ranks.h"

ls_status ls_run_workdir(const char *given, const char *tag, char *out, size_t out_size, int *temporary,
                         ls_error *err)
{
    *temporary = 0;
    if (given) {
        if (mkdir(given, 0777) != 0 && errno != EEXIST)
            return ls_fail(err, LS_E_IO, "%s: cannot create directory: %s", given, strerror(errno));
        if ((size_t)snprintf(out, out_size, "%s", given) >= out_size)
            return ls_fail(err, LS_E_USAGE, "%s: path too long", given);
        return LS_OK;
    }
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp) tmp = "/tmp";
    /* "lockstep-TAG.tmp.<pid>.XXXXXX": registered, so SIGTERM/SIGINT remove
     * it; one left by a SIGKILL is swept by the next run of the same TAG
     * (core/util.h, "temporary paths"). */
    if ((size_t)snprintf(out, out_size, "%s/lockstep-%s", tmp, tag) >= out_size - 40)
        return ls_fail(err, LS_E_USAGE, "TMPDIR is too long");
    ls_temp_sweep_stale(out);
    size_t n = strlen(out);
    snprintf(out + n, out_size - n, ".tmp.%ld.XXXXXX", (long)getpid());
    if (!mkdtemp(out)) return ls_fail(err, LS_E_IO, "%s: cannot create a temporary directory: %s", out, strerror(errno));
    ls_temp_register(out, LS_TEMP_DIR); /* its name is known only now */
    *temporary = 1;
    return LS_OK;
}

static void remove_tree(const char *dir, int depth)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char path[4600];
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct stat sb;
        if (lstat(path, &sb) != 0) continue;
        if (S_ISDIR(sb.st_mode) && depth < 2) remove_tree(path, depth + 1);
        else if (S_ISREG(sb.st_mode)) unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

void ls_run_workdir_remove(const char *dir)
{
    remove_tree(dir, 0);
    ls_temp_unregister(dir);
}

void ls_run_workdir_keep(char *dir, size_t dir_size)
{
    ls_temp_unregister(dir);
    const char *slash = strrchr(dir, '/');
    char *t = strstr(slash ? slash : dir, ".tmp.");
    char *rest = t ? strchr(t + 5, '.') : NULL;
    char kept[4096];
    if (!rest || (size_t)snprintf(kept, sizeof kept, "%.*s%s", (int)(t - dir), dir, rest) >= sizeof kept ||
        strlen(kept) >= dir_size)
        return;
    if (rename(dir, kept) != 0) {
        ls_log_warn("%s: cannot rename to %s: %s (a later run may remove it as a stale temporary)", dir, kept,
                    strerror(errno));
        return;
    }
    memcpy(dir, kept, strlen(kept) + 1);
}

void ls_run_spec_default(ls_run_spec *s)
{
    memset(s, 0, sizeof *s);
    s->sampling = (ls_sampling){LS_SAMPLING_GREEDY, 0, 1.0f, 0, 1.0f};
    s->act_bf16 = 1;
    s->backend = "cpu";
    s->threads = 1;
    s->state_digest_every = 64;
    s->max_rows = 256;
    s->samples_per_prompt = 1;
}

ls_status ls_run_spec_group(const ls_run_spec *s, ls_rollout_opts *o, int *preempt_on, uint64_t *preempt_seed,
                            ls_error *err)
{
    ls_rollout_opts_default(o);
    *preempt_on = 0;
    *preempt_seed = 0;
    if (s->samples_per_prompt < 1)
        return ls_fail(err, LS_E_USAGE, "samples_per_prompt (--samples-per-prompt) must be >= 1 (got %ld)",
                       s->samples_per_prompt);
    o->samples_per_prompt = s->samples_per_prompt;
    const char *pc = s->prefix_cache ? s->prefix_cache : "off";
    if (!strcmp(pc, "off")) o->prefix_cache = LS_PREFIX_CACHE_OFF;
    else if (!strcmp(pc, "aligned")) o->prefix_cache = LS_PREFIX_CACHE_ALIGNED;
    else if (!strcmp(pc, "any")) o->prefix_cache = LS_PREFIX_CACHE_ANY;
    else return ls_fail(err, LS_E_USAGE, "prefix_cache (--prefix-cache) '%s': expected off, aligned or any", pc);
    if (s->prefix_block < 0 || (s->prefix_block > 0 && o->prefix_cache != LS_PREFIX_CACHE_ALIGNED))
        return ls_fail(err, LS_E_USAGE, "prefix_block (--prefix-block) %ld: a block >= 1 applies to "
                       "prefix_cache (--prefix-cache) aligned only", s->prefix_block);
    if (s->prefix_block > 0) o->prefix_block = s->prefix_block;
    const char *pp = s->preempt ? s->preempt : "none";
    if (strcmp(pp, "none")) {
        char *end = NULL;
        const char *v = !strncmp(pp, "seeded:", 7) ? pp + 7 : NULL;
        errno = 0; /* a seed past 2^64 - 1 is refused, not clamped */
        unsigned long long seed = v && *v && *v != '-' && *v != '+' ? strtoull(v, &end, 10) : 0;
        if (!v || !*v || *v == '-' || *v == '+' || *end || errno == ERANGE)
            return ls_fail(err, LS_E_USAGE, "preempt (--preempt) '%s': expected none or seeded:SEED", pp);
        *preempt_on = 1;
        *preempt_seed = seed;
    }
    return LS_OK;
}

ls_status ls_run_spec_serving(const ls_run_spec *s, ls_manifest_serving *out, int *any, ls_error *err)
{
    memset(out, 0, sizeof *out);
    *any = 0;
    ls_rollout_opts go;
    int preempt_on;
    uint64_t seed;
    LS_TRY(ls_run_spec_group(s, &go, &preempt_on, &seed, err));
    if (s->kv_page < 0 || s->kv_page > LS_RUN_KV_PAGE_MAX)
        return ls_fail(err, LS_E_USAGE, "kv_page %ld: the KV page size must be 0 (a contiguous cache) or "
                       "1..%ld positions", s->kv_page, LS_RUN_KV_PAGE_MAX);
    out->kv_page = s->kv_page;
    out->samples_per_prompt = go.samples_per_prompt;
    out->prefix_cache = ls_prefix_cache_name(go.prefix_cache);
    out->prefix_block = go.prefix_cache == LS_PREFIX_CACHE_ALIGNED ? go.prefix_block : 0;
    out->preemption = preempt_on ? "seeded" : "none";
    out->preempt_seed = preempt_on ? seed : 0;
    *any = s->kv_page > 0 || go.samples_per_prompt > 1 || go.prefix_cache != LS_PREFIX_CACHE_OFF || preempt_on;
    return LS_OK;
}

/* Whether the sampling parameters are the neutral ones of
 * ls_run_spec_default (what greedy selection and a replay leave them). */
static int sampling_params_unset(const ls_sampling *p)
{
    return p->seed == 0 && p->temperature == 1.0f && p->top_k == 0 && p->top_p == 1.0f;
}

static int is_hex64(const char *h)
{
    size_t n = 0;
    for (; h[n]; n++)
        if (!((h[n] >= '0' && h[n] <= '9') || (h[n] >= 'a' && h[n] <= 'f'))) return 0;
    return n == 64;
}

int ls_run_spec_world(const ls_run_spec *s)
{
    if (s->afd_attention > 0 || s->afd_ffn > 0) return s->afd_attention + s->afd_ffn;
    return (s->tp > 1 ? s->tp : 1) * (s->ep > 1 ? s->ep : 1);
}

/* The flags that make a spec's ranks, for messages: "--tp 2 --ep 2". */
static void topology_flags(const ls_run_spec *s, char *out, size_t n)
{
    if (s->afd_attention > 0 || s->afd_ffn > 0) snprintf(out, n, "--afd %d:%d", s->afd_attention, s->afd_ffn);
    else if (s->tp > 1 && s->ep > 1) snprintf(out, n, "--tp %d --ep %d", s->tp, s->ep);
    else if (s->tp > 1) snprintf(out, n, "--tp %d", s->tp);
    else snprintf(out, n, "--ep %d", s->ep);
}

ls_status ls_run_spec_topology(const ls_run_spec *s, ls_manifest_opts *mo, ls_error *err)
{
    if (s->tp < 0 || s->tp > LS_COMM_MAX_RANKS)
        return ls_fail(err, LS_E_USAGE, "tp (--tp) %d: expected 1..%d ranks", s->tp, LS_COMM_MAX_RANKS);
    if (s->ep < 0 || s->ep > LS_COMM_MAX_RANKS)
        return ls_fail(err, LS_E_USAGE, "ep (--ep) %d: expected 1..%d ranks", s->ep, LS_COMM_MAX_RANKS);
    int afd = s->afd_attention > 0 || s->afd_ffn > 0;
    if (s->afd_attention < 0 || s->afd_ffn < 0 || (afd && (s->afd_attention < 1 || s->afd_ffn < 1)))
        return ls_fail(err, LS_E_USAGE, "afd (--afd) %d:%d: expected A:F, attention and FFN ranks >= 1 each",
                       s->afd_attention, s->afd_ffn);
    if (afd && (s->tp > 1 || s->ep > 1))
        return ls_fail(err, LS_E_UNSUPPORTED, "afd (--afd) %d:%d with %s (--%s) %d: attention-FFN disaggregation "
                       "does not combine with --tp or --ep (A:F splits the mixers over the A attention ranks and "
                       "the experts over the F FFN ranks itself)", s->afd_attention, s->afd_ffn,
                       s->tp > 1 ? "tp" : "ep", s->tp > 1 ? "tp" : "ep", s->tp > 1 ? s->tp : s->ep);
    long world = afd ? (long)s->afd_attention + s->afd_ffn
                     : (long)(s->tp > 1 ? s->tp : 1) * (s->ep > 1 ? s->ep : 1);
    char flags[64];
    topology_flags(s, flags, sizeof flags);
    if (world > LS_COMM_MAX_RANKS)
        return ls_fail(err, LS_E_USAGE, "%s: %ld ranks, more than the %d a world holds", flags, world,
                       LS_COMM_MAX_RANKS);
    /* refused before any worker starts (the ranks would each refuse) */
    if (world > 1 && s->backend && !strcmp(s->backend, "cuda") && !ls_backend_cuda_built())
        return ls_fail(err, LS_E_UNSUPPORTED, "%s with backend (--backend) cuda: this "
                       "lockstep was built without CUDA (no nvcc at build time)", flags);
    if (s->afd_balance && !afd)
        return ls_fail(err, LS_E_USAGE, "afd_balance (--afd-balance) %s: the balance report is of an "
                       "attention-FFN disaggregated run (--afd A:F)", s->afd_balance);
    if (s->rank_timeout_ms < 0 || (s->rank_timeout_ms > 0 && world == 1))
        return ls_fail(err, LS_E_USAGE, "rank_timeout_ms (--rank-timeout) %ld: a deadline >= 1 ms applies to "
                       "several ranks (--tp, --ep or --afd) only", s->rank_timeout_ms);
    mo->world_size = (int)world;
    mo->tp_degree = afd || s->tp < 1 ? 1 : s->tp;
    mo->ep_degree = afd || s->ep < 1 ? 1 : s->ep;
    mo->afd_attention_ranks = afd ? s->afd_attention : 0;
    mo->afd_ffn_ranks = afd ? s->afd_ffn : 0;
    mo->communicator = world > 1 ? "cpu-socket" : "none";
    mo->reduction_tree = "none"; /* order-preserving TP: no reduction is split (docs/parallel.md §3.3) */
    return LS_OK;
}

/* What the tc and fast tiers refuse (nothing for the portable tier): a
 * backend other than cuda, more than LS_RUN_TC_ROWS rows per call, and, when
 * m is given, an FP8 model (`checkpoint` names it, or NULL). */
static ls_status tier_refusals(ls_tier tier, const char *backend, long max_rows, const ls_model *m,
                               const char *checkpoint, ls_error *err)
{
    if (tier == LS_TIER_PORTABLE) return LS_OK;
    const char *t = ls_run_tier_name(tier);
    if (!backend || strcmp(backend, "cuda"))
        return ls_fail(err, LS_E_USAGE, "tier (--tier) %s runs on the cuda backend only (backend (--backend) is "
                       "%s; the cpu is the portable tier's reference)", t, backend ? backend : "(none)");
    if (max_rows > LS_RUN_TC_ROWS)
        return ls_fail(err, LS_E_USAGE, "rows per call (--max-rows) %ld: the %s tier prepares its GEMMs for up "
                       "to %d rows per call", max_rows, t, LS_RUN_TC_ROWS);
    if (m && m->cfg.fp8)
        return ls_fail(err, LS_E_UNSUPPORTED, "tier (--tier) %s: %s is an FP8 checkpoint; the tier runs bf16 "
                       "weights only (its FP8 GEMMs are not built)", t, checkpoint ? checkpoint : "the model");
    return LS_OK;
}

ls_status ls_run_spec_validate(const ls_run_spec *s, ls_error *err)
{
    if (!s->mode) return ls_fail(err, LS_E_USAGE, "mode (--mode) is required: rollout or replay");
    int rollout = !strcmp(s->mode, "rollout");
    if (!rollout && strcmp(s->mode, "replay"))
        return ls_fail(err, LS_E_USAGE, "mode (--mode) '%s': expected rollout or replay", s->mode);
    if (!s->checkpoint) return ls_fail(err, LS_E_USAGE, "checkpoint (--checkpoint DIR) is required");
    if (!s->out) return ls_fail(err, LS_E_USAGE, "out (-o TRACE) is required");
    LS_TRY(ls_output_path_check(s->out, err)); /* before the run, not after it */
    if (s->afd_balance) LS_TRY(ls_output_path_check(s->afd_balance, err));
    if (!s->batch || s->batch->n < 1)
        return ls_fail(err, LS_E_USAGE, "batch: no sequences (--prompts, --from or --tokens)");
    if (!s->backend || (strcmp(s->backend, "cpu") && strcmp(s->backend, "cuda")))
        return ls_fail(err, LS_E_USAGE, "backend (--backend) '%s': expected cpu or cuda",
                       s->backend ? s->backend : "(none)");
    if (s->tier != LS_TIER_PORTABLE) {
        const char *t = ls_run_tier_name(s->tier);
        LS_TRY(tier_refusals(s->tier, s->backend, s->max_rows, NULL, NULL, err));
        if (ls_run_spec_world(s) > 1)
            return ls_fail(err, LS_E_UNSUPPORTED, "tier (--tier) %s runs on one rank (--tp, --ep and --afd "
                           "are not built for it yet)", t);
        LS_TRY(ls_run_perturb_tier_check(s->perturb, s->tier, err));
    }
    if (s->gdn_chunked && !ls_backend_gdn_chunked_provider(s->backend, s->tier))
        return ls_fail(err, LS_E_UNSUPPORTED, "gdn_form (--gdn-form) chunk-aligned: backend %s has no kernel "
                       "for it", s->backend);
    if (rollout) {
        if (s->max_new < 1) return ls_fail(err, LS_E_USAGE, "max_new (--max-new-tokens) must be >= 1");
        if (s->chunk != 0)
            return ls_fail(err, LS_E_USAGE, "chunk (--chunk) applies to replays only: a rollout "
                           "prefills whole prompts and decodes one token per step");
        if (s->expect_merkle_root)
            return ls_fail(err, LS_E_USAGE, "expect_merkle_root applies to replays only");
    } else {
        if (s->max_new != 0)
            return ls_fail(err, LS_E_USAGE, "max_new (--max-new-tokens) applies to rollouts only: a "
                           "replay recomputes the tokens it is given");
        if (s->chunk < 0)
            return ls_fail(err, LS_E_USAGE, "chunk (--chunk) must be >= 1 (0: the whole sequence)");
        if (s->sampling.kind != LS_SAMPLING_GREEDY || !sampling_params_unset(&s->sampling))
            return ls_fail(err, LS_E_USAGE, "sampling (--sampling, --seed, --temperature, --top-k, "
                           "--top-p) applies to rollouts only: a replay is teacher-forced");
        if (s->expect_merkle_root && !is_hex64(s->expect_merkle_root))
            return ls_fail(err, LS_E_INPUT, "expect_merkle_root%s%s '%.80s': expected 64 lowercase hex "
                           "digits", s->expect_source ? " of " : "",
                           s->expect_source ? s->expect_source : "", s->expect_merkle_root);
    }
    ls_rollout_opts go;
    int preempt_on;
    uint64_t preempt_seed;
    LS_TRY(ls_run_spec_group(s, &go, &preempt_on, &preempt_seed, err));
    if (!rollout && (go.samples_per_prompt != 1 || go.prefix_cache != LS_PREFIX_CACHE_OFF || preempt_on))
        return ls_fail(err, LS_E_USAGE, "samples_per_prompt, prefix_cache and preempt (--samples-per-prompt, "
                       "--prefix-cache, --preempt) apply to rollouts only: a replay recomputes each sequence "
                       "it is given");
    if (go.samples_per_prompt > 1 && s->sampling.kind == LS_SAMPLING_GREEDY)
        return ls_fail(err, LS_E_USAGE, "samples_per_prompt (--samples-per-prompt) %ld needs seeded sampling "
                       "(--sampling seeded): greedy samples of one prompt would all be equal",
                       go.samples_per_prompt);
    if (go.prefix_cache != LS_PREFIX_CACHE_OFF && s->dump_layers)
        return ls_fail(err, LS_E_USAGE, "dump_layers (--dump-layers) with prefix_cache (--prefix-cache): the "
                       "reused positions' records keep their digests, not their dumps");
    if (s->sampling.kind == LS_SAMPLING_GREEDY && !sampling_params_unset(&s->sampling))
        return ls_fail(err, LS_E_USAGE, "sampling: seed, temperature, top_k and top_p (--seed, "
                       "--temperature, --top-k, --top-p) apply to seeded sampling only (--sampling "
                       "seeded); greedy selection takes none");
    if (!strcmp(s->backend, "cpu") && s->gpu != 0)
        return ls_fail(err, LS_E_USAGE, "gpu (--gpu) %d applies to the cuda backend only (backend "
                       "(--backend) is cpu)", s->gpu);
    if (s->threads < 1) return ls_fail(err, LS_E_USAGE, "threads (--threads) must be >= 1");
    ls_manifest_opts topo = ls_manifest_opts_default();
    LS_TRY(ls_run_spec_topology(s, &topo, err));
    if (s->state_digest_every < 1)
        return ls_fail(err, LS_E_USAGE, "state_digest_every (--state-digest-every) must be >= 1");
    if (s->max_rows < 1) return ls_fail(err, LS_E_USAGE, "max_rows (--max-rows) must be >= 1");
    if (s->kv_page < 0 || s->kv_page > LS_RUN_KV_PAGE_MAX)
        return ls_fail(err, LS_E_USAGE, "kv_page %ld: the KV page size must be 0 (a contiguous cache) or "
                       "1..%ld positions", s->kv_page, LS_RUN_KV_PAGE_MAX);
    if (s->sampling.kind == LS_SAMPLING_SEEDED &&
        (!(s->sampling.temperature > 0.0f) || !(s->sampling.top_p > 0.0f && s->sampling.top_p <= 1.0f) ||
         s->sampling.top_k < 0))
        return ls_fail(err, LS_E_USAGE, "sampling: temperature (--temperature) must be > 0, top_p "
                       "(--top-p) in (0, 1], top_k (--top-k) >= 0");
    if (s->fp8 && strcmp(s->fp8, "dequant") && strcmp(s->fp8, "w8a8"))
        return ls_fail(err, LS_E_USAGE, "fp8 (--fp8) '%s': expected dequant or w8a8", s->fp8);
    if (s->perturb) {
        int layer, twin;
        ls_perturb_op op;
        LS_TRY(ls_run_parse_perturb(s->perturb, &layer, &op, &twin, err));
        if (!twin && strcmp(s->backend, "cpu"))
            return ls_fail(err, LS_E_UNSUPPORTED, "perturb (--perturb) '%s': a planted order is implemented on the "
                           "cpu backend only (the cuda backend has no reversed-order kernels; its fast twins: "
                           "layer=L,op=OP,twin=fast)", s->perturb);
        if (twin && strcmp(s->backend, "cuda"))
            return ls_fail(err, LS_E_UNSUPPORTED, "perturb (--perturb) '%s': the %s backend has no fast twins "
                           "(a planted order: layer=L,op=OP)", s->perturb, s->backend);
        if (twin && !ls_run_fast_twin(op, s->tier))
            return ls_fail(err, LS_E_UNSUPPORTED, "perturb (--perturb) '%s': %s has no fast twin on the cuda "
                           "backend's %s tier (attention and gdn have one on the portable and tc tiers, combine "
                           "on the tc tier)", s->perturb, ls_perturb_op_name(op), ls_run_tier_name(s->tier));
        if (twin && ls_run_spec_world(s) > 1)
            return ls_fail(err, LS_E_UNSUPPORTED, "perturb (--perturb) '%s': fast twins run on one rank",
                           s->perturb);
    }
    for (long i = 0; i < s->batch->n; i++) {
        const ls_sequence *q = &s->batch->seqs[i];
        if ((uint64_t)q->id * (uint64_t)go.samples_per_prompt + (uint64_t)(go.samples_per_prompt - 1) > UINT32_MAX)
            return ls_fail(err, LS_E_USAGE, "samples_per_prompt (--samples-per-prompt) %ld: the sample ids of "
                           "prompt %u (id * %ld + sample) exceed 32 bits", go.samples_per_prompt, q->id,
                           go.samples_per_prompt);
        if (q->n_tokens < (rollout ? 1 : 2))
            return ls_fail(err, LS_E_INPUT, "sequence %u has %ld tokens (%s)", q->id, q->n_tokens,
                           rollout ? "a prompt needs one" : "a replay needs a prompt and a completion");
    }
    return LS_OK;
}

ls_status ls_run_parse_gdn_form(const char *what, const char *v, int *chunked, ls_error *err)
{
    if (strcmp(v, "recurrent") && strcmp(v, "chunk-aligned"))
        return ls_fail(err, LS_E_USAGE, "%s '%s': expected recurrent or chunk-aligned", what, v);
    *chunked = !strcmp(v, "chunk-aligned");
    return LS_OK;
}

ls_status ls_run_perturb_tier_check(const char *spec, ls_tier tier, ls_error *err)
{
    int layer, twin = 0;
    ls_perturb_op op;
    ls_error ignored;
    if (!spec || tier == LS_TIER_PORTABLE) return LS_OK;
    if (ls_run_parse_perturb(spec, &layer, &op, &twin, &ignored) != LS_OK) twin = 0; /* recorded as given */
    if (twin && tier == LS_TIER_TC) return LS_OK;
    return ls_fail(err, LS_E_USAGE, "perturb (--perturb) applies to the portable tier, and on the tc tier as a fast "
                   "twin, layer=L,op=OP,twin=fast (the %s tier's GEMMs have cuBLASLt's orders only)",
                   ls_run_tier_name(tier));
}

int ls_run_fast_twin(ls_perturb_op op, ls_tier tier)
{
    return op == LS_PERTURB_ATTENTION || op == LS_PERTURB_GDN || (op == LS_PERTURB_COMBINE && tier == LS_TIER_TC);
}

const char *ls_run_tier_name(ls_tier tier)
{
    return tier == LS_TIER_TC ? "tc" : tier == LS_TIER_FAST ? "fast" : "portable";
}

ls_status ls_run_parse_tier(const char *what, const char *v, ls_tier *tier, ls_error *err)
{
    static const ls_tier all[] = {LS_TIER_PORTABLE, LS_TIER_TC, LS_TIER_FAST};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(v, ls_run_tier_name(all[i]))) {
            *tier = all[i];
            return LS_OK;
        }
    return ls_fail(err, LS_E_USAGE, "%s '%s': expected portable, tc or fast", what, v);
}

ls_status ls_run_parse_perturb(const char *spec, int *layer, ls_perturb_op *op, int *twin, ls_error *err)
{
    char opname[32];
    int l, used = 0;
    if (sscanf(spec, "layer=%d,op=%31[a-z_]%n", &l, opname, &used) != 2 || l < 0 ||
        (spec[used] != '\0' && strcmp(spec + used, ",twin=fast")))
        return ls_fail(err, LS_E_USAGE, "perturb (--perturb) '%s': expected layer=L,op=OP[,twin=fast]", spec);
    for (int i = 1; i < LS_PERTURB_COUNT; i++)
        if (strcmp(opname, ls_perturb_op_name((ls_perturb_op)i)) == 0) {
            *layer = l;
            *op = (ls_perturb_op)i;
            *twin = spec[used] != '\0';
            return LS_OK;
        }
    return ls_fail(err, LS_E_USAGE, "perturb (--perturb): unknown op '%s' (gdn, conv, attention, "
                   "router, experts, combine, norm, lm_head)", opname);
}

/* ls_run_backend_create with the arena shared by `share` processes on the
 * device (ranks of one run on one GPU: each takes its part of the free
 * memory). */
static ls_status backend_create_shared(const char *name, int threads, int gpu, int share, ls_tier tier,
                                       ls_backend **out, ls_error *err)
{
    *out = NULL;
    if (name && !strcmp(name, "cpu")) {
        if (gpu != 0)
            return ls_fail(err, LS_E_USAGE, "gpu (--gpu) %d applies to the cuda backend only "
                           "(backend (--backend) is cpu)", gpu);
        return ls_backend_cpu_create(threads > 0 ? threads : 1, out, err);
    }
    if (!name || strcmp(name, "cuda"))
        return ls_fail(err, LS_E_USAGE, "backend (--backend) '%s': expected cpu or cuda",
                       name ? name : "(none)");
    ls_backend_cuda_opts co;
    ls_backend_cuda_opts_default(&co);
    co.device = gpu;
    co.arena_share = share;
    co.tier = tier;
    co.tc_rows = LS_RUN_TC_ROWS;
    co.synthetic_weights_exact = 1; /* a synthetic model's matrices: lockstep synth's values */
    ls_error inner;
    ls_error_clear(&inner);
    ls_status st = ls_backend_cuda_create_opts(&co, out, &inner);
    /* a device this machine lacks and a GPU too small speak for themselves */
    if (st == LS_E_USAGE || st == LS_E_NOMEM) return ls_fail(err, st, "%s", inner.msg);
    if (st != LS_OK)
        return ls_fail(err, LS_E_UNSUPPORTED, "backend (--backend) cuda is not available: %s",
                       inner.msg);
    return LS_OK;
}

ls_status ls_run_backend_create(const char *name, int threads, int gpu, ls_backend **out,
                                ls_error *err)
{
    return backend_create_shared(name, threads, gpu, 1, LS_TIER_PORTABLE, out, err);
}

static ls_status engine_open_shared(const ls_model *m, const char *backend, int threads, int gpu, int share,
                                    ls_tier tier, const ls_engine_opts *o, long max_seqs, long max_len,
                                    ls_engine **out, ls_error *err)
{
    ls_backend *be;
    *out = NULL;
    LS_TRY(backend_create_shared(backend, threads, gpu, share, tier, &be, err));
    return ls_engine_create(m, be, o, max_seqs, max_len, out, err);
}

ls_status ls_run_engine_open_gpu(const ls_model *m, const char *backend, int threads, int gpu,
                                 const ls_engine_opts *o, long max_seqs, long max_len,
                                 ls_engine **out, ls_error *err)
{
    return engine_open_shared(m, backend, threads, gpu, 1, LS_TIER_PORTABLE, o, max_seqs, max_len, out, err);
}

ls_status ls_run_engine_open_tier(const ls_model *m, const char *backend, int threads, int gpu, ls_tier tier,
                                  const ls_engine_opts *o, long max_seqs, long max_len, ls_engine **out,
                                  ls_error *err)
{
    *out = NULL;
    LS_TRY(tier_refusals(tier, backend, o->max_rows, m, NULL, err)); /* as ls_run_execute refuses them */
    return engine_open_shared(m, backend, threads, gpu, 1, tier, o, max_seqs, max_len, out, err);
}

ls_status ls_run_engine_open(const ls_model *m, const char *backend, int threads,
                             const ls_engine_opts *o, long max_seqs, long max_len, ls_engine **out,
                             ls_error *err)
{
    return ls_run_engine_open_gpu(m, backend, threads, 0, o, max_seqs, max_len, out, err);
}

/* Device memory of the backend that runs the probe: its buffers (well
 * under a megabyte) and the MoE and digest scratch. */
#define PROBE_ARENA_BYTES ((size_t)256 << 20)

ls_status ls_run_manifest_facts(const char *backend, int gpu, ls_manifest_opts *mo,
                                ls_run_facts *facts, ls_error *err)
{
    memset(facts, 0, sizeof *facts);
    size_t n = 0;
    const ls_provider *rows = ls_backend_list_providers(backend, &n);
    if (!rows)
        return ls_fail(err, LS_E_USAGE, "backend (--backend) '%s': expected cpu or cuda", backend);
    if (!strcmp(backend, "cpu") && gpu != 0)
        return ls_fail(err, LS_E_USAGE, "gpu (--gpu) %d applies to the cuda backend only (backend "
                       "(--backend) is cpu)", gpu);
    /* device 0 is the default: a host without one pins runtime.gpu null, as
     * before; another device is a choice, and must exist */
    if (gpu != 0) LS_TRY(ls_backend_cuda_check_device(gpu, err));
    int present = 0;
    LS_TRY(ls_backend_cuda_query_gpu(gpu, &facts->gpu, &present, err));
    mo->backend = backend;
    mo->providers = rows;
    mo->n_providers = n;
    if (mo->fp8 && strcmp(mo->fp8, "dequant") && strcmp(mo->fp8, "w8a8"))
        return ls_fail(err, LS_E_USAGE, "fp8 (--fp8) '%s': expected dequant or w8a8", mo->fp8);
    const char *fp8 = mo->fp8 ? mo->fp8 : "dequant";
    mo->fp8_providers = ls_backend_list_fp8_providers(backend, fp8, &mo->n_fp8_providers);
    mo->gpu = present ? &facts->gpu : NULL;

    /* The probe: the perturbed operator runs reversed, as in the engine. A
     * manifest records any perturbation spec as given; one that is not the
     * engine's layer=L,op=OP reverses no operator the probe can run. */
    ls_probe_opts po = {backend, fp8, NULL, mo->gdn_chunked != NULL};
    if (mo->perturbation) {
        int layer, twin;
        ls_perturb_op op;
        ls_error ignored;
        /* a fast twin is no order the probe runs: the rows keep their fingerprints */
        if (ls_run_parse_perturb(mo->perturbation, &layer, &op, &twin, &ignored) == LS_OK && !twin)
            po.perturb_op = ls_perturb_op_name(op);
    }
    ls_backend *be = NULL;
    if (!strcmp(backend, "cuda")) {
        ls_error inner;
        ls_error_clear(&inner);
        ls_backend_cuda_opts co;
        ls_backend_cuda_opts_default(&co);
        co.arena_bytes = PROBE_ARENA_BYTES;
        co.device = gpu;
        co.synchronous_digests = 1; /* one digest per probe: no ring, no hashing threads */
        ls_status st = ls_backend_cuda_create_opts(&co, &be, &inner);
        if (st != LS_OK)
            return ls_fail(err, st == LS_E_NOMEM ? st : LS_E_UNSUPPORTED,
                           "backend (--backend) cuda is not available: %s", inner.msg);
    } else {
        LS_TRY(ls_backend_cpu_create(mo->threads > 0 ? mo->threads : 1, &be, err));
    }
    ls_status st = ls_probe_run(be, &po, &facts->probe, err);
    be->destroy(be);
    LS_TRY(st);
    ls_log_verbose("reduction fingerprints: %zu operators probed on %s in %.1f ms",
                   facts->probe.count, backend, facts->probe.seconds * 1e3);
    mo->reduction_fingerprints = facts->probe.rows;
    mo->n_reduction_fingerprints = facts->probe.count;
    return LS_OK;
}

/* ---- the run ------------------------------------------------------------------------ */

typedef struct sink_ctx {
    ls_trace_writer *w;
    ls_progress prog;
    uint64_t records;
} sink_ctx;

static ls_status write_frame(void *ctx, ls_frame_kind kind, const ls_trace_record *recs, long n,
                             ls_error *err)
{
    sink_ctx *c = ctx;
    LS_TRY(ls_trace_writer_begin_frame(c->w, kind, err));
    for (long i = 0; i < n; i++) LS_TRY(ls_trace_writer_add(c->w, &recs[i], err));
    LS_TRY(ls_trace_writer_end_frame(c->w, err));
    c->records += (uint64_t)n;
    ls_progress_add(&c->prog, (uint64_t)n);
    return LS_OK;
}

/* fp8: the FP8 mode of a run on an FP8 checkpoint, recorded (the key is
 * absent for other checkpoints, whose run_params stay as they were). */
static json_t *run_params(const ls_run_spec *s, const ls_sequence *seqs, long n, const char *fp8)
{
    json_t *batch = json_array();
    for (long i = 0; i < n; i++) {
        long pl = strcmp(s->mode, "rollout") == 0 ? seqs[i].n_tokens : seqs[i].prompt_len;
        json_array_append_new(batch, json_pack("{s:I, s:I, s:I}", "id", (json_int_t)seqs[i].id, "prompt_len",
                                               (json_int_t)pl, "n_tokens", (json_int_t)seqs[i].n_tokens));
    }
    json_t *samp = s->sampling.kind == LS_SAMPLING_GREEDY
                       ? json_pack("{s:s}", "kind", "greedy")
                       : json_pack("{s:s, s:I, s:f, s:I, s:f}", "kind", "seeded", "seed",
                                   (json_int_t)s->sampling.seed, "temperature",
                                   (double)s->sampling.temperature, "top_k", (json_int_t)s->sampling.top_k,
                                   "top_p", (double)s->sampling.top_p);
    int rollout = strcmp(s->mode, "rollout") == 0;
    json_t *p = json_pack("{s:s, s:o, s:o, s:o, s:s, s:o, s:s, s:s, s:o, s:I, s:I}", "mode", s->mode, "sampling",
                     samp, "max_new_tokens", rollout ? json_integer(s->max_new) : json_null(), "chunk",
                     rollout ? json_null() : s->chunk > 0 ? json_integer(s->chunk) : json_string("whole"),
                     "batch_order", s->reverse_batch ? "reversed" : "as-given", "batch", batch,
                     "activations", s->act_bf16 ? "bf16" : "fp32", "backend", s->backend,
                     "perturbation", s->perturb ? json_string(s->perturb) : json_null(),
                     "state_digest_every", (json_int_t)s->state_digest_every, "max_rows",
                     (json_int_t)s->max_rows);
    if (p && fp8) json_object_set_new(p, "fp8", json_string(fp8));
    /* absent = a contiguous cache, so traces of unpaged runs keep their bytes */
    if (p && s->kv_page > 0) json_object_set_new(p, "kv_page", json_integer(s->kv_page));
    /* absent = the recurrent form, so other traces keep their bytes */
    if (p && s->gdn_chunked) json_object_set_new(p, "gdn_form", json_string(LS_MANIFEST_GDN_CHUNKED));
    /* absent = the portable tier, likewise */
    if (p && s->tier != LS_TIER_PORTABLE) json_object_set_new(p, "tier", json_string(ls_run_tier_name(s->tier)));
    /* absent = one rank, so one-rank traces keep their bytes (docs/parallel.md §4) */
    if (p && ls_run_spec_world(s) > 1) {
        int afd = s->afd_attention > 0;
        json_object_set_new(p, "topology", json_pack("{s:i, s:i, s:o, s:s}", "tp", afd || s->tp < 1 ? 1 : s->tp,
                                                     "ep", afd || s->ep < 1 ? 1 : s->ep, "afd",
                                                     afd ? json_pack("[i, i]", s->afd_attention, s->afd_ffn)
                                                         : json_null(),
                                                     "communicator", "cpu-socket"));
    }
    /* engine behaviours that change no bit (run/drive.h), recorded when used:
     * absent means 1 sample, prefix cache off, no preemption */
    ls_rollout_opts go;
    int preempt_on;
    uint64_t preempt_seed;
    ls_error ignored;
    if (p && ls_run_spec_group(s, &go, &preempt_on, &preempt_seed, &ignored) == LS_OK) {
        if (go.samples_per_prompt > 1)
            json_object_set_new(p, "samples_per_prompt", json_integer(go.samples_per_prompt));
        if (go.prefix_cache == LS_PREFIX_CACHE_ALIGNED)
            json_object_set_new(p, "prefix_cache", json_pack("{s:s, s:I}", "policy", "aligned", "block",
                                                             (json_int_t)go.prefix_block));
        else if (go.prefix_cache == LS_PREFIX_CACHE_ANY)
            json_object_set_new(p, "prefix_cache", json_pack("{s:s}", "policy", "any"));
        if (preempt_on)
            json_object_set_new(p, "preemption", json_pack("{s:s, s:I}", "policy", "seeded", "seed",
                                                           (json_int_t)preempt_seed));
    }
    return p;
}

static ls_status parse_dump_layers(const char *spec, long L, unsigned char *mask, ls_error *err)
{
    const char *p = spec;
    while (*p) {
        char *end;
        errno = 0;
        long l = strtol(p, &end, 10);
        if (errno || end == p || l < 0 || l >= L || (*end && *end != ','))
            return ls_fail(err, LS_E_USAGE, "--dump-layers '%s': expected decoder layers in 0..%ld, "
                           "comma-separated", spec, L - 1);
        mask[l] = 1;
        p = *end ? end + 1 : end;
    }
    return LS_OK;
}

/* ---- execution -------------------------------------------------------------------------- */

/* The checkpoint is hashed on a worker thread (all cores) while the backend
 * takes the weights (a GPU upload, or the CPU's first touch of the mapping). */
typedef struct hash_job {
    const ls_checkpoint *ck;
    ls_run_hash_cache cache;
    int progress;
    ls_fingerprint fp;
    ls_error err;
    ls_status st;
} hash_job;

static void *hash_main(void *arg)
{
    hash_job *j = arg;
    j->st = ls_run_fingerprint(j->ck, j->cache, j->progress, &j->fp, &j->err);
    return NULL;
}

ls_status ls_run_parse_hash_cache(const char *s, ls_run_hash_cache *out, ls_error *err)
{
    static const char *const names[] = {"use", "off", "refresh"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, names[i])) {
            *out = (ls_run_hash_cache)i;
            return LS_OK;
        }
    return ls_fail(err, LS_E_USAGE, "hash_cache (--checkpoint-cache) '%s': expected use, off or "
                   "refresh", s);
}

ls_status ls_run_fingerprint(const ls_checkpoint *ck, ls_run_hash_cache cache, int progress,
                             ls_fingerprint *out, ls_error *err)
{
    ls_fingerprint_opts fo = {0, progress};
    char *dir = cache == LS_RUN_CACHE_OFF ? NULL : ls_fingerprint_default_cache_dir();
    ls_fingerprint_cache_opts co = {dir, cache == LS_RUN_CACHE_REFRESH};
    ls_status st = ls_fingerprint_checkpoint_cached(ck, &fo, &co, out, err);
    free(dir);
    return st;
}

/* What the trace header says was verified of the checkpoint: the bytes
 * hashed, and the bytes whose digests came from the cache (files whose
 * identity -- device, inode, size, mtime, ctime -- is unchanged since
 * lockstep hashed them; not a fresh read). */
static json_t *verification_json(const ls_fingerprint *fp, int hashed_here)
{
    return json_pack("{s:I, s:I, s:I, s:I, s:s}", "tensors", (json_int_t)fp->count, "bytes",
                     (json_int_t)fp->total_bytes, "bytes_hashed", (json_int_t)fp->bytes_hashed,
                     "bytes_from_cache", (json_int_t)fp->bytes_cached, "by",
                     hashed_here ? "this run" : "the caller, once for all its runs");
}

void ls_run_trace_header(const ls_engine *e, const char *mode, const char *backend,
                         const char *model_fingerprint, const char *manifest_digest,
                         const char *run_params_json, long state_digest_every, int act_bf16,
                         ls_trace_header *h, char engine_name[64])
{
    snprintf(engine_name, 64, "lockstep-%s", backend);
    int nl;
    const ls_trace_layer *layers = ls_engine_layers(e, &nl);
    memset(h, 0, sizeof *h);
    h->mode = mode;
    h->engine = engine_name;
    h->model_fingerprint = model_fingerprint;
    h->manifest_digest = manifest_digest;
    h->run_params_json = run_params_json;
    h->topk = 5;
    h->digest_kinds_mask = (1u << LS_DIGEST_COUNT) - 1;
    h->state_digest_every = (uint32_t)state_digest_every;
    h->n_layers = nl;
    h->layers = layers;
    h->activation_dtype = act_bf16 ? "bf16" : "fp32";
}

/* A replay must run on the checkpoint its sequences were made with: tokens
 * of another model replayed here would only fail later, in compare, as a
 * model mismatch (or, worse, be compared with --allow-different-model). */
static ls_status check_expected_root(const ls_run_spec *s, const ls_fingerprint *fp, ls_error *err)
{
    if (!s->expect_merkle_root) return LS_OK;
    char root[65];
    ls_digest_to_hex(&fp->merkle_root, root);
    if (!strcmp(root, s->expect_merkle_root)) return LS_OK;
    if (s->expect_source)
        return ls_fail(err, LS_E_INPUT, "%s: model_fingerprint %s (the rollout's checkpoint) differs from "
                       "the Merkle root %s of %s: a replay must run on the rollout's checkpoint",
                       s->expect_source, s->expect_merkle_root, root, s->checkpoint);
    return ls_fail(err, LS_E_INPUT, "expect_merkle_root %s differs from the Merkle root %s of %s: a "
                   "replay must run on the checkpoint its sequences were made with",
                   s->expect_merkle_root, root, s->checkpoint);
}

/* ---- the workers of a run with several ranks (run/ranks.h) ------------------------------ */

/* What every rank must agree on before the first step (docs/parallel.md §1,
 * start-up checks): the SHA-256 of the spec's fields that decide the steps
 * (mode, budget, chunk, sampling, dtypes, rows, cadence, serving, FP8,
 * perturbation, ranks, every sequence's tokens) and of the checkpoint's
 * config.json. Ranks a launcher started parse their own command lines, so
 * one given other options would otherwise run other steps. */
static ls_status spec_digest(const ls_run_spec *s, const ls_checkpoint *ck, uint8_t out[32], ls_error *err)
{
    json_t *seqs = json_array();
    for (long i = 0; seqs && i < s->batch->n; i++) {
        const ls_sequence *q = &s->batch->seqs[i];
        json_t *toks = json_array();
        for (long t = 0; toks && t < q->n_tokens; t++) json_array_append_new(toks, json_integer(q->tokens[t]));
        json_array_append_new(seqs, json_pack("{s:I, s:I, s:o}", "id", (json_int_t)q->id, "prompt_len",
                                              (json_int_t)q->prompt_len, "tokens", toks ? toks : json_null()));
    }
    const json_t *cfg = ls_checkpoint_config_json(ck);
    char *cfg_text = cfg ? json_dumps(cfg, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_t *j = json_pack("{s:s, s:I, s:I, s:i, s:i, s:I, s:f, s:I, s:f, s:i, s:I, s:I, s:I, s:I, s:s?, s:I, s:s?, "
                          "s:s?, s:s?, s:s?, s:i, s:i, s:i, s:i, s:s?, s:o}",
                          "mode", s->mode, "max_new", (json_int_t)s->max_new, "chunk", (json_int_t)s->chunk,
                          "reverse", s->reverse_batch, "sampling", (int)s->sampling.kind, "seed",
                          (json_int_t)s->sampling.seed, "temperature", (double)s->sampling.temperature, "top_k",
                          (json_int_t)s->sampling.top_k, "top_p", (double)s->sampling.top_p, "bf16", s->act_bf16,
                          "every", (json_int_t)s->state_digest_every, "rows", (json_int_t)s->max_rows, "kv_page",
                          (json_int_t)s->kv_page, "samples", (json_int_t)s->samples_per_prompt, "prefix",
                          s->prefix_cache, "prefix_block", (json_int_t)s->prefix_block, "preempt", s->preempt,
                          "perturb", s->perturb, "dump", s->dump_layers, "fp8", s->fp8, "ep", s->ep, "tp", s->tp,
                          "afd", s->afd_attention * 1000 + s->afd_ffn, "gdn", s->gdn_chunked, "config", cfg_text, "seqs",
                          seqs ? seqs : json_null());
    free(cfg_text);
    char *text = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    if (!text) return ls_fail(err, LS_E_NOMEM, "out of memory");
    ls_digest d;
    ls_status st = ls_sha256_buf(text, strlen(text), &d, err);
    free(text);
    if (st == LS_OK) memcpy(out, d.bytes, 32);
    return st;
}

/* The build a rank runs, for the start-up checks: SHA-256 of lockstep's
 * version and source revision and of the code digests (src/code/code.h) of
 * every function and kernel of the run's backend, so two ranks agree only
 * when they run the same machine code for it. */
static ls_status build_digest(const char *backend, uint8_t out[32], ls_error *err)
{
    ls_sha256 h;
    LS_TRY(ls_sha256_init(&h, err));
    ls_status st = ls_sha256_update(&h, LS_VERSION, sizeof LS_VERSION, err);
    if (st == LS_OK) st = ls_sha256_update(&h, LS_SOURCE_REVISION, sizeof LS_SOURCE_REVISION, err);
    size_t n = 0;
    const ls_code_entry *rows = ls_code_list(&n);
    for (size_t i = 0; st == LS_OK && i < n; i++) {
        if (strcmp(rows[i].backend, backend)) continue;
        const char *parts[3] = {rows[i].name, rows[i].sha256 ? rows[i].sha256 : "",
                                rows[i].ptx_sha256 ? rows[i].ptx_sha256 : ""};
        for (int p = 0; st == LS_OK && p < 3; p++) st = ls_sha256_update(&h, parts[p], strlen(parts[p]) + 1, err);
    }
    ls_digest d;
    if (st == LS_OK) st = ls_sha256_final(&h, &d, err);
    else ls_sha256_discard(&h);
    if (st == LS_OK) memcpy(out, d.bytes, 32);
    return st;
}

/* Every rank's spec digest, build digest and (fp non-NULL: ranks a launcher
 * started, each reading its own copy of the checkpoint) weights' Merkle root
 * against rank 0's: one all-gather of exact bytes, and every rank fails
 * naming the first rank that differs and in what. */
static ls_status check_ranks_agree(const ls_run_spec *s, const ls_checkpoint *ck, const ls_fingerprint *fp,
                                   ls_run_ranks *rk, ls_error *err)
{
    enum { PART = 32, ROW = 3 * PART };
    uint8_t mine[ROW] = {0}, *all = malloc(ROW * (size_t)rk->size);
    if (!all) return ls_fail(err, LS_E_NOMEM, "out of memory");
    ls_status st = spec_digest(s, ck, mine, err);
    if (st == LS_OK) st = build_digest(s->backend, mine + PART, err);
    if (st == LS_OK && fp) memcpy(mine + 2 * PART, fp->merkle_root.bytes, PART);
    if (st == LS_OK) st = ls_comm_all_gather(rk->comm, mine, ROW, all, err);
    for (int r = 1; st == LS_OK && r < rk->size; r++) {
        const uint8_t *row = all + ROW * (size_t)r;
        if (memcmp(all, row, PART) != 0)
            st = ls_fail(err, LS_E_USAGE, "rank %d: its run options, sequences or checkpoint config.json differ "
                         "from rank 0's (every rank must be started with the same command line and files)", r);
        else if (memcmp(all + PART, row + PART, PART) != 0)
            st = ls_fail(err, LS_E_USAGE, "rank %d: it runs another build of lockstep than rank 0 (another "
                         "version, source revision or machine code of the %s backend; rank 0 runs %s, "
                         "revision %s): every rank must run the same build", r, s->backend, LS_VERSION,
                         LS_SOURCE_REVISION);
        else if (memcmp(all + 2 * PART, row + 2 * PART, PART) != 0) {
            char h0[65], hr[65];
            ls_digest d0, dr;
            memcpy(d0.bytes, all + 2 * PART, PART);
            memcpy(dr.bytes, row + 2 * PART, PART);
            ls_digest_to_hex(&d0, h0);
            ls_digest_to_hex(&dr, hr);
            st = ls_fail(err, LS_E_INPUT, "rank %d: the weights of its checkpoint differ from rank 0's (Merkle "
                         "root %.16s... where rank 0 has %.16s...; `lockstep fingerprint` on each copy says "
                         "which tensor): every rank must read the same checkpoint", r, hr, h0);
        }
    }
    free(all);
    return st;
}

/* The CUDA device of one rank and how many ranks share it (docs/parallel.md
 * §1). Self-launched: rank r runs on device gpu + r when the machine has
 * devices gpu .. gpu + W - 1, else every rank runs on gpu, each with 1/W of
 * its free memory. Started by a launcher: local rank l on device gpu + l,
 * which must exist (one rank per device). cpu, or one rank: gpu alone. It
 * asks the CUDA runtime for the devices, so it runs after the fork, in
 * every rank. */
typedef struct rank_device {
    int gpu;                       /* the CUDA ordinal this rank runs on */
    int share;                     /* ranks of this run on it (>= 1) */
} rank_device;

static ls_status rank_device_pick(const ls_run_spec *s, const ls_run_ranks *rk, rank_device *d, ls_error *err)
{
    d->gpu = s->gpu;
    d->share = 1;
    if (!rk->size || strcmp(s->backend, "cuda")) return LS_OK;
    int count = ls_backend_cuda_device_count();
    if (rk->launched) {
        d->gpu = s->gpu + rk->local_rank;
        if (d->gpu >= count)
            return ls_fail(err, LS_E_USAGE, "rank %d: local rank %d runs on CUDA device %d (gpu (--gpu) %d + "
                           "its local rank) and this machine has %d: a launcher's ranks run one per device",
                           rk->rank, rk->local_rank, d->gpu, s->gpu, count);
    } else if (s->gpu + rk->size <= count) {
        d->gpu = s->gpu + rk->rank;
    } else {
        d->share = rk->size;
    }
    return LS_OK;
}

typedef struct worker_sink {
    int rank;
    long steps;
} worker_sink;

/* A worker writes nothing: it counts its steps (for the planted faults of
 * the tests) and drops the records, which are rank 0's to write. */
static ls_status worker_frame(void *ctx, ls_frame_kind kind, const ls_trace_record *recs, long n, ls_error *err)
{
    (void)kind, (void)recs, (void)n, (void)err;
    worker_sink *w = ctx;
    ls_run_ranks_test_fault(w->rank, ++w->steps);
    return LS_OK;
}

/* Rank r > 0: the same engine steps as rank 0 on its share of the weights,
 * every exchange through its endpoints (the world's, and its TP group's
 * under TP x EP); ends the process. */
static void run_worker(const ls_run_spec *s, const ls_model *m, const ls_engine_opts *eo, const ls_rollout_opts *go,
                       int grouped, long max_len, ls_run_ranks *rk, ls_comm *tp_group)
{
    ls_error err;
    ls_error_clear(&err);
    const ls_run_batch *b = s->batch;
    int rollout = strcmp(s->mode, "rollout") == 0;
    long n_trace = b->n * go->samples_per_prompt;
    ls_engine *e = NULL;
    ls_sequence *seqs = malloc(sizeof *seqs * (size_t)b->n);
    int32_t *completions = rollout ? malloc(sizeof(int32_t) * (size_t)(n_trace * s->max_new)) : NULL;
    worker_sink w = {rk->rank, 0};
    ls_status st = !seqs || (rollout && !completions) ? ls_fail(&err, LS_E_NOMEM, "out of memory") : LS_OK;
    for (long i = 0; st == LS_OK && i < b->n; i++) seqs[i] = b->seqs[s->reverse_batch ? b->n - 1 - i : i];
    rank_device dev;
    if (st == LS_OK) st = rank_device_pick(s, rk, &dev, &err);
    if (st == LS_OK)
        st = engine_open_shared(m, s->backend, s->threads, dev.gpu, dev.share, s->tier, eo,
                                grouped ? ls_run_group_slots(b->n, go) : b->n, max_len, &e, &err);
    if (st == LS_OK) {
        if (rollout && grouped)
            st = ls_run_rollout_group(e, seqs, b->n, s->max_new, &s->sampling, go, completions, worker_frame, &w,
                                      &err);
        else if (rollout)
            st = ls_run_rollout(e, seqs, b->n, s->max_new, &s->sampling, completions, worker_frame, &w, &err);
        else
            st = ls_run_replay(e, seqs, b->n, s->chunk > 0 ? s->chunk : max_len, worker_frame, &w, &err);
    }
    if (st == LS_OK && s->afd_balance) {
        ls_afd_balance bal; /* the FFN rank sends its times to rank 0 */
        st = ls_engine_afd_balance(e, &bal, &err);
    }
    ls_engine_destroy(e);
    free(seqs);
    free(completions);
    if (st != LS_OK && tp_group) ls_comm_abort(tp_group, "rank %d failed: %s", rk->rank, err.msg);
    ls_comm_destroy(tp_group);
    ls_run_ranks_worker_exit(rk, st, &err);
}

/* Rank 0's end of a run with several ranks (a no-op with one): its TP
 * group's endpoint first (aborted on a failure, so that a worker waiting in
 * it hears why at once), then the world's (ls_run_ranks_finish). */
static ls_status ranks_finish(ls_run_ranks *rk, ls_comm **tp_group, ls_status st, ls_error *err)
{
    if (*tp_group && st != LS_OK) ls_comm_abort(*tp_group, "rank 0 failed: %s", err->msg);
    ls_comm_destroy(*tp_group);
    *tp_group = NULL;
    return rk->size ? ls_run_ranks_finish(rk, st, err) : st;
}

/* The attention-FFN balance report (--afd-balance; docs/parallel.md §3.2):
 * per decoder layer the attention rank's and each FFN rank's busy and
 * waiting seconds, and the totals by kind of work, as JSON into `out`
 * (opened before the run), committed or aborted. Wall-clock times: they
 * differ from run to run. */
static ls_status write_afd_balance(const ls_run_spec *s, const ls_model *m, const ls_afd_balance *b,
                                   ls_outfile *out, ls_error *err)
{
    long L = b->n_layers;
    int F = b->n_ffn;
    json_t *layers = json_array(), *fbusy = json_array(), *fwait = json_array(), *fidle = json_array();
    double gdn = 0, attn = 0, experts = 0, attn_wait = 0;
    for (long l = 0; layers && l < L; l++) {
        int is_attn = m->cfg.is_attention[l];
        *(is_attn ? &attn : &gdn) += b->attn_busy_s[l];
        attn_wait += b->attn_wait_s[l];
        json_t *busy = json_array(), *wait = json_array();
        double slowest = 0; /* the FFN group answers when its slowest rank is done */
        for (int f = 0; f < F; f++) {
            double x = b->ffn_busy_s[f * L + l];
            if (x > slowest) slowest = x;
            json_array_append_new(busy, json_real(x));
            json_array_append_new(wait, json_real(b->ffn_wait_s[f * L + l]));
        }
        experts += slowest;
        json_array_append_new(layers, json_pack("{s:I, s:s, s:f, s:f, s:o, s:o}", "layer", (json_int_t)l, "mixer",
                                                is_attn ? "attention" : "gdn", "attention_rank_busy_s",
                                                b->attn_busy_s[l], "attention_rank_wait_s", b->attn_wait_s[l],
                                                "ffn_ranks_busy_s", busy, "ffn_ranks_wait_s", wait));
    }
    double max_ffn_idle = 0;
    for (int f = 0; fbusy && f < F; f++) {
        double busy = 0, wait = 0;
        for (long l = 0; l < L; l++) busy += b->ffn_busy_s[f * L + l], wait += b->ffn_wait_s[f * L + l];
        double idle = busy + wait > 0 ? wait / (busy + wait) : 0;
        if (idle > max_ffn_idle) max_ffn_idle = idle;
        json_array_append_new(fbusy, json_real(busy));
        json_array_append_new(fwait, json_real(wait));
        json_array_append_new(fidle, json_real(idle));
    }
    double attn_all = gdn + attn + attn_wait + b->attn_head_s;
    double attn_idle = attn_all > 0 ? attn_wait / attn_all : 0;
    json_t *root = NULL;
    if (layers && fbusy && fwait && fidle)
        root = json_pack("{s:s, s:s, s:{s:i, s:i}, s:I, s:I, s:o, s:{s:f, s:f, s:f, s:f, s:f, s:f, s:O, s:O, s:O}}",
                         "mode", s->mode, "backend", s->backend ? s->backend : "cpu", "topology",
                         "attention_ranks", s->afd_attention, "ffn_ranks", F, "steps", (json_int_t)b->steps,
                         "rows", (json_int_t)b->rows, "layers", layers, "totals", "gdn_mixers_s", gdn,
                         "attention_mixers_s", attn, "experts_s", experts, "attention_rank_head_s",
                         b->attn_head_s, "attention_rank_wait_s", attn_wait, "attention_rank_idle_fraction",
                         attn_idle, "ffn_ranks_busy_s", fbusy, "ffn_ranks_wait_s", fwait,
                         "ffn_ranks_idle_fraction", fidle);
    else
        json_decref(layers);
    json_decref(fbusy), json_decref(fwait), json_decref(fidle); /* root holds its own references (O) */
    char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(6)) : NULL;
    json_decref(root);
    size_t n = text ? strlen(text) : 0;
    if (text) text[n] = '\n'; /* json_dumps' terminator becomes the last newline */
    ls_status st = text ? ls_outfile_write(out, text, n + 1, err)
                        : ls_fail(err, LS_E_NOMEM, "%s: out of memory for the balance report", s->afd_balance);
    free(text);
    if (st != LS_OK) {
        ls_outfile_abort(out);
        return st;
    }
    LS_TRY(ls_outfile_commit(out, err));
    ls_log_info("afd balance: mixers %.3f s (GDN %.3f, attention %.3f), experts %.3f s (the slowest FFN rank per "
                "layer); waiting: attention rank %.0f %%, FFN ranks up to %.0f %% of their time (per layer: %s)",
                gdn + attn, gdn, attn, experts, 100 * attn_idle, 100 * max_ffn_idle, s->afd_balance);
    return LS_OK;
}

/* The shapes a topology must divide, checked before any rank starts (each
 * would refuse). */
ls_status ls_run_topology_check(const ls_run_spec *s, const ls_model *m, ls_error *err)
{
    int world = ls_run_spec_world(s);
    char flags[64];
    topology_flags(s, flags, sizeof flags);
    /* the experts are split over the world with ep > 1 (docs/parallel.md
     * §3.4); over the TP group with tp alone, checked below with the other
     * shapes tp must divide */
    if (s->ep > 1 && m->cfg.n_experts % world != 0) {
        if (s->tp > 1)
            return ls_fail(err, LS_E_USAGE, "%s: %d ranks do not divide num_experts %ld of %s/config.json: each "
                           "rank owns an equal block of experts", flags, world, (long)m->cfg.n_experts,
                           s->checkpoint);
        return ls_fail(err, LS_E_USAGE, "ep (--ep) %d does not divide num_experts %ld of %s/config.json: each "
                       "rank owns an equal block of experts", s->ep, (long)m->cfg.n_experts, s->checkpoint);
    }
    /* AFD A:F: the experts split over the F FFN ranks, the mixers over the A
     * attention ranks (their MoE is remote: experts need not divide) */
    if (s->afd_ffn > 1 && m->cfg.n_experts % s->afd_ffn != 0)
        return ls_fail(err, LS_E_USAGE, "afd (--afd) %d:%d: %d FFN ranks do not divide num_experts %ld of "
                       "%s/config.json: each FFN rank owns an equal block of experts", s->afd_attention,
                       s->afd_ffn, s->afd_ffn, (long)m->cfg.n_experts, s->checkpoint);
    if (s->tp > 1) LS_TRY(ls_engine_check_tp(m, s->tp, s->ep > 1, err));
    ls_error shape;
    ls_error_clear(&shape);
    if (s->afd_attention > 1 && ls_engine_check_tp(m, s->afd_attention, 1, &shape) != LS_OK)
        return ls_fail(err, LS_E_USAGE, "afd (--afd) %d:%d: the %d attention ranks split every mixer by head (as "
                       "--tp %d would): %s", s->afd_attention, s->afd_ffn, s->afd_attention, s->afd_attention,
                       shape.msg);
    return LS_OK;
}

ls_status ls_run_topology_check_checkpoint(const ls_run_spec *s, ls_error *err)
{
    if (ls_run_spec_world(s) <= 1) return LS_OK;
    ls_checkpoint *ck = NULL;
    ls_model *m = NULL;
    ls_status st = ls_run_checkpoint_open(s->checkpoint, &ck, &m, err);
    if (st == LS_OK) st = ls_run_topology_check(s, m, err);
    ls_model_close(m);
    ls_checkpoint_close(ck);
    return st;
}

void ls_run_tc_pins_free(char **records, size_t n)
{
    for (size_t i = 0; records && i < n; i++) free(records[i]);
    free(records);
}

ls_status ls_run_tc_pins(const char *checkpoint, int gpu, char ***records, size_t *n, ls_error *err)
{
    *records = NULL;
    *n = 0;
    ls_checkpoint *ck = NULL;
    ls_model *m = NULL;
    ls_engine *e = NULL;
    ls_status st = ls_run_checkpoint_open(checkpoint, &ck, &m, err);
    ls_engine_opts eo;
    ls_engine_opts_default(&eo);
    if (st == LS_OK) st = tier_refusals(LS_TIER_TC, "cuda", eo.max_rows, m, checkpoint, err);
    if (st == LS_OK) st = engine_open_shared(m, "cuda", 1, gpu, 1, LS_TIER_TC, &eo, 1, 1, &e, err);
    const char *const *recs = NULL;
    if (st == LS_OK) ls_backend_cuda_tc_pins(ls_engine_backend(e), &recs, n);
    if (st == LS_OK && *n > 0 && !(*records = calloc(*n, sizeof **records)))
        st = ls_fail(err, LS_E_NOMEM, "out of memory");
    for (size_t i = 0; st == LS_OK && i < *n; i++)
        if (!((*records)[i] = strdup(recs[i]))) st = ls_fail(err, LS_E_NOMEM, "out of memory");
    if (st != LS_OK) {
        ls_run_tc_pins_free(*records, *n);
        *records = NULL;
        *n = 0;
    }
    ls_engine_destroy(e);
    ls_model_close(m);
    ls_checkpoint_close(ck);
    return st;
}

ls_status ls_run_execute(const ls_run_spec *s, ls_run_result *res, ls_error *err)
{
    memset(res, 0, sizeof *res);
    LS_TRY(ls_run_spec_validate(s, err));
    int rollout = strcmp(s->mode, "rollout") == 0;
    const ls_run_batch *b = s->batch;
    ls_checkpoint *ck = NULL;
    ls_model *m = NULL;
    json_t *man = NULL, *params = NULL;
    ls_engine *e = NULL;
    ls_sequence *seqs = NULL;
    unsigned char *dump = NULL;
    char *params_text = NULL;
    hash_job hj;
    memset(&hj, 0, sizeof hj);
    pthread_t hasher;
    int hashing = 0, hashed = 0; /* hashed: fingerprinted before the ranks started */
    sink_ctx sc;
    memset(&sc, 0, sizeof sc);
    ls_afd_balance balance; /* --afd-balance: rank 0's gathered times, and their file */
    memset(&balance, 0, sizeof balance);
    ls_outfile balance_out;
    int balance_open = 0;
    ls_engine_opts eo;
    ls_engine_opts_default(&eo);
    eo.act_bf16 = s->act_bf16;
    eo.max_rows = s->max_rows;
    eo.state_digest_every = s->state_digest_every;
    eo.kv_page = s->kv_page;
    eo.gdn_chunked = s->gdn_chunked;
    /* GRPO, prefix reuse and preemption (run/drive.h); a plain run keeps ls_run_rollout */
    ls_rollout_opts go;
    int preempt_on = 0;
    uint64_t preempt_seed = 0;
    ls_run_eviction *plan = NULL;
    ls_sequence *expanded = NULL;  /* [b->n * N] the trace's sequences */
    ls_rollout_stats gstats;
    memset(&gstats, 0, sizeof gstats);
    ls_status st = ls_run_spec_group(s, &go, &preempt_on, &preempt_seed, err);
    long N = go.samples_per_prompt, n_trace = b->n * N;
    int grouped = rollout && (N > 1 || go.prefix_cache != LS_PREFIX_CACHE_OFF || preempt_on);
    if (st == LS_OK && preempt_on) {
        long n_plan = 0;
        st = ls_run_preempt_plan(preempt_seed, n_trace, s->max_new, &plan, &n_plan, err);
        go.evictions = plan;
        go.n_evictions = n_plan;
    }
    go.stats = &gstats;
    if (st == LS_OK && s->perturb)
        st = ls_run_parse_perturb(s->perturb, &eo.perturb_layer, &eo.perturb_op, &eo.perturb_fast, err);
    if (st == LS_OK) st = ls_run_checkpoint_open(s->checkpoint, &ck, &m, err);
    /* the FP8 mode: a choice for FP8 checkpoints only (dequant by default) */
    const char *fp8 = NULL;
    if (st == LS_OK && s->fp8 && !m->cfg.fp8)
        st = ls_fail(err, LS_E_USAGE, "fp8 (--fp8) applies to FP8 checkpoints only: %s/config.json "
                     "has no quantization_config", s->checkpoint);
    if (st == LS_OK && m->cfg.fp8) fp8 = s->fp8 ? s->fp8 : "dequant";
    if (st == LS_OK) st = tier_refusals(s->tier, s->backend, s->max_rows, m, s->checkpoint, err);
    eo.fp8_w8a8 = fp8 && !strcmp(fp8, "w8a8");
    if (st == LS_OK && s->dump_layers) {
        dump = calloc((size_t)m->cfg.n_layers, 1);
        if (!dump) st = ls_fail(err, LS_E_NOMEM, "out of memory");
        else st = parse_dump_layers(s->dump_layers, m->cfg.n_layers, dump, err);
        eo.dump_decoder_layers = dump;
    }
    if (st == LS_OK && s->perturb && eo.perturb_op != LS_PERTURB_LM_HEAD &&
        eo.perturb_layer >= m->cfg.n_layers)
        st = ls_fail(err, LS_E_USAGE, "perturb (--perturb): layer %d is outside 0..%ld",
                     eo.perturb_layer, m->cfg.n_layers - 1);
    long max_len = 1;
    for (long i = 0; st == LS_OK && i < b->n; i++) {
        const ls_sequence *q = &b->seqs[i];
        for (long t = 0; t < q->n_tokens; t++)
            if (q->tokens[t] < 0 || q->tokens[t] >= m->cfg.vocab) {
                st = ls_fail(err, LS_E_INPUT, "sequence %u: token %d at position %ld is outside the "
                             "vocabulary of %s (0..%ld)", q->id, q->tokens[t], t, s->checkpoint,
                             m->cfg.vocab - 1);
                break;
            }
        long need = rollout ? q->n_tokens + s->max_new - 1 : q->n_tokens - 1;
        if (need > max_len) max_len = need;
    }
    /* Several ranks: the workers start here, after the model is open (they
     * share its mapping) and before any thread of this run (run/ranks.h). */
    ls_run_ranks rk;
    memset(&rk, 0, sizeof rk);
    ls_comm *tp_group = NULL; /* TP x EP: this rank's TP group; AFD A:F: this rank's side (the attention or
                                 the FFN ranks); split from the world (owned) */
    int world = ls_run_spec_world(s);
    char flags[64];
    topology_flags(s, flags, sizeof flags);
    if (st == LS_OK) st = ls_run_topology_check(s, m, err);
    if (st == LS_OK && world > 1) {
        /* started by a launcher whose world is these ranks: join it; else
         * start the workers here (an allocation's variables that describe
         * another world, or none, leave the run self-launched) */
        ls_comm_launch la;
        ls_error lerr;
        ls_error_clear(&lerr);
        int launched = ls_comm_launch_read(NULL, NULL, &la, &lerr) == LS_OK && la.found && la.world_size == world;
        if (launched)
            ls_log_verbose("rank %d of %d, started by %s (rendezvous %s:%d)", la.rank, la.world_size, la.source,
                           la.master_addr, la.master_port);
        /* a TP group (or AFD's attention or FFN group) is split from the world by handing
         * Unix socket pairs over the world's connections (ls_comm_split),
         * which the TCP connections of a rendezvous cannot carry */
        int afd_split = s->afd_attention > 1 || s->afd_ffn > 1;
        if (launched && ((s->tp > 1 && s->ep > 1) || afd_split))
            st = ls_fail(err, LS_E_UNSUPPORTED, "%s under a launcher (%s): the %s groups of this world are split "
                         "from a self-launched world only (their connections are Unix socket pairs); run it "
                         "without the launcher's variables, or with %s", flags, la.source,
                         afd_split ? "attention and FFN" : "TP", afd_split ? "--afd 1:1" : "--tp or --ep alone");
        /* CUDA does not survive a fork: the workers start before this
         * process touches CUDA, and every rank creates its own backend */
        if (st == LS_OK && !launched && !strcmp(s->backend, "cuda") && ls_backend_cuda_touched())
            st = ls_fail(err, LS_E_UNSUPPORTED, "%s with backend (--backend) cuda: the ranks are forked before "
                         "the process touches CUDA, and this process already has (an earlier CUDA run in it); "
                         "run each CUDA run of several ranks in a process of its own", flags);
        /* one message, not one per rank, when there is no device at all */
        if (st == LS_OK && !launched && !strcmp(s->backend, "cuda") && ls_run_ranks_cuda_devices() < 1)
            st = ls_fail(err, LS_E_UNSUPPORTED, "%s with backend (--backend) cuda: no CUDA device visible (hint: "
                         "check nvidia-smi and CUDA_VISIBLE_DEVICES)", flags);
        /* ranks a launcher started may each read their own copy of the
         * checkpoint: every rank fingerprints it before the first step
         * (forked ranks share rank 0's, fingerprinted below) */
        if (st == LS_OK && launched && !s->fingerprint) {
            hj.ck = ck;
            hj.cache = s->hash_cache;
            hj.progress = s->progress;
            ls_error_clear(&hj.err);
            hash_main(&hj);
            hashed = 1;
            if (hj.st != LS_OK) {
                *err = hj.err;
                st = hj.st;
            }
        }
        if (st == LS_OK)
            st = launched ? ls_run_ranks_join(&la, s->rank_timeout_ms, &rk, err)
                          : ls_run_ranks_start(world, s->rank_timeout_ms, &rk, err);
        if (st == LS_OK)
            st = check_ranks_agree(s, ck, !launched ? NULL : s->fingerprint ? s->fingerprint : &hj.fp, &rk, err);
        if (st == LS_OK) {
            if (s->afd_attention > 0) {
                eo.afd_comm = rk.comm; /* ranks 0..A-1 attention, A..A+F-1 FFN */
                eo.afd_attention = s->afd_attention;
                /* each side's own group: the attention ranks' splits the
                 * mixers (A > 1), the FFN ranks' the experts (F > 1); a
                 * group of one is held and freed, unused */
                int ffn = rk.rank >= s->afd_attention;
                if (afd_split) st = ls_comm_split(rk.comm, ffn, rk.rank, &tp_group, err);
                if (st == LS_OK && !ffn && s->afd_attention > 1) eo.tp_comm = tp_group;
                if (st == LS_OK && ffn && s->afd_ffn > 1) eo.ep_comm = tp_group;
            } else if (s->tp > 1 && s->ep > 1) {
                /* TP groups of consecutive ranks, the experts over the world */
                eo.ep_comm = rk.comm;
                st = ls_comm_split(rk.comm, rk.rank / s->tp, rk.rank, &tp_group, err);
                eo.tp_comm = tp_group;
            } else if (s->tp > 1) {
                eo.tp_comm = rk.comm; /* the MoE expert-parallel over the same ranks */
            } else {
                eo.ep_comm = rk.comm;
            }
        }
        if (st != LS_OK && rk.rank > 0) ls_run_ranks_worker_exit(&rk, st, err);
        if (st == LS_OK && rk.rank > 0)
            run_worker(s, m, &eo, &go, grouped, max_len, &rk, tp_group); /* does not return */
    }
    if (st == LS_OK && !s->fingerprint && !hashed) {
        hj.ck = ck;
        hj.cache = s->hash_cache;
        hj.progress = s->progress;
        ls_error_clear(&hj.err);
        if (ls_thread_start(&hasher, hash_main, &hj) == 0) hashing = 1;
        else hash_main(&hj);
    }
    /* The manifest's facts first: the probe runs on a backend of its own,
     * before the engine's takes the device memory it sizes its arena by.
     * A perturbed run is a "fast" run with the perturbation recorded, so
     * its digest can never equal a strict one. */
    ls_run_facts facts;
    ls_manifest_opts mo = ls_manifest_opts_default();
    mo.checkpoint = ck;
    mo.threads = s->threads;
    mo.progress = s->progress;
    if (s->perturb) {
        mo.mode = "fast";
        mo.perturbation = s->perturb;
    }
    mo.fp8 = fp8;
    if (st == LS_OK) st = ls_run_spec_topology(s, &mo, err);
    /* how the rollout is served, recorded (informational: manifest.h) */
    ls_manifest_serving serving;
    int serving_any = 0;
    if (st == LS_OK) st = ls_run_spec_serving(s, &serving, &serving_any, err);
    mo.serving = serving_any ? &serving : NULL;
    if (s->gdn_chunked) mo.gdn_chunked = ls_backend_gdn_chunked_provider(s->backend, s->tier);
    rank_device dev; /* rank 0's device: the one the manifest describes */
    if (st == LS_OK) st = rank_device_pick(s, &rk, &dev, err);
    if (st == LS_OK) st = ls_run_manifest_facts(s->backend, dev.gpu, &mo, &facts, err);
    if (st == LS_OK)
        st = engine_open_shared(m, s->backend, s->threads, dev.gpu, dev.share, s->tier, &eo,
                                grouped ? ls_run_group_slots(b->n, &go) : b->n, max_len, &e, err);
    if (st == LS_OK && s->tier != LS_TIER_PORTABLE) {
        /* the tier's rows; tc: the GEMM algorithms the engine's backend
         * qualified and pinned; fast: a non-strict run */
        mo.tier_providers = ls_backend_tier_providers(s->backend, s->tier, &mo.n_tier_providers);
        ls_backend_cuda_tc_pins(ls_engine_backend(e), &mo.tc_gemms, &mo.n_tc_gemms);
        if (s->tier == LS_TIER_FAST) mo.mode = "fast";
    }
    if (hashing) pthread_join(hasher, NULL);
    if (st == LS_OK && !s->fingerprint && hj.st != LS_OK) {
        *err = hj.err;
        st = hj.st;
    }
    const ls_fingerprint *fp = s->fingerprint ? s->fingerprint : &hj.fp;
    if (st == LS_OK) st = check_expected_root(s, fp, err);
    /* Pin the manifest in process. */
    if (st == LS_OK) {
        mo.fingerprint = fp;
        st = ls_manifest_build(&mo, &man, err);
    }
    ls_digest md;
    if (st == LS_OK) st = ls_manifest_digest(man, &md, err);
    if (st == LS_OK) {
        ls_digest_to_hex(&md, res->manifest_digest);
        ls_log_verbose("%s: %zu tensors, %.3f GB; manifest pinned (backend %s, mode %s), digest %s",
                       s->checkpoint, ls_checkpoint_count(ck), (double)ls_checkpoint_total_bytes(ck) / 1e9,
                       s->backend, s->perturb || s->tier == LS_TIER_FAST ? "fast" : "strict", res->manifest_digest);
        ls_digest_to_hex(&fp->merkle_root, res->merkle_root);
    }
    if (st == LS_OK) {
        seqs = malloc(sizeof *seqs * (size_t)b->n);
        if (!seqs) st = ls_fail(err, LS_E_NOMEM, "out of memory");
        for (long i = 0; st == LS_OK && i < b->n; i++) seqs[i] = b->seqs[s->reverse_batch ? b->n - 1 - i : i];
    }
    if (st == LS_OK && grouped) {
        expanded = malloc(sizeof *expanded * (size_t)n_trace);
        if (!expanded) st = ls_fail(err, LS_E_NOMEM, "out of memory");
        else st = ls_run_group_sequences(seqs, b->n, N, expanded, err);
    }
    if (st == LS_OK) {
        /* run_params.batch lists the trace's sequences (a replay re-runs each) */
        params = run_params(s, grouped ? expanded : seqs, grouped ? n_trace : b->n, fp8);
        if (params) json_object_set_new(params, "checkpoint_verified", verification_json(fp, !s->fingerprint));
        params_text = params ? json_dumps(params, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        if (!params_text) st = ls_fail(err, LS_E_NOMEM, "out of memory");
    }
    if (st == LS_OK) {
        ls_trace_header h;
        char engine_name[64];
        ls_run_trace_header(e, s->mode, s->backend, res->merkle_root, res->manifest_digest, params_text,
                            s->state_digest_every, s->act_bf16, &h, engine_name);
        st = ls_trace_writer_open(s->out, &h, &sc.w, err);
        /* the balance report's file too, before the run (as the trace's) */
        if (st == LS_OK && s->afd_balance) {
            st = ls_outfile_open(&balance_out, s->afd_balance, err);
            balance_open = st == LS_OK;
            if (st != LS_OK) ls_trace_writer_abort(sc.w);
        }
    }
    if (st == LS_OK) {
        uint64_t total = 0;
        for (long i = 0; i < b->n; i++)
            total += (uint64_t)(rollout ? N * (b->seqs[i].n_tokens + s->max_new - 1) : b->seqs[i].n_tokens - 1);
        res->positions = total;
        if (s->progress) ls_progress_begin(&sc.prog, s->mode, total, "tok");
        uint64_t t0 = ls_now_ns();
        if (rollout) {
            res->completions = malloc(sizeof(int32_t) * (size_t)(n_trace * s->max_new));
            if (!res->completions) st = ls_fail(err, LS_E_NOMEM, "out of memory");
            else if (grouped) {
                st = ls_run_rollout_group(e, seqs, b->n, s->max_new, &s->sampling, &go, res->completions,
                                          write_frame, &sc, err);
                /* what the engine ran: reuse and forks skip positions, preemption recomputes some */
                res->positions = (uint64_t)gstats.positions_computed;
                ls_log_verbose("rollout: %ld samples per prompt (%ld forks), %ld prompt positions reused, "
                               "%ld evictions (%ld recomputed, %ld restored)", N, gstats.forks,
                               gstats.positions_reused, gstats.evictions, gstats.recomputed, gstats.restored);
            } else st = ls_run_rollout(e, seqs, b->n, s->max_new, &s->sampling, res->completions,
                                       write_frame, &sc, err);
        } else {
            long chunk = s->chunk > 0 ? s->chunk : max_len;
            st = ls_run_replay(e, seqs, b->n, chunk, write_frame, &sc, err);
        }
        res->seconds = (double)(ls_now_ns() - t0) / 1e9;
        if (st == LS_OK && s->afd_balance) st = ls_engine_afd_balance(e, &balance, err);
        if (s->progress) ls_progress_end(&sc.prog);
        ls_log_verbose("%s: %llu records in %.3f s on backend %s (max %ld rows per step)", s->mode,
                       (unsigned long long)sc.records, res->seconds, s->backend, eo.max_rows);
        /* several ranks: the trace goes into place only once every worker
         * has ended well (run/ranks.h) */
        st = ranks_finish(&rk, &tp_group, st, err);
        if (st == LS_OK) st = ls_trace_writer_close(sc.w, err);
        else ls_trace_writer_abort(sc.w);
        if (balance_open && st == LS_OK) st = write_afd_balance(s, m, &balance, &balance_out, err);
        else if (balance_open) ls_outfile_abort(&balance_out);
        res->records = sc.records;
    }
    ls_afd_balance_free(&balance);
    st = ranks_finish(&rk, &tp_group, st, err); /* a failure before the engine ran */
    if (st != LS_OK) {
        free(res->completions);
        res->completions = NULL;
    }
    if (!s->fingerprint) ls_fingerprint_free(&hj.fp);
    free(params_text);
    json_decref(params);
    json_decref(man);
    free(seqs);
    free(expanded);
    free(plan);
    free(dump);
    ls_engine_destroy(e);
    ls_model_close(m);
    ls_checkpoint_close(ck);
    return st;
}
