/* lockstep — manifests: pin, load, validate, diff, verify. */
#include "manifest/manifest.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "code/code.h"
#include "core/build_info.h"
#include "core/util.h"
#include "fingerprint/fingerprint.h"
#include "io/json.h"
#include "manifest/runtime.h"

/* ---- options ------------------------------------------------------------------ */

ls_manifest_opts ls_manifest_opts_default(void)
{
    ls_manifest_opts o;
    memset(&o, 0, sizeof o);
    o.backend = "cpu";
    o.mode = "strict";
    o.world_size = o.tp_degree = o.ep_degree = 1;
    return o;
}

/* ---- pin: sections ----------------------------------------------------------- */

static json_t *hex_json(const ls_digest *d)
{
    char hex[65];
    ls_digest_to_hex(d, hex);
    return json_string(hex);
}

static ls_status checkpoint_section(const ls_checkpoint *ck, const ls_manifest_opts *o,
                                    json_t **out, ls_error *err)
{
    ls_fingerprint own = {0};
    const ls_fingerprint *fpp = o->fingerprint;
    if (!fpp) {
        ls_fingerprint_opts fo = {o->threads, o->progress};
        ls_fingerprint_cache_opts co = {o->cache_dir, o->refresh};
        LS_TRY(ls_fingerprint_checkpoint_cached(ck, &fo, &co, &own, err));
        fpp = &own;
    }
    const ls_fingerprint fp = *fpp;
    json_t *tensors = json_object();
    json_t *sec = json_object();
    if (!tensors || !sec) goto nomem;
    for (size_t i = 0; i < fp.count; i++) {
        const ls_tensor_fp *t = &fp.tensors[i];
        json_t *shape = json_array();
        if (!shape) goto nomem;
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_t *e = json_pack("{s:s, s:o, s:I, s:o}", "dtype", ls_dtype_name(t->dtype), "shape",
                              shape, "size_bytes", (json_int_t)t->size_bytes, "sha256",
                              hex_json(&t->digest));
        if (!e || json_object_set_new(tensors, t->name, e) != 0) goto nomem;
    }
    json_object_set_new(sec, "path", json_string(ls_checkpoint_dir(ck)));
    json_object_set_new(sec, "config_sha256", hex_json(&fp.config_digest));
    json_object_set_new(sec, "tensor_count", json_integer((json_int_t)fp.count));
    json_object_set_new(sec, "total_bytes", json_integer((json_int_t)fp.total_bytes));
    /* Tensors before the root: verify names the first voiding difference in
     * document order, and the tensor is the useful one to name. */
    json_object_set_new(sec, "tensors", tensors);
    json_object_set_new(sec, "merkle_root", hex_json(&fp.merkle_root));
    /* Tensors of the families skipped on purpose (vision tower, MTP head):
     * in `tensors` and under the root like every tensor, but never read by
     * the model; listed with the reason, so the manifest says which of the
     * tensors it vouches for no output depends on. */
    json_t *skipped = json_array();
    if (!skipped || json_object_set_new(sec, "skipped_tensors", skipped) != 0) goto nomem;
    for (size_t i = 0; i < ls_checkpoint_ignored_count(ck); i++) {
        const char *name = ls_checkpoint_ignored_at(ck, i)->stored_name;
        json_t *e = json_pack("{s:s, s:s}", "name", name, "reason", ls_checkpoint_skip_reason(name));
        if (!e || json_array_append_new(skipped, e)) goto nomem;
    }
    ls_fingerprint_free(&own);
    *out = sec;
    return LS_OK;
nomem:
    json_decref(tensors);
    json_decref(sec);
    ls_fingerprint_free(&own);
    return ls_fail(err, LS_E_NOMEM, "manifest: out of memory building checkpoint section");
}

/* config.json fields that define the architecture; looked up at the top level
 * and then under "text_config" (Qwen3.5 nests the language model there). */
static const char *const arch_fields[] = {
    "architectures", "model_type", "hidden_size", "num_hidden_layers", "layer_types",
    "full_attention_interval", "num_attention_heads", "num_key_value_heads", "head_dim",
    "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
    "linear_value_head_dim", "linear_conv_kernel_dim", "intermediate_size", "num_experts",
    "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
    "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob", "vocab_size", "rope_theta",
    "partial_rotary_factor", "rope_scaling", "rope_parameters", "rms_norm_eps",
    "max_position_embeddings", "tie_word_embeddings", "attention_bias", "torch_dtype", "dtype",
    "attn_output_gate", "mamba_ssm_dtype", "image_token_id", "video_token_id", NULL};

static json_t *architecture_section(const json_t *cfg)
{
    json_t *sec = json_object();
    if (!sec) return NULL;
    const json_t *text = json_is_object(cfg) ? json_object_get(cfg, "text_config") : NULL;
    for (size_t i = 0; arch_fields[i]; i++) {
        json_t *v = json_is_object(cfg) ? json_object_get(cfg, arch_fields[i]) : NULL;
        if (!v && json_is_object(text)) v = json_object_get(text, arch_fields[i]);
        if (v) json_object_set(sec, arch_fields[i], v);
    }
    return sec;
}

/* The quantization_config of an FP8 checkpoint (top level, or text_config),
 * or NULL. */
static const json_t *quant_config(const json_t *cfg)
{
    const json_t *q = json_is_object(cfg) ? json_object_get(cfg, "quantization_config") : NULL;
    if (!json_is_object(q)) {
        const json_t *text = json_is_object(cfg) ? json_object_get(cfg, "text_config") : NULL;
        q = json_is_object(text) ? json_object_get(text, "quantization_config") : NULL;
    }
    return json_is_object(q) ? q : NULL;
}

/* numerics.fp8 of a checkpoint with a quantization_config: the FP8 mode and
 * the block size as config.json gives it (absent there: transformers'
 * default, [128, 128]). Changing either changes the arithmetic, so both are
 * pinned (voiding in diff). */
static ls_status fp8_section(const ls_manifest_opts *o, const json_t *qc, json_t **out,
                             ls_error *err)
{
    *out = NULL;
    const char *mode = o->fp8 ? o->fp8 : "dequant";
    if (!qc) {
        if (o->fp8)
            return ls_fail(err, LS_E_USAGE, "manifest: an FP8 mode ('%s') was given for a checkpoint "
                           "without quantization_config", o->fp8);
        return LS_OK;
    }
    if (strcmp(mode, "dequant") && strcmp(mode, "w8a8"))
        return ls_fail(err, LS_E_USAGE, "manifest: FP8 mode '%s': expected dequant or w8a8", mode);
    const json_t *bs = json_object_get(qc, "weight_block_size");
    json_t *block = bs && !json_is_null(bs) ? json_deep_copy(bs) : json_pack("[i, i]", 128, 128);
    *out = json_pack("{s:s, s:o}", "mode", mode, "weight_block_size", block);
    if (!*out) return ls_fail(err, LS_E_NOMEM, "manifest: out of memory");
    return LS_OK;
}

/* The probe's fingerprint of operator `op`, or NULL. */
static const char *reduction_fingerprint_of(const ls_manifest_opts *o, const char *op)
{
    for (size_t i = 0; o->reduction_fingerprints && i < o->n_reduction_fingerprints; i++)
        if (o->reduction_fingerprints[i].op && !strcmp(o->reduction_fingerprints[i].op, op))
            return o->reduction_fingerprints[i].sha256;
    return NULL;
}

/* code_sha256 of a row: the machine code of the functions its kernel_id
 * names, from this build's code table (code/code.h). A backend this build has
 * no code for (CUDA rows told to a CPU-only build) records none; a row naming
 * a function the table lacks is a registry bug and fails the pin. */
static ls_status add_code_digest(json_t *row, const char *backend, const ls_provider *p,
                                 ls_error *err)
{
    size_t n;
    const ls_code_entry *t = ls_code_list(&n);
    int have = 0;
    for (size_t i = 0; i < n && !have; i++) have = !strcmp(t[i].backend, backend);
    if (!have) return LS_OK;
    char hex[65];
    LS_TRY(ls_code_digest(backend, p->kernel_id, hex, err));
    if (json_object_set_new(row, "code_sha256", json_string(hex)) != 0)
        return ls_fail(err, LS_E_NOMEM, "manifest: out of memory");
    return LS_OK;
}

static ls_status numerics_section(const ls_manifest_opts *o, const json_t *qc, json_t **out,
                                  ls_error *err)
{
    size_t n = o->n_providers;
    const ls_provider *rows = o->providers;
    if (!rows || n == 0)
        return ls_fail(err, LS_E_UNSUPPORTED, "manifest: no provider rows for backend '%s' (the "
                       "backend's registry is handed in through ls_manifest_opts.providers)",
                       o->backend);
    json_t *fp8 = NULL;
    LS_TRY(fp8_section(o, qc, &fp8, err));
    if (fp8 && (!o->fp8_providers || o->n_fp8_providers == 0)) {
        json_decref(fp8);
        return ls_fail(err, LS_E_UNSUPPORTED, "manifest: no FP8 provider rows for backend '%s' "
                       "(ls_manifest_opts.fp8_providers): an FP8 checkpoint cannot be pinned "
                       "without them", o->backend);
    }
    json_t *ops = json_object();
    if (!ops) {
        json_decref(fp8);
        return ls_fail(err, LS_E_NOMEM, "manifest: out of memory");
    }
    int tensor_core = 0;
    size_t n_f8 = fp8 ? o->n_fp8_providers : 0, n_g = o->gdn_chunked ? 1 : 0;
    size_t n_tc = o->tier_providers ? o->n_tier_providers : 0, n_all = n + n_f8 + n_g + n_tc;
    for (size_t i = 0; i < n_all; i++) {
        const ls_provider *p = i < n ? &rows[i] : i < n + n_f8 ? &o->fp8_providers[i - n]
                             : i < n + n_f8 + n_tc ? &o->tier_providers[i - n - n_f8] : o->gdn_chunked;
        /* One row per op: a row of the requested mode wins over a strict one
         * (fast mode keeps strict providers for ops with no fast variant); a
         * tier's row, then the chunk-aligned GDN form's, replaces the one
         * before it whatever its mode. */
        int tier_row = i >= n + n_f8 && i < n + n_f8 + n_tc, replaces = i >= n + n_f8;
        json_t *have = json_object_get(ops, p->op);
        if (have && strcmp(p->mode, o->mode) != 0 && !replaces) continue;
        if (!have && strcmp(p->mode, o->mode) != 0 && strcmp(p->mode, "strict") != 0) continue;
        if (strcmp(p->tier, "tensor-core") == 0) tensor_core = 1;
        json_t *row = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "provider",
                                p->provider, "kernel_id", p->kernel_id, "tile_shape",
                                p->tile_shape, "split_policy", p->split_policy,
                                "accumulator_dtype", p->accumulator_dtype, "reduction_order",
                                p->reduction_order, "tier", p->tier, "mode", p->mode);
        const char *fp = tier_row || !strcmp(p->tier, "tensor-core") ? NULL /* no probe applies */
                         : reduction_fingerprint_of(o, p == o->gdn_chunked ? "gdn_chunked" : p->op);
        if (row && fp && json_object_set_new(row, "reduction_fingerprint", json_string(fp)) != 0) {
            json_decref(row);
            row = NULL;
        }
        ls_status st = row ? add_code_digest(row, o->backend, p, err)
                           : ls_fail(err, LS_E_NOMEM, "manifest: out of memory");
        if (st == LS_OK && json_object_set_new(ops, p->op, row) != 0)
            st = ls_fail(err, LS_E_NOMEM, "manifest: out of memory");
        else if (st != LS_OK)
            json_decref(row);
        if (st != LS_OK) {
            json_decref(ops);
            json_decref(fp8);
            return st;
        }
    }
    *out = json_pack("{s:s, s:s, s:s, s:o, s:o}", "backend", o->backend, "mode", o->mode, "tier",
                     tensor_core ? "tensor-core" : "portable", "perturbation",
                     o->perturbation ? json_string(o->perturbation) : json_null(), "operators", ops);
    if (!*out) {
        json_decref(fp8);
        return ls_fail(err, LS_E_NOMEM, "manifest: out of memory");
    }
    /* only for an FP8 checkpoint, so other manifests keep their digests */
    if (fp8) json_object_set_new(*out, "fp8", fp8);
    /* only for the chunk-aligned form, for the same reason */
    if (o->gdn_chunked) json_object_set_new(*out, "gdn_form", json_string(LS_MANIFEST_GDN_CHUNKED));
    /* only for the tensor-core tier: its pinned GEMM algorithms */
    if (n_tc && o->n_tc_gemms) {
        json_t *gemms = json_array();
        for (size_t i = 0; gemms && i < o->n_tc_gemms; i++) {
            json_error_t je;
            json_t *rec = json_loads(o->tc_gemms[i], 0, &je);
            if (!rec || json_array_append_new(gemms, rec) != 0) {
                json_decref(gemms);
                json_decref(*out);
                *out = NULL;
                return ls_fail(err, LS_E_INTERNAL, "manifest: pinned GEMM record %zu is not JSON: %s", i,
                               rec ? "out of memory" : je.text);
            }
        }
        if (!gemms || json_object_set_new(*out, "tc_gemms", gemms) != 0) {
            json_decref(*out);
            *out = NULL;
            return ls_fail(err, LS_E_NOMEM, "manifest: out of memory");
        }
    }
    return LS_OK;
}

/* SHA-256 of the running binary into hex, streamed. hex stays "unknown" where
 * the binary cannot be opened or read (no /proc); running out of memory is an
 * error, never a manifest that differs only because memory was short. */
static ls_status binary_digest(char hex[65], ls_error *err)
{
    int fd;
    ls_error oerr;
    if (ls_file_open_regular("/proc/self/exe", &fd, NULL, &oerr) != LS_OK) return LS_OK;
    size_t cap = (size_t)1 << 20;
    unsigned char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return ls_fail_nomem(err, cap, "manifest: hashing the lockstep binary");
    }
    ls_sha256 h;
    ls_status st = ls_sha256_init(&h, err);
    int read_ok = 1;
    while (st == LS_OK) {
        ssize_t n = read(fd, buf, cap);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            read_ok = n == 0;
            break;
        }
        st = ls_sha256_update(&h, buf, (size_t)n, err);
    }
    close(fd);
    free(buf);
    ls_digest d;
    if (st == LS_OK && read_ok) {
        st = ls_sha256_final(&h, &d, err);
        if (st == LS_OK) ls_digest_to_hex(&d, hex);
    } else {
        ls_sha256_discard(&h);
    }
    return st;
}

static ls_status build_section(json_t **out, ls_error *err)
{
    char hex[65] = "unknown";
    LS_TRY(binary_digest(hex, err));
#ifdef LOCKSTEP_HAVE_CUDA
    const char *cuda = LS_CUDA_COMPILER;
#else
    const char *cuda = "not built";
#endif
    *out = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "version", LS_VERSION,
                     "source_revision", LS_SOURCE_REVISION, "build_type", LS_BUILD_TYPE,
                     "compiler", LS_C_COMPILER, "flags", LS_C_FLAGS_STRING, "cuda_compiler",
                     cuda, "binary_sha256", hex);
    if (!*out) return ls_fail(err, LS_E_NOMEM, "manifest: out of memory");
    return LS_OK;
}

/* The serving section (manifest.h ls_manifest_serving): every field, so a
 * manifest that has it states the whole configuration. */
static ls_status serving_section(const ls_manifest_serving *sv, json_t **out, ls_error *err)
{
    *out = NULL;
    const char *pc = sv->prefix_cache ? sv->prefix_cache : "off";
    const char *pp = sv->preemption ? sv->preemption : "none";
    int aligned = !strcmp(pc, "aligned"), seeded = !strcmp(pp, "seeded");
    if (sv->kv_page < 0)
        return ls_fail(err, LS_E_USAGE, "manifest serving: kv_page %ld must be >= 0 (0 = contiguous)", sv->kv_page);
    if (sv->samples_per_prompt < 1)
        return ls_fail(err, LS_E_USAGE, "manifest serving: samples_per_prompt %ld must be >= 1",
                       sv->samples_per_prompt);
    if (!aligned && strcmp(pc, "off") && strcmp(pc, "any"))
        return ls_fail(err, LS_E_USAGE, "manifest serving: prefix_cache '%s': expected off, aligned or any", pc);
    if (aligned ? sv->prefix_block < 1 : sv->prefix_block != 0)
        return ls_fail(err, LS_E_USAGE, "manifest serving: prefix_block %ld: a block >= 1 with prefix_cache "
                       "aligned, 0 otherwise", sv->prefix_block);
    if (!seeded && strcmp(pp, "none"))
        return ls_fail(err, LS_E_USAGE, "manifest serving: preemption '%s': expected none or seeded", pp);
    json_t *prefix = aligned ? json_pack("{s:s, s:I}", "policy", pc, "block", (json_int_t)sv->prefix_block)
                             : json_pack("{s:s}", "policy", pc);
    /* the seed as run_params records it (a JSON integer) */
    json_t *pre = seeded ? json_pack("{s:s, s:I}", "policy", pp, "seed", (json_int_t)sv->preempt_seed)
                         : json_pack("{s:s}", "policy", pp);
    *out = json_pack("{s:I, s:I, s:o, s:o}", "kv_page", (json_int_t)sv->kv_page, "samples_per_prompt",
                     (json_int_t)sv->samples_per_prompt, "prefix_cache", prefix, "preemption", pre);
    if (!*out) return ls_fail(err, LS_E_NOMEM, "manifest: out of memory");
    return LS_OK;
}

/* The topology's values (docs/parallel.md §4), as they may be recorded. */
static const char *const communicators[] = {"none", "cpu-socket", "nccl", NULL};
static const char *const reduction_trees[] = {"none", "k8-binary", NULL};

static int name_in(const char *s, const char *const *names)
{
    for (; s && *names; names++)
        if (!strcmp(s, *names)) return 1;
    return 0;
}

static ls_status topology_check(const ls_manifest_opts *o, ls_error *err)
{
    const char *comm = o->communicator ? o->communicator : "none";
    const char *tree = o->reduction_tree ? o->reduction_tree : "none";
    if (!name_in(comm, communicators))
        return ls_fail(err, LS_E_USAGE, "manifest topology: communicator '%s': expected none, cpu-socket or "
                       "nccl", comm);
    if (!name_in(tree, reduction_trees))
        return ls_fail(err, LS_E_USAGE, "manifest topology: reduction_tree '%s': expected none or k8-binary",
                       tree);
    if ((o->afd_attention_ranks > 0) != (o->afd_ffn_ranks > 0) || o->afd_attention_ranks < 0 ||
        o->afd_ffn_ranks < 0)
        return ls_fail(err, LS_E_USAGE, "manifest topology: afd %d:%d: both group sizes must be >= 1 (or "
                       "both 0: colocated)", o->afd_attention_ranks, o->afd_ffn_ranks);
    long want = o->afd_attention_ranks > 0 ? (long)o->afd_attention_ranks + o->afd_ffn_ranks
                                           : (long)o->tp_degree * o->ep_degree;
    if (o->world_size != want)
        return ls_fail(err, LS_E_USAGE, "manifest topology: world_size %d is not %s (%ld)", o->world_size,
                       o->afd_attention_ranks > 0 ? "attention_ranks + ffn_ranks" : "tp_degree * ep_degree",
                       want);
    if ((o->world_size > 1) != (strcmp(comm, "none") != 0))
        return ls_fail(err, LS_E_USAGE, "manifest topology: communicator %s with world_size %d (one rank "
                       "has none; several ranks need one)", comm, o->world_size);
    return LS_OK;
}

ls_status ls_manifest_build(const ls_manifest_opts *opts, json_t **out, ls_error *err)
{
    *out = NULL;
    ls_manifest_opts o = opts ? *opts : ls_manifest_opts_default();
    if (!o.backend) o.backend = "cpu";
    if (!o.mode) o.mode = "strict";
    if (strcmp(o.mode, "strict") != 0 && strcmp(o.mode, "fast") != 0)
        return ls_fail(err, LS_E_USAGE, "mode '%s': expected strict or fast", o.mode);
    if (o.perturbation && strcmp(o.mode, "strict") == 0)
        return ls_fail(err, LS_E_USAGE, "a perturbation requires mode fast (strict has none)");
    if (o.world_size <= 0) o.world_size = 1;
    if (o.tp_degree <= 0) o.tp_degree = 1;
    if (o.ep_degree <= 0) o.ep_degree = 1;
    LS_TRY(topology_check(&o, err));
    if (!o.checkpoint && !o.checkpoint_dir)
        return ls_fail(err, LS_E_USAGE, "manifest: no checkpoint given");

    json_t *num = NULL, *build = NULL, *ck_sec = NULL, *arch = NULL, *serving = NULL;
    void *rt = NULL;
    ls_checkpoint *owned = NULL;
    ls_status st = o.serving ? serving_section(o.serving, &serving, err) : LS_OK;
    if (st == LS_OK) st = build_section(&build, err);
    if (st == LS_OK) st = ls_runtime_describe(o.gpu, &rt, err);
    const ls_checkpoint *ck = o.checkpoint;
    if (st == LS_OK && !ck) {
        st = ls_checkpoint_open(o.checkpoint_dir, &owned, err);
        ck = owned;
    }
    if (st == LS_OK) st = numerics_section(&o, quant_config(ls_checkpoint_config_json(ck)), &num, err);
    if (st == LS_OK) st = checkpoint_section(ck, &o, &ck_sec, err);
    if (st == LS_OK) {
        arch = architecture_section(ls_checkpoint_config_json(ck));
        if (!arch) st = ls_fail(err, LS_E_NOMEM, "manifest: out of memory");
    }
    if (owned) ls_checkpoint_close(owned);
    if (st != LS_OK) {
        json_decref(num);
        json_decref(build);
        json_decref(rt);
        json_decref(ck_sec);
        json_decref(arch);
        json_decref(serving);
        return st;
    }
    json_t *topo = json_pack("{s:i, s:i, s:i, s:o, s:s, s:s}", "world_size", o.world_size, "tp_degree",
                             o.tp_degree, "ep_degree", o.ep_degree, "afd",
                             o.afd_attention_ranks > 0
                                 ? json_pack("{s:i, s:i}", "attention_ranks", o.afd_attention_ranks,
                                             "ffn_ranks", o.afd_ffn_ranks)
                                 : json_null(),
                             "communicator", o.communicator ? o.communicator : "none", "reduction_tree",
                             o.reduction_tree ? o.reduction_tree : "none");
    /* Key order = the order diff and verify report differences in. */
    if (serving)
        *out = json_pack("{s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "manifest_version", LS_MANIFEST_VERSION,
                         "checkpoint", ck_sec, "architecture", arch, "numerics", num, "topology", topo, "serving",
                         serving, "build", build, "runtime", (json_t *)rt);
    else
        *out = json_pack("{s:i, s:o, s:o, s:o, s:o, s:o, s:o}", "manifest_version",
                         LS_MANIFEST_VERSION, "checkpoint", ck_sec, "architecture", arch, "numerics",
                         num, "topology", topo, "build", build, "runtime", (json_t *)rt);
    if (!*out) return ls_fail(err, LS_E_NOMEM, "manifest: out of memory");
    return LS_OK;
}


ls_status ls_manifest_save(const json_t *manifest, const char *path, ls_error *err)
{
    char *s = json_dumps(manifest, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    if (!s) return ls_fail(err, LS_E_NOMEM, "%s: could not serialise the manifest", path);
    ls_outfile of;
    ls_status st = ls_outfile_open(&of, path, err);
    if (st == LS_OK) {
        st = ls_outfile_write(&of, s, strlen(s), err);
        if (st == LS_OK) st = ls_outfile_write(&of, "\n", 1, err);
        if (st != LS_OK) {
            ls_outfile_abort(&of);
        } else {
            st = ls_outfile_commit(&of, err);
        }
    }
    free(s);
    return st;
}

/* ---- validation ----------------------------------------------------------------- */

static int is_hex64(const json_t *v)
{
    if (!json_is_string(v) || json_string_length(v) != 64) return 0;
    const char *s = json_string_value(v);
    for (int i = 0; i < 64; i++)
        if (!isxdigit((unsigned char)s[i])) return 0;
    return 1;
}

#define VFAIL(...) return ls_fail(err, LS_E_INPUT, __VA_ARGS__)

static ls_status need_object(const json_t *parent, const char *key, const char *where,
                             const char *label, const json_t **out, ls_error *err)
{
    const json_t *v = json_object_get(parent, key);
    if (!json_is_object(v)) VFAIL("%s: field %s%s%s: %s", label, where, *where ? "." : "", key,
                                  v ? "expected an object" : "missing");
    *out = v;
    return LS_OK;
}

static ls_status need_string(const json_t *parent, const char *key, const char *where,
                             const char *label, ls_error *err)
{
    const json_t *v = json_object_get(parent, key);
    if (!json_is_string(v)) VFAIL("%s: field %s.%s: %s", label, where, key,
                                  v ? "expected a string" : "missing");
    return LS_OK;
}

static ls_status need_count(const json_t *parent, const char *key, const char *where,
                            json_int_t min, const char *label, ls_error *err)
{
    const json_t *v = json_object_get(parent, key);
    if (!json_is_integer(v) || json_integer_value(v) < min)
        VFAIL("%s: field %s.%s: %s", label, where, key,
              v ? "expected an integer in range" : "missing");
    return LS_OK;
}

static ls_status validate_tensors(const json_t *ck, const char *label, ls_error *err)
{
    const json_t *tensors = json_object_get(ck, "tensors");
    if (!json_is_object(tensors)) VFAIL("%s: field checkpoint.tensors: %s", label,
                                        tensors ? "expected an object" : "missing");
    size_t n = json_object_size(tensors);
    const json_t *cnt = json_object_get(ck, "tensor_count");
    if (!json_is_integer(cnt) || json_integer_value(cnt) != (json_int_t)n)
        VFAIL("%s: field checkpoint.tensor_count: missing or not the number of tensors (%zu)",
              label, n);
    /* Leaves in byte order of the names, as the fingerprint defines them. */
    const char **names = malloc((n ? n : 1) * sizeof *names);
    ls_digest *leaves = malloc((n ? n : 1) * sizeof *leaves);
    if (!names || !leaves) {
        free(names);
        free(leaves);
        return ls_fail_nomem(err, (n ? n : 1) * (sizeof *names + sizeof *leaves), "%s: tables of %zu tensors", label, n);
    }
    size_t k = 0;
    const char *name;
    json_t *t;
    ls_status st = LS_OK;
    void *iter = json_object_iter((json_t *)tensors);
    for (; iter; iter = json_object_iter_next((json_t *)tensors, iter)) names[k++] = json_object_iter_key(iter);
    for (size_t i = 1; i < n; i++) { /* insertion sort by strcmp: n is small enough */
        const char *x = names[i];
        size_t j = i;
        for (; j > 0 && strcmp(names[j - 1], x) > 0; j--) names[j] = names[j - 1];
        names[j] = x;
    }
    for (size_t i = 0; i < n && st == LS_OK; i++) {
        name = names[i];
        t = json_object_get(tensors, name);
        if (!json_is_object(t)) {
            st = ls_fail(err, LS_E_INPUT, "%s: field checkpoint.tensors[\"%s\"]: expected an object",
                         label, name);
            break;
        }
        const json_t *dt = json_object_get(t, "dtype");
        const json_t *shape = json_object_get(t, "shape");
        const json_t *sha = json_object_get(t, "sha256");
        ls_dtype dtv;
        if (!json_is_string(dt) || ls_dtype_parse(json_string_value(dt), &dtv) != 0) {
            st = ls_fail(err, LS_E_INPUT, "%s: field checkpoint.tensors[\"%s\"].dtype: missing or "
                         "not a safetensors dtype", label, name);
            break;
        }
        if (!json_is_array(shape) || json_array_size(shape) > LS_TENSOR_MAX_DIMS) {
            st = ls_fail(err, LS_E_INPUT, "%s: field checkpoint.tensors[\"%s\"].shape: expected an "
                         "array of at most %d integers", label, name, LS_TENSOR_MAX_DIMS);
            break;
        }
        int64_t dims[LS_TENSOR_MAX_DIMS];
        int ndim = (int)json_array_size(shape);
        for (int d = 0; d < ndim && st == LS_OK; d++) {
            const json_t *v = json_array_get(shape, (size_t)d);
            if (!json_is_integer(v) || json_integer_value(v) < 0)
                st = ls_fail(err, LS_E_INPUT, "%s: field checkpoint.tensors[\"%s\"].shape[%d]: "
                             "expected a non-negative integer", label, name, d);
            else
                dims[d] = (int64_t)json_integer_value(v);
        }
        if (st != LS_OK) break;
        const json_t *sz = json_object_get(t, "size_bytes");
        if (!json_is_integer(sz) || json_integer_value(sz) < 0) {
            st = ls_fail(err, LS_E_INPUT, "%s: field checkpoint.tensors[\"%s\"].size_bytes: "
                         "expected a non-negative integer", label, name);
            break;
        }
        ls_digest td;
        if (!is_hex64(sha) || ls_digest_from_hex(json_string_value(sha), &td, NULL) != LS_OK) {
            st = ls_fail(err, LS_E_INPUT, "%s: field checkpoint.tensors[\"%s\"].sha256: expected 64 "
                         "hex digits", label, name);
            break;
        }
        st = ls_fingerprint_hash_leaf(name, json_string_value(dt), ndim, dims, &td, &leaves[i], err);
    }
    ls_digest root, pinned;
    if (st == LS_OK) st = ls_fingerprint_merkle_root(leaves, n, &root, err);
    free(names);
    free(leaves);
    if (st != LS_OK) return st;
    const json_t *mr = json_object_get(ck, "merkle_root");
    if (!is_hex64(mr) || ls_digest_from_hex(json_string_value(mr), &pinned, NULL) != LS_OK)
        VFAIL("%s: field checkpoint.merkle_root: expected 64 hex digits", label);
    if (!ls_digest_equal(&root, &pinned))
        VFAIL("%s: field checkpoint.merkle_root: does not match the tensors listed in "
              "checkpoint.tensors (edited or corrupted manifest)", label);
    return LS_OK;
}

/* The topology's fields beyond the degrees, optional (manifests pinned
 * before they existed lack them; absent = one rank's values), and its
 * arithmetic: world_size = tp * ep colocated, attention + ffn with AFD. */
static ls_status validate_topology(const json_t *topo, const char *label, ls_error *err)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)topo, key, v)
        if (strcmp(key, "world_size") && strcmp(key, "tp_degree") && strcmp(key, "ep_degree") &&
            strcmp(key, "afd") && strcmp(key, "communicator") && strcmp(key, "reduction_tree"))
            VFAIL("%s: field topology.%s: not a field of topology (world_size, tp_degree, ep_degree, afd, "
                  "communicator, reduction_tree)", label, key);
    const json_t *comm = json_object_get(topo, "communicator");
    if (comm && !name_in(json_string_value(comm), communicators))
        VFAIL("%s: field topology.communicator: expected \"none\", \"cpu-socket\" or \"nccl\"", label);
    const json_t *tree = json_object_get(topo, "reduction_tree");
    if (tree && !name_in(json_string_value(tree), reduction_trees))
        VFAIL("%s: field topology.reduction_tree: expected \"none\" or \"k8-binary\"", label);
    const json_t *afd = json_object_get(topo, "afd");
    json_int_t w = json_integer_value(json_object_get(topo, "world_size"));
    json_int_t want = json_integer_value(json_object_get(topo, "tp_degree")) *
                      json_integer_value(json_object_get(topo, "ep_degree"));
    if (afd && !json_is_null(afd)) {
        if (!json_is_object(afd) || json_object_size(afd) != 2)
            VFAIL("%s: field topology.afd: expected null or {\"attention_ranks\": A, \"ffn_ranks\": F}", label);
        LS_TRY(need_count(afd, "attention_ranks", "topology.afd", 1, label, err));
        LS_TRY(need_count(afd, "ffn_ranks", "topology.afd", 1, label, err));
        want = json_integer_value(json_object_get(afd, "attention_ranks")) +
               json_integer_value(json_object_get(afd, "ffn_ranks"));
    }
    if (w != want)
        VFAIL("%s: field topology.world_size: %lld is not %s (%lld)", label, (long long)w,
              afd && !json_is_null(afd) ? "afd.attention_ranks + afd.ffn_ranks" : "tp_degree * ep_degree",
              (long long)want);
    if (comm && (w > 1) != (strcmp(json_string_value(comm), "none") != 0))
        VFAIL("%s: field topology.communicator: %s with world_size %lld (one rank has none; several ranks "
              "need one)", label, json_string_value(comm), (long long)w);
    return LS_OK;
}

/* The optional serving section: exactly its four fields, each in range. */
static ls_status validate_serving(const json_t *sv, const char *label, ls_error *err)
{
    if (!sv) return LS_OK; /* absent: the plain engine, and every manifest pinned before it existed */
    if (!json_is_object(sv)) VFAIL("%s: field serving: expected an object", label);
    LS_TRY(need_count(sv, "kv_page", "serving", 0, label, err));
    LS_TRY(need_count(sv, "samples_per_prompt", "serving", 1, label, err));
    const json_t *pc = json_object_get(sv, "prefix_cache"), *pp = json_object_get(sv, "preemption");
    const char *pol = json_string_value(json_object_get(pc, "policy"));
    int aligned = pol && !strcmp(pol, "aligned");
    if (!json_is_object(pc) || !pol || (!aligned && strcmp(pol, "off") && strcmp(pol, "any")))
        VFAIL("%s: field serving.prefix_cache: expected an object with policy \"off\", \"aligned\" or \"any\"",
              label);
    if (aligned) LS_TRY(need_count(pc, "block", "serving.prefix_cache", 1, label, err));
    if (json_object_size(pc) != (aligned ? 2u : 1u))
        VFAIL("%s: field serving.prefix_cache: expected policy%s only", label, aligned ? " and block" : "");
    pol = json_string_value(json_object_get(pp, "policy"));
    int seeded = pol && !strcmp(pol, "seeded");
    if (!json_is_object(pp) || !pol || (!seeded && strcmp(pol, "none")))
        VFAIL("%s: field serving.preemption: expected an object with policy \"none\" or \"seeded\"", label);
    if (seeded && !json_is_integer(json_object_get(pp, "seed")))
        VFAIL("%s: field serving.preemption.seed: %s", label,
              json_object_get(pp, "seed") ? "expected an integer" : "missing");
    if (json_object_size(pp) != (seeded ? 2u : 1u))
        VFAIL("%s: field serving.preemption: expected policy%s only", label, seeded ? " and seed" : "");
    if (json_object_size(sv) != 4)
        VFAIL("%s: field serving: expected exactly kv_page, samples_per_prompt, prefix_cache and preemption",
              label);
    return LS_OK;
}

ls_status ls_manifest_validate(const json_t *m, const char *label, ls_error *err)
{
    if (!json_is_object(m)) VFAIL("%s: a manifest is a JSON object", label);
    const json_t *ver = json_object_get(m, "manifest_version");
    if (!json_is_integer(ver)) VFAIL("%s: field manifest_version: %s", label,
                                     ver ? "expected an integer" : "missing");
    if (json_integer_value(ver) != LS_MANIFEST_VERSION)
        return ls_fail(err, LS_E_UNSUPPORTED, "%s: field manifest_version: %lld is not supported "
                       "(this lockstep reads version %d)", label,
                       (long long)json_integer_value(ver), LS_MANIFEST_VERSION);
    const json_t *ck = NULL, *arch = NULL, *num = NULL, *topo = NULL, *build = NULL, *rt = NULL, *ops = NULL;
    LS_TRY(need_object(m, "checkpoint", "", label, &ck, err));
    LS_TRY(need_object(m, "architecture", "", label, &arch, err));
    LS_TRY(need_object(m, "numerics", "", label, &num, err));
    LS_TRY(need_object(m, "topology", "", label, &topo, err));
    LS_TRY(need_object(m, "build", "", label, &build, err));
    LS_TRY(need_object(m, "runtime", "", label, &rt, err));

    if (!is_hex64(json_object_get(ck, "config_sha256")))
        VFAIL("%s: field checkpoint.config_sha256: missing or not 64 hex digits", label);
    LS_TRY(need_count(ck, "total_bytes", "checkpoint", 0, label, err));
    LS_TRY(validate_tensors(ck, label, err));
    const json_t *skipped = json_object_get(ck, "skipped_tensors");
    if (skipped) { /* optional: manifests pinned before it existed lack it */
        if (!json_is_array(skipped))
            VFAIL("%s: field checkpoint.skipped_tensors: expected an array", label);
        for (size_t i = 0; i < json_array_size(skipped); i++) {
            /* {"name", "reason"}; a bare name in manifests pinned before the
             * skipped tensors were fingerprinted */
            const json_t *e = json_array_get(skipped, i);
            if (json_is_string(e)) continue;
            if (!json_is_object(e) || json_object_size(e) != 2 ||
                !json_is_string(json_object_get(e, "name")) || !json_is_string(json_object_get(e, "reason")))
                VFAIL("%s: field checkpoint.skipped_tensors[%zu]: expected an object with the strings "
                      "\"name\" and \"reason\"", label, i);
        }
    }

    LS_TRY(need_string(num, "backend", "numerics", label, err));
    LS_TRY(need_string(num, "mode", "numerics", label, err));
    LS_TRY(need_string(num, "tier", "numerics", label, err));
    const char *mode = json_string_value(json_object_get(num, "mode"));
    if (strcmp(mode, "strict") != 0 && strcmp(mode, "fast") != 0)
        VFAIL("%s: field numerics.mode: expected \"strict\" or \"fast\"", label);
    const json_t *pert = json_object_get(num, "perturbation");
    if (!json_is_null(pert) && !json_is_string(pert))
        VFAIL("%s: field numerics.perturbation: expected null or a string", label);
    if (json_is_string(pert) && strcmp(mode, "strict") == 0)
        VFAIL("%s: field numerics.perturbation: must be null in strict mode", label);
    const json_t *fp8 = json_object_get(num, "fp8");
    if (fp8) { /* present for FP8 checkpoints only */
        const json_t *fm = json_object_get(fp8, "mode"), *bs = json_object_get(fp8, "weight_block_size");
        if (!json_is_object(fp8))
            VFAIL("%s: field numerics.fp8: expected an object", label);
        if (!json_is_string(fm) ||
            (strcmp(json_string_value(fm), "dequant") && strcmp(json_string_value(fm), "w8a8")))
            VFAIL("%s: field numerics.fp8.mode: expected \"dequant\" or \"w8a8\"", label);
        if (!json_is_array(bs) || json_array_size(bs) != 2 ||
            !json_is_integer(json_array_get(bs, 0)) || !json_is_integer(json_array_get(bs, 1)))
            VFAIL("%s: field numerics.fp8.weight_block_size: expected two integers", label);
        if (json_object_size(fp8) != 2)
            VFAIL("%s: field numerics.fp8: expected exactly mode and weight_block_size", label);
    }
    const json_t *gf = json_object_get(num, "gdn_form");
    if (gf && (!json_is_string(gf) || strcmp(json_string_value(gf), LS_MANIFEST_GDN_CHUNKED)))
        VFAIL("%s: field numerics.gdn_form: expected \"%s\" (absent: the recurrent form)", label,
              LS_MANIFEST_GDN_CHUNKED);
    const json_t *tg = json_object_get(num, "tc_gemms"); /* the tensor-core tier only */
    const char *tier = json_string_value(json_object_get(num, "tier"));
    if (strcmp(tier, "portable") && strcmp(tier, "tensor-core"))
        VFAIL("%s: field numerics.tier: expected \"portable\" or \"tensor-core\"", label);
    if (tg && !strcmp(tier, "portable"))
        VFAIL("%s: field numerics.tc_gemms: only a tensor-core tier pins GEMM algorithms", label);
    if (!strcmp(tier, "tensor-core") && !strcmp(mode, "strict") && (!json_is_array(tg) || json_array_size(tg) == 0))
        VFAIL("%s: field numerics.tc_gemms: a strict tensor-core tier needs its pinned GEMM records (a non-empty "
              "array)", label);
    /* a perturbed run of the tc tier (a fast twin in one layer) still runs its pinned GEMMs */
    if (tg && strcmp(mode, "strict") && !json_is_string(json_object_get(num, "perturbation")))
        VFAIL("%s: field numerics.tc_gemms: only a strict tier, or a perturbed one, pins GEMM algorithms (mode is "
              "%s)", label, mode);
    for (size_t i = 0; tg && i < json_array_size(tg); i++) {
        const json_t *r = json_array_get(tg, i);
        if (!json_is_object(r) || !json_is_string(json_object_get(r, "kind")) ||
            !json_is_integer(json_object_get(r, "n")) || !json_is_integer(json_object_get(r, "k")) ||
            !json_is_integer(json_object_get(r, "algo_id")) || !json_is_integer(json_object_get(r, "cublaslt_version")))
            VFAIL("%s: field numerics.tc_gemms[%zu]: expected a pinned GEMM record (kind, n, k, algo_id, ..., "
                  "cublaslt_version)", label, i);
    }
    LS_TRY(need_object(num, "operators", "numerics", label, &ops, err));
    const char *op;
    json_t *row;
    static const char *const row_fields[] = {"provider", "kernel_id", "tile_shape",
                                             "split_policy", "accumulator_dtype",
                                             "reduction_order", "tier", "mode", NULL};
    json_object_foreach((json_t *)ops, op, row) {
        if (!json_is_object(row)) VFAIL("%s: field numerics.operators.%s: expected an object", label, op);
        for (size_t i = 0; row_fields[i]; i++)
            if (!json_is_string(json_object_get(row, row_fields[i])))
                VFAIL("%s: field numerics.operators.%s.%s: missing or not a string", label, op,
                      row_fields[i]);
        /* optional: manifests pinned before reduction fingerprints lack it */
        const json_t *rf = json_object_get(row, "reduction_fingerprint");
        if (rf && !is_hex64(rf))
            VFAIL("%s: field numerics.operators.%s.reduction_fingerprint: expected 64 hex digits",
                  label, op);
        const json_t *code = json_object_get(row, "code_sha256"); /* optional */
        if (code && !is_hex64(code))
            VFAIL("%s: field numerics.operators.%s.code_sha256: expected 64 hex digits",
                  label, op);
    }
    LS_TRY(validate_serving(json_object_get(m, "serving"), label, err));
    LS_TRY(need_count(topo, "world_size", "topology", 1, label, err));
    LS_TRY(need_count(topo, "tp_degree", "topology", 1, label, err));
    LS_TRY(need_count(topo, "ep_degree", "topology", 1, label, err));
    LS_TRY(validate_topology(topo, label, err));
    LS_TRY(need_string(build, "source_revision", "build", label, err));
    LS_TRY(need_string(build, "binary_sha256", "build", label, err));
    return LS_OK;
}

ls_status ls_manifest_parse(const char *label, const char *text, size_t len, json_t **out,
                            ls_error *err)
{
    *out = NULL;
    json_t *m;
    LS_TRY(ls_json_load_buf(label, text, len, &m, err));
    ls_status st = ls_manifest_validate(m, label, err);
    if (st != LS_OK) {
        json_decref(m);
        return st;
    }
    *out = m;
    return LS_OK;
}

ls_status ls_manifest_load(const char *path, json_t **out, ls_error *err)
{
    *out = NULL;
    char *text;
    size_t len;
    LS_TRY(ls_read_file(path, &text, &len, err));
    ls_status st = ls_manifest_parse(path, text, len, out, err);
    free(text);
    return st;
}

/* ---- classification ------------------------------------------------------------- */

/* Differences at these paths (or below them) do not void a claim. Everything
 * else does: an unknown field is voiding (fail closed). */
static const char *const informational_paths[] = {
    "checkpoint.path",          /* where the files were, not what they hold */
    "checkpoint.skipped_tensors", /* which tensors the model never reads, and why; their bytes
                                     are in checkpoint.tensors and the root, which void */
    "runtime.host_name",
    "runtime.pinned_at",
    "runtime.os.release",       /* kernel build; numerics run in user space */
    "runtime.os.version",
    "runtime.cpu.model",        /* the strict CPU path depends on features, not the model name */
    "runtime.cpu.logical_cores",
    "runtime.gpu.uuid",         /* which board, not which kind */
    "runtime.gpu.memory_bytes",
    "runtime.gpu.device_index",  /* which of the host's cards the run chose, not which kind */
    "runtime.gpu.device_count",
    "runtime.gpu.kernel_driver", /* kernels are built ahead of time (sm_90 code in the binary) */
    "serving",                  /* how the rollout was served: KV pages, GRPO samples, prefix
                                   reuse, preemption; none changes a bit of lockstep's engine */
    NULL};

static int path_under(const char *path, const char *prefix)
{
    size_t n = strlen(prefix);
    return strncmp(path, prefix, n) == 0 && (path[n] == '\0' || path[n] == '.' || path[n] == '[');
}

static int revision_pins_source(const json_t *m)
{
    const char *rev = json_string_value(json_object_get(json_object_get(m, "build"), "source_revision"));
    if (!rev || strcmp(rev, "unknown") == 0) return 0;
    size_t n = strlen(rev);
    return !(n >= 6 && strcmp(rev + n - 6, "-dirty") == 0);
}

static int backend_is(const json_t *m, const char *name)
{
    const char *b = json_string_value(json_object_get(json_object_get(m, "numerics"), "backend"));
    return b && strcmp(b, name) == 0;
}

static const json_t *operators_of(const json_t *m)
{
    return json_object_get(json_object_get(m, "numerics"), "operators");
}

/* How many operator rows of m carry a reduction fingerprint. */
static size_t fingerprinted_rows(const json_t *m)
{
    const char *op;
    json_t *row;
    size_t n = 0;
    json_object_foreach((json_t *)operators_of(m), op, row)
        n += json_object_get(row, "reduction_fingerprint") != NULL;
    return n;
}

/* 1 when every row fingerprinted in a has a fingerprinted row of the same
 * operator in b. */
static int fingerprints_covered(const json_t *a, const json_t *b)
{
    const char *op;
    json_t *row;
    const json_t *ops_b = operators_of(b);
    json_object_foreach((json_t *)operators_of(a), op, row)
        if (json_object_get(row, "reduction_fingerprint") &&
            !json_object_get(json_object_get(ops_b, op), "reduction_fingerprint"))
            return 0;
    return 1;
}

/* Both manifests pin the arithmetic of the same operators by fingerprint. */
static int fingerprints_pin_arithmetic(const json_t *old_m, const json_t *new_m)
{
    return fingerprinted_rows(old_m) > 0 && fingerprinted_rows(new_m) > 0 &&
           fingerprints_covered(old_m, new_m) && fingerprints_covered(new_m, old_m);
}

/* numerics.operators.OP.reduction_fingerprint (OP a plain key or ["..."]). */
static int is_fingerprint_path(const char *path)
{
    static const char pre[] = "numerics.operators", suf[] = ".reduction_fingerprint";
    size_t n = strlen(path), np = sizeof pre - 1, ns = sizeof suf - 1;
    return n > np + ns && strncmp(path, pre, np) == 0 && (path[np] == '.' || path[np] == '[') &&
           strcmp(path + n - ns, suf) == 0;
}

/* numerics.operators.<op>.code_sha256 */
static int is_code_digest_path(const char *path)
{
    static const char pre[] = "numerics.operators", leaf[] = ".code_sha256";
    size_t n = strlen(path), np = sizeof pre - 1, nl = sizeof leaf - 1;
    return path_under(path, pre) && n > np + nl && strcmp(path + n - nl, leaf) == 0 &&
           (path[np] == '.' || path[np] == '[');
}

int ls_manifest_is_code_digest_path(const char *path) { return is_code_digest_path(path); }

static const char *topology_str(const json_t *m, const char *key)
{
    const json_t *v = json_object_get(json_object_get(m, "topology"), key);
    return v ? json_string_value(v) : "none"; /* absent: pinned before the field, one rank */
}

/* docs/parallel.md §4: for lockstep's own strict providers the topology is
 * not part of the claim, because every exchange between ranks is exact data
 * movement and a split reduction follows the tree recorded in
 * topology.reduction_tree. So a topology difference is informational when
 * both manifests are strict, their numerics (every operator row, its
 * reduction order and fingerprint) are equal, their reduction trees are the
 * same, and both communicators are ones lockstep knows (none of them
 * reduces). Fast mode, another tree or other arithmetic: voiding. */
static int topology_neutral(const json_t *old_m, const json_t *new_m)
{
    const json_t *na = json_object_get(old_m, "numerics"), *nb = json_object_get(new_m, "numerics");
    const char *ma = json_string_value(json_object_get(na, "mode"));
    const char *mb = json_string_value(json_object_get(nb, "mode"));
    const char *ta = topology_str(old_m, "reduction_tree"), *tb = topology_str(new_m, "reduction_tree");
    return ma && mb && !strcmp(ma, "strict") && !strcmp(mb, "strict") && json_equal((json_t *)na, (json_t *)nb) &&
           ta && tb && !strcmp(ta, tb) && name_in(topology_str(old_m, "communicator"), communicators) &&
           name_in(topology_str(new_m, "communicator"), communicators);
}

/* The topology leaves topology_neutral may call informational: the ones
 * lockstep knows, except the reduction tree (a change of it voids). */
static const char *const topology_paths[] = {"topology.world_size", "topology.tp_degree", "topology.ep_degree",
                                             "topology.afd", "topology.communicator", "runtime.gpus",
                                             "runtime.gpu.nccl_version", NULL};

ls_change_class ls_manifest_classify(const char *path, const json_t *old_m, const json_t *new_m)
{
    for (size_t i = 0; informational_paths[i]; i++)
        if (path_under(path, informational_paths[i])) return LS_CHANGE_INFORMATIONAL;
    /* A reduction fingerprint that differs voids (the operator's arithmetic
     * changed). One present on one side only is informational when the other
     * side has none at all (a manifest pinned before fingerprints made no
     * claim about them); beside other fingerprints, a missing one voids
     * (fail closed: it cannot be dropped to hide a change). */
    if (is_fingerprint_path(path))
        return fingerprinted_rows(old_m) > 0 && fingerprinted_rows(new_m) > 0
                   ? LS_CHANGE_VOIDING
                   : LS_CHANGE_INFORMATIONAL;
    /* The binary's digest changes with every rebuild of the same source.
     * With reduction fingerprints of the same operators on both sides, the
     * fingerprints decide whether the arithmetic changed, and the digest is
     * informational. Without them (older manifests) it voids only when the
     * source revision does not identify the source. */
    if (path_under(path, "build.binary_sha256")) {
        if (fingerprints_pin_arithmetic(old_m, new_m)) return LS_CHANGE_INFORMATIONAL;
        return revision_pins_source(old_m) && revision_pins_source(new_m)
                   ? LS_CHANGE_INFORMATIONAL
                   : LS_CHANGE_VOIDING;
    }
    /* Kernel code changed (compiler, flags, source) while every other field of
     * the row stayed: informational, with a warning (manifest/README.md). */
    if (is_code_digest_path(path)) return LS_CHANGE_INFORMATIONAL;
    /* A GPU appearing, disappearing or changing does not touch a CPU claim. */
    if (path_under(path, "runtime.gpu") && backend_is(old_m, "cpu") && backend_is(new_m, "cpu"))
        return LS_CHANGE_INFORMATIONAL;
    for (size_t i = 0; topology_paths[i]; i++)
        if (path_under(path, topology_paths[i]))
            return topology_neutral(old_m, new_m) ? LS_CHANGE_INFORMATIONAL : LS_CHANGE_VOIDING;
    return LS_CHANGE_VOIDING;
}

/* Removes the member at a dotted path (plain keys only) if present. */
static void remove_path(json_t *root, const char *path)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *obj = root;
    char *key = buf;
    for (char *dot; (dot = strchr(key, '.')) != NULL; key = dot + 1) {
        *dot = '\0';
        obj = json_object_get(obj, key);
        if (!json_is_object(obj)) return;
    }
    json_object_del(obj, key);
}

ls_status ls_manifest_digest(const json_t *manifest, ls_digest *out, ls_error *err)
{
    /* The claim is what a diff would call voiding: drop exactly the leaves
     * ls_manifest_classify calls informational when the manifest is compared
     * with itself, so identical claims pinned on different hosts or at
     * different times share one digest. */
    json_t *claim = json_deep_copy(manifest);
    if (!claim) return ls_fail(err, LS_E_NOMEM, "manifest digest: out of memory");
    for (size_t i = 0; informational_paths[i]; i++) remove_path(claim, informational_paths[i]);
    if (ls_manifest_classify("build.binary_sha256", manifest, manifest) == LS_CHANGE_INFORMATIONAL)
        remove_path(claim, "build.binary_sha256");
    if (ls_manifest_classify("runtime.gpu", manifest, manifest) == LS_CHANGE_INFORMATIONAL)
        remove_path(claim, "runtime.gpu");
    /* a strict claim holds at every topology (topology_neutral): one digest
     * for EP1 and EPn; the reduction tree stays in it, absent read as none */
    if (topology_neutral(manifest, manifest)) {
        for (size_t i = 0; topology_paths[i]; i++) remove_path(claim, topology_paths[i]);
        json_t *topo = json_object_get(claim, "topology");
        if (json_is_object(topo) && !json_object_get(topo, "reduction_tree"))
            json_object_set_new(topo, "reduction_tree", json_string("none"));
    }
    const char *op;
    json_t *row;
    json_object_foreach(json_object_get(json_object_get(claim, "numerics"), "operators"), op, row)
        if (json_is_object(row)) json_object_del(row, "code_sha256");
    char *s = ls_fingerprint_canonical_json(claim, err);
    json_decref(claim);
    if (!s) return err ? err->status : LS_E_NOMEM;
    ls_status st = ls_sha256_buf(s, strlen(s), out, err);
    free(s);
    return st;
}

const char *ls_change_class_name(ls_change_class c)
{
    return c == LS_CHANGE_VOIDING ? "voiding" : "informational";
}

/* ---- diff --------------------------------------------------------------------------- */

#define LS_DIFF_VALUE_MAX 200 /* characters of a value kept for display */

typedef struct diff_ctx {
    ls_manifest_delta *d;
    size_t cap;
    const json_t *old_root, *new_root;
    ls_error *err;
} diff_ctx;

static char *value_text(const json_t *v)
{
    if (!v) return strdup("(absent)");
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    if (!s) return NULL;
    size_t n = strlen(s);
    if (n > LS_DIFF_VALUE_MAX) strcpy(s + LS_DIFF_VALUE_MAX - 3, "...");
    return s;
}

static ls_status add_change(diff_ctx *c, const char *path, const json_t *a, const json_t *b)
{
    ls_manifest_delta *d = c->d;
    if (d->count == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 16;
        ls_manifest_change *p = realloc(d->changes, cap * sizeof *p);
        if (!p) return ls_fail(c->err, LS_E_NOMEM, "diff: out of memory");
        d->changes = p;
        c->cap = cap;
    }
    ls_manifest_change *ch = &d->changes[d->count];
    ch->path = strdup(path);
    ch->old_value = value_text(a);
    ch->new_value = value_text(b);
    if (!ch->path || !ch->old_value || !ch->new_value) {
        free(ch->path);
        free(ch->old_value);
        free(ch->new_value);
        return ls_fail(c->err, LS_E_NOMEM, "diff: out of memory");
    }
    ch->cls = ls_manifest_classify(path, c->old_root, c->new_root);
    if (ch->cls == LS_CHANGE_VOIDING) d->voiding++;
    d->count++;
    return LS_OK;
}

static int plain_key(const char *k)
{
    if (!*k) return 0;
    for (const char *p = k; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_') return 0;
    return 1;
}

/* Appends ".key" (or ["key"] when the key holds other characters) to path. */
static char *child_path(const char *path, const char *key)
{
    size_t n = strlen(path) + 2 * strlen(key) + 8;
    char *s = malloc(n);
    if (!s) return NULL;
    if (plain_key(key)) {
        snprintf(s, n, "%s%s%s", path, *path ? "." : "", key);
    } else {
        size_t k = (size_t)snprintf(s, n, "%s[\"", path);
        for (const char *p = key; *p; p++) {
            if (*p == '"' || *p == '\\') s[k++] = '\\';
            s[k++] = *p;
        }
        s[k] = '\0';
        strcat(s, "\"]");
    }
    return s;
}

static ls_status diff_value(diff_ctx *c, const char *path, const json_t *a, const json_t *b, int depth)
{
    if (json_is_object(a) && json_is_object(b) && depth < 64) {
        const char *k;
        json_t *va;
        ls_status st = LS_OK;
        json_object_foreach((json_t *)a, k, va) {
            char *p = child_path(path, k);
            if (!p) return ls_fail(c->err, LS_E_NOMEM, "diff: out of memory");
            st = diff_value(c, p, va, json_object_get(b, k), depth + 1);
            free(p);
            if (st != LS_OK) return st;
        }
        json_t *vb;
        json_object_foreach((json_t *)b, k, vb) {
            if (json_object_get(a, k)) continue;
            char *p = child_path(path, k);
            if (!p) return ls_fail(c->err, LS_E_NOMEM, "diff: out of memory");
            st = add_change(c, p, NULL, vb);
            free(p);
            if (st != LS_OK) return st;
        }
        return LS_OK;
    }
    if (json_is_array(a) && json_is_array(b) && json_array_size(a) == json_array_size(b) &&
        depth < 64) {
        for (size_t i = 0; i < json_array_size(a); i++) {
            char p[4096];
            if ((size_t)snprintf(p, sizeof p, "%s[%zu]", path, i) >= sizeof p)
                return add_change(c, path, a, b);
            LS_TRY(diff_value(c, p, json_array_get(a, i), json_array_get(b, i), depth + 1));
        }
        return LS_OK;
    }
    if (a && b && json_equal((json_t *)a, (json_t *)b)) return LS_OK;
    return add_change(c, path, a, b);
}

ls_status ls_manifest_diff(const json_t *old_m, const json_t *new_m, ls_manifest_delta *out,
                           ls_error *err)
{
    memset(out, 0, sizeof *out);
    diff_ctx c = {out, 0, old_m, new_m, err};
    ls_status st = diff_value(&c, "", old_m, new_m, 0);
    if (st != LS_OK) ls_manifest_diff_free(out);
    return st;
}

void ls_manifest_diff_free(ls_manifest_delta *d)
{
    if (!d) return;
    for (size_t i = 0; i < d->count; i++) {
        free(d->changes[i].path);
        free(d->changes[i].old_value);
        free(d->changes[i].new_value);
    }
    free(d->changes);
    memset(d, 0, sizeof *d);
}

ls_status ls_manifest_verify(const json_t *pinned, const ls_manifest_opts *live_opts,
                             ls_manifest_delta *out, ls_error *err)
{
    memset(out, 0, sizeof *out);
    json_t *live;
    LS_TRY(ls_manifest_build(live_opts, &live, err));
    ls_status st = ls_manifest_diff(pinned, live, out, err);
    json_decref(live);
    return st;
}
