/* Fingerprints (Merkle encoding, shard independence, threads), the provider
 * registry, and manifests (pin, diff, verify, malformed input, schema). */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/providers.h"
#include "fingerprint/fingerprint.h"
#include "io/checkpoint.h"
#include "manifest/manifest.h"
#include "st_image.h"
#include "testutil.h"

/* ---- fixtures ---------------------------------------------------------------- */

static const char config_json[] =
    "{\"model_type\": \"qwen3_next\", \"hidden_size\": 64, \"num_hidden_layers\": 2,\n"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16,\n"
    " \"num_experts\": 4, \"num_experts_per_tok\": 2, \"vocab_size\": 128,\n"
    " \"rope_theta\": 10000000.0, \"partial_rotary_factor\": 0.25, \"rms_norm_eps\": 1e-06,\n"
    " \"norm_topk_prob\": true, \"tie_word_embeddings\": false}\n";

/* Six tensors; data derived from the name, so the bytes do not depend on the
 * file they are written to. */
static const st_spec specs[] = {
    {"model.embed_tokens.weight", "BF16", 2, {128, 64}, 2, NULL},
    {"model.layers.0.input_layernorm.weight", "BF16", 1, {64}, 2, NULL},
    {"model.layers.0.mlp.gate.weight", "BF16", 2, {4, 64}, 2, NULL},
    {"model.layers.1.input_layernorm.weight", "F32", 1, {64}, 4, NULL},
    {"model.norm.weight", "BF16", 1, {64}, 2, NULL},
    {"lm_head.weight", "BF16", 2, {128, 64}, 2, NULL},
};
#define NSPECS (sizeof specs / sizeof specs[0])

/* One model.safetensors with all tensors. Caller frees the path. */
static char *make_single(void)
{
    char *dir = ls_test_tmpdir("ck1");
    ls_test_write_text(dir, "config.json", config_json);
    st_write_file(dir, "model.safetensors", specs, NSPECS);
    return dir;
}

/* The same tensors in three shards, in a different order inside each file. */
static char *make_sharded(void)
{
    char *dir = ls_test_tmpdir("ck3");
    ls_test_write_text(dir, "config.json", config_json);
    st_spec a[] = {specs[5], specs[0]}, b[] = {specs[3], specs[1]}, c[] = {specs[4], specs[2]};
    st_write_file(dir, "model-00001-of-00003.safetensors", a, 2);
    st_write_file(dir, "model-00002-of-00003.safetensors", b, 2);
    st_write_file(dir, "model-00003-of-00003.safetensors", c, 2);
    const char *names[] = {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                           "model-00003-of-00003.safetensors"};
    const st_spec *parts[] = {a, b, c};
    char idx[4096];
    size_t k = (size_t)snprintf(idx, sizeof idx, "{\"metadata\": {}, \"weight_map\": {");
    for (int s = 0; s < 3; s++)
        for (int t = 0; t < 2; t++)
            k += (size_t)snprintf(idx + k, sizeof idx - k, "%s\"%s\": \"%s\"", (s || t) ? ", " : "",
                                  parts[s][t].name, names[s]);
    snprintf(idx + k, sizeof idx - k, "}}\n");
    ls_test_write_text(dir, "model.safetensors.index.json", idx);
    return dir;
}

static void fingerprint_dir(const char *dir, int threads, ls_checkpoint **ck, ls_fingerprint *fp)
{
    ls_error err;
    ls_error_clear(&err);
    ck_assert_msg(ls_checkpoint_open(dir, ck, &err) == LS_OK, "%s", err.msg);
    ls_fingerprint_opts o = {threads, 0};
    ck_assert_msg(ls_fingerprint_checkpoint(*ck, &o, fp, &err) == LS_OK, "%s", err.msg);
}

static void hex_of(const ls_digest *d, char out[65]) { ls_digest_to_hex(d, out); }

/* Flips one byte of a tensor's data in place (offset within the data region). */
static void flip_byte(const char *dir, const char *file, const char *tensor)
{
    ls_checkpoint *ck;
    ls_error err;
    ck_assert_int_eq(ls_checkpoint_open(dir, &ck, &err), LS_OK);
    const ls_tensor *t = ls_checkpoint_find(ck, tensor);
    ck_assert_ptr_nonnull(t);
    uint64_t off = t->file_offset_bytes + 3;
    ls_checkpoint_close(ck);
    char path[4300];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, (long)off, SEEK_SET), 0);
    int c = fgetc(f);
    ck_assert_int_eq(fseek(f, (long)off, SEEK_SET), 0);
    fputc(c ^ 0x01, f);
    fclose(f);
}

/* ---- Merkle encoding ----------------------------------------------------------- */

START_TEST(test_merkle_shapes_of_tree)
{
    ls_error err;
    ls_digest l[3], root, want, empty;
    for (int i = 0; i < 3; i++) memset(l[i].bytes, 0x11 * (i + 1), 32);
    /* empty = SHA-256("") */
    ck_assert_int_eq(ls_fingerprint_merkle_root(l, 0, &root, &err), LS_OK);
    ck_assert_int_eq(ls_sha256_buf("", 0, &empty, &err), LS_OK);
    ck_assert(ls_digest_equal(&root, &empty));
    /* one leaf: the root is the leaf */
    ck_assert_int_eq(ls_fingerprint_merkle_root(l, 1, &root, &err), LS_OK);
    ck_assert(ls_digest_equal(&root, &l[0]));
    /* three leaves: H(01 || H(01 || l0 || l1) || l2), the odd leaf promoted */
    uint8_t buf[65];
    buf[0] = 1;
    memcpy(buf + 1, l[0].bytes, 32);
    memcpy(buf + 33, l[1].bytes, 32);
    ls_digest n01;
    ck_assert_int_eq(ls_sha256_buf(buf, 65, &n01, &err), LS_OK);
    memcpy(buf + 1, n01.bytes, 32);
    memcpy(buf + 33, l[2].bytes, 32);
    ck_assert_int_eq(ls_sha256_buf(buf, 65, &want, &err), LS_OK);
    ck_assert_int_eq(ls_fingerprint_merkle_root(l, 3, &root, &err), LS_OK);
    ck_assert(ls_digest_equal(&root, &want));
}
END_TEST

START_TEST(test_leaf_encoding_bytes)
{
    /* leaf = SHA-256(00 || "a.w" 00 "BF16" 00 u32le(2) u64le(3) u64le(5) || digest) */
    ls_error err;
    ls_digest td, leaf, want;
    memset(td.bytes, 0xab, 32);
    int64_t shape[2] = {3, 5};
    ck_assert_int_eq(ls_fingerprint_hash_leaf("a.w", "BF16", 2, shape, &td, &leaf, &err), LS_OK);
    uint8_t buf[128];
    size_t k = 0;
    buf[k++] = 0;
    memcpy(buf + k, "a.w", 3), k += 3;
    buf[k++] = 0;
    memcpy(buf + k, "BF16", 4), k += 4;
    buf[k++] = 0;
    const uint8_t dims[20] = {2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0};
    memcpy(buf + k, dims, 20), k += 20;
    memcpy(buf + k, td.bytes, 32), k += 32;
    ck_assert_int_eq(ls_sha256_buf(buf, k, &want, &err), LS_OK);
    ck_assert(ls_digest_equal(&leaf, &want));
    ck_assert_int_eq(ls_fingerprint_hash_leaf("x", "BF16", 9, shape, &td, &leaf, &err), LS_E_USAGE);
}
END_TEST

/* ---- checkpoint fingerprints ------------------------------------------------------- */

START_TEST(test_root_independent_of_shards_and_threads)
{
    char *d1 = make_single(), *d3 = make_sharded();
    ls_checkpoint *c1, *c3, *c1b;
    ls_fingerprint f1, f3, f1b;
    fingerprint_dir(d1, 1, &c1, &f1);
    fingerprint_dir(d3, 3, &c3, &f3);
    fingerprint_dir(d1, 4, &c1b, &f1b);
    ck_assert_uint_eq(f1.count, NSPECS);
    ck_assert_uint_eq(f3.count, NSPECS);
    char a[65], b[65];
    for (size_t i = 0; i < f1.count; i++) {
        ck_assert_str_eq(f1.tensors[i].name, f3.tensors[i].name);
        hex_of(&f1.tensors[i].digest, a);
        hex_of(&f3.tensors[i].digest, b);
        ck_assert_msg(strcmp(a, b) == 0, "tensor %s: %s vs %s", f1.tensors[i].name, a, b);
        /* the digest is SHA-256 of the bytes as stored */
        const ls_tensor *t = ls_checkpoint_find(c1, f1.tensors[i].name);
        ls_digest direct;
        ls_error err;
        ck_assert_int_eq(ls_sha256_buf(t->data, t->size_bytes, &direct, &err), LS_OK);
        ck_assert(ls_digest_equal(&direct, &f1.tensors[i].digest));
    }
    hex_of(&f1.merkle_root, a);
    hex_of(&f3.merkle_root, b);
    ck_assert_str_eq(a, b);
    ck_assert(ls_digest_equal(&f1.merkle_root, &f1b.merkle_root));
    ck_assert(ls_digest_equal(&f1.config_digest, &f3.config_digest));
    ck_assert_uint_eq(f1.total_bytes, f3.total_bytes);
    ls_fingerprint_free(&f1);
    ls_fingerprint_free(&f3);
    ls_fingerprint_free(&f1b);
    ls_checkpoint_close(c1);
    ls_checkpoint_close(c3);
    ls_checkpoint_close(c1b);

    /* The CLI prints the same root for both layouts. */
    char *o1, *o3;
    ck_assert_int_eq(ls_test_cli(&o1, "fingerprint --checkpoint %s --threads 1", d1), 0);
    ck_assert_int_eq(ls_test_cli(&o3, "fingerprint --checkpoint %s --threads 2", d3), 0);
    ck_assert_ptr_nonnull(strstr(o1, a));
    ck_assert_ptr_nonnull(strstr(o3, a));
    free(o1);
    free(o3);
    free(d1);
    free(d3);
}
END_TEST

/* An independent implementation (Python hashlib, written from
 * manifest/README.md) gives the same root as lockstep. */
START_TEST(test_root_matches_reference_script)
{
    char *d3 = make_sharded();
    char *out, *ref;
    ck_assert_int_eq(ls_test_cli(&out, "fingerprint --checkpoint %s --json", d3), 0);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    ck_assert_msg(j != NULL, "fingerprint --json output is not JSON: %s", out);
    const char *root = json_string_value(json_object_get(j, "merkle_root"));
    const char *cfg = json_string_value(json_object_get(j, "config_sha256"));
    ck_assert_ptr_nonnull(root);
    ck_assert_int_eq(ls_test_sh(&ref, "/usr/bin/python3 %s/tests/merkle_reference.py %s",
                                LS_SOURCE_DIR, d3), 0);
    char want[200];
    snprintf(want, sizeof want, "merkle_root %s\nconfig_sha256 %s\n", root, cfg);
    ck_assert_str_eq(ref, want);
    json_decref(j);
    free(out);
    free(ref);
    free(d3);
}
END_TEST

START_TEST(test_fingerprint_cli_errors)
{
    char *out;
    ck_assert_int_eq(ls_test_cli(&out, "fingerprint"), 2);
    ck_assert_ptr_nonnull(strstr(out, "--checkpoint"));
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "fingerprint --checkpoint /nonexistent-dir-for-test"), 2);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "fingerprint --checkpoint . --threads zero"), 2);
    ck_assert_ptr_nonnull(strstr(out, "--threads"));
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "fingerprint --help"), 0);
    ck_assert_ptr_nonnull(strstr(out, "Merkle"));
    free(out);
}
END_TEST

/* ---- provider registry ---------------------------------------------------------------- */

START_TEST(test_registry_cpu_rows)
{
    static const char *const ops[] = {
        "linear", "rmsnorm", "gated_rmsnorm", "conv_silu", "gdn_gates", "l2norm",
        "gdn_recurrent", "rope", "attention", "router_softmax", "topk", "renormalise",
        "experts", "combine", "shared_expert", "lm_head", "logprobs", "lp_summary", "sampling",
        "digest", NULL};
    size_t n;
    const ls_provider *rows = ls_backend_list_providers("cpu", &n);
    ck_assert_ptr_nonnull(rows);
    ck_assert_uint_eq(n, 20);
    for (size_t i = 0; ops[i]; i++) {
        const ls_provider *p = ls_backend_find_provider("cpu", ops[i]);
        ck_assert_msg(p != NULL, "no cpu provider for %s", ops[i]);
        ck_assert_str_eq(p->mode, "strict");
        ck_assert_str_eq(p->tier, "portable");
        ck_assert_str_eq(p->split_policy, "none");
        ck_assert(p->reduction_order[0] != '\0');
    }
    ck_assert_str_eq(ls_backend_find_provider("cpu", "linear")->reduction_order,
                     "dot32-lanes32-butterfly");
    ck_assert_str_eq(ls_backend_find_provider("cpu", "attention")->reduction_order,
                     "online-softmax-block32");
    ck_assert_str_eq(ls_backend_find_provider("cpu", "topk")->reduction_order,
                     "sequential-topk-order");
    ck_assert_ptr_nonnull(ls_backend_list_providers("cuda", &n));
    ck_assert_ptr_null(ls_backend_list_providers("tpu", &n));
    ck_assert_uint_eq(n, 0);
}
END_TEST

/* ---- manifests ------------------------------------------------------------------------------ */

/* Pins dir into dir/../<name>.json through the CLI; returns the path. */
static char *pin(const char *dir, const char *name, const char *extra)
{
    char *path = malloc(4400);
    snprintf(path, 4400, "%s.%s.json", dir, name);
    char *out;
    int rc = ls_test_cli(&out, "manifest pin --checkpoint %s %s -o %s", dir, extra ? extra : "", path);
    ck_assert_msg(rc == 0, "pin failed (%d): %s", rc, out);
    free(out);
    return path;
}

START_TEST(test_pin_diff_self_identical)
{
    char *d = make_single();
    char *m = pin(d, "a", NULL);
    char *out;
    ck_assert_int_eq(ls_test_cli(&out, "manifest diff %s %s", m, m), 0);
    ck_assert_ptr_nonnull(strstr(out, "0 differences"));
    free(out);
    /* the manifest holds what was asked for */
    json_t *j;
    ls_error err;
    ck_assert_msg(ls_manifest_load(m, &j, &err) == LS_OK, "%s", err.msg);
    json_t *ck = json_object_get(j, "checkpoint");
    ck_assert_int_eq(json_integer_value(json_object_get(ck, "tensor_count")), NSPECS);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "architecture"), "model_type")),
                     "qwen3_next");
    json_t *num = json_object_get(j, "numerics");
    ck_assert_str_eq(json_string_value(json_object_get(num, "mode")), "strict");
    ck_assert(json_is_null(json_object_get(num, "perturbation")));
    ck_assert_uint_eq(json_object_size(json_object_get(num, "operators")), 20);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(j, "topology"), "world_size")), 1);
    ck_assert_uint_eq(json_string_length(json_object_get(json_object_get(j, "build"), "binary_sha256")), 64);
    json_decref(j);
    free(m);
    free(d);
}
END_TEST

START_TEST(test_tensor_byte_change_voids)
{
    char *d = make_single();
    char *a = pin(d, "before", NULL);
    flip_byte(d, "model.safetensors", "model.layers.0.mlp.gate.weight");
    char *b = pin(d, "after", NULL);
    char *out;
    ck_assert_int_eq(ls_test_cli(&out, "manifest diff %s %s", a, b), 1);
    ck_assert_msg(strstr(out, "voiding") &&
                      strstr(out, "checkpoint.tensors[\"model.layers.0.mlp.gate.weight\"].sha256"),
                  "diff does not name the tensor: %s", out);
    ck_assert_ptr_nonnull(strstr(out, "checkpoint.merkle_root"));
    free(out);
    /* --json lists it too */
    ck_assert_int_eq(ls_test_cli(&out, "manifest diff --json %s %s", a, b), 1);
    json_t *j = json_loads(out, 0, NULL);
    ck_assert_ptr_nonnull(j);
    ck_assert_str_eq(json_string_value(json_object_get(j, "verdict")), "voided");
    ck_assert_int_ge(json_integer_value(json_object_get(j, "voiding")), 2);
    json_decref(j);
    free(out);
    free(a);
    free(b);
    free(d);
}
END_TEST

START_TEST(test_host_name_change_is_informational)
{
    char *d = make_single();
    char *a = pin(d, "host", NULL);
    json_t *j;
    ls_error err;
    ck_assert_int_eq(ls_manifest_load(a, &j, &err), LS_OK);
    json_object_set_new(json_object_get(j, "runtime"), "host_name",
                        json_string("another-host.example"));
    char b[4400];
    snprintf(b, sizeof b, "%s.host2.json", d);
    ck_assert_int_eq(ls_manifest_save(j, b, &err), LS_OK);
    json_decref(j);
    char *out;
    ck_assert_int_eq(ls_test_cli(&out, "manifest diff %s %s", a, b), 0);
    ck_assert_msg(strstr(out, "informational runtime.host_name") != NULL, "%s", out);
    ck_assert_ptr_nonnull(strstr(out, "another-host.example"));
    ck_assert_ptr_nonnull(strstr(out, "0 voiding"));
    free(out);
    free(a);
    free(d);
}
END_TEST

START_TEST(test_classification_rules)
{
    json_t *clean = json_pack("{s:{s:s}, s:{s:s}}", "build", "source_revision", "0123abc",
                              "numerics", "backend", "cpu");
    json_t *dirty = json_pack("{s:{s:s}, s:{s:s}}", "build", "source_revision", "0123abc-dirty",
                              "numerics", "backend", "cpu");
    json_t *cuda = json_pack("{s:{s:s}, s:{s:s}}", "build", "source_revision", "0123abc",
                             "numerics", "backend", "cuda");
    ck_assert_int_eq(ls_manifest_classify("runtime.host_name", clean, clean), LS_CHANGE_INFORMATIONAL);
    ck_assert_int_eq(ls_manifest_classify("runtime.pinned_at", clean, clean), LS_CHANGE_INFORMATIONAL);
    ck_assert_int_eq(ls_manifest_classify("checkpoint.path", clean, clean), LS_CHANGE_INFORMATIONAL);
    ck_assert_int_eq(ls_manifest_classify("checkpoint.merkle_root", clean, clean), LS_CHANGE_VOIDING);
    ck_assert_int_eq(ls_manifest_classify("numerics.operators.linear.reduction_order", clean, clean),
                     LS_CHANGE_VOIDING);
    ck_assert_int_eq(ls_manifest_classify("build.binary_sha256", clean, clean), LS_CHANGE_INFORMATIONAL);
    ck_assert_int_eq(ls_manifest_classify("build.binary_sha256", clean, dirty), LS_CHANGE_VOIDING);
    ck_assert_int_eq(ls_manifest_classify("build.source_revision", clean, clean), LS_CHANGE_VOIDING);
    ck_assert_int_eq(ls_manifest_classify("runtime.gpu", clean, clean), LS_CHANGE_INFORMATIONAL);
    ck_assert_int_eq(ls_manifest_classify("runtime.gpu.sm_count", cuda, cuda), LS_CHANGE_VOIDING);
    ck_assert_int_eq(ls_manifest_classify("runtime.gpu.uuid", cuda, cuda), LS_CHANGE_INFORMATIONAL);
    ck_assert_int_eq(ls_manifest_classify("runtime.gpu.device_index", cuda, cuda),
                     LS_CHANGE_INFORMATIONAL);
    ck_assert_int_eq(ls_manifest_classify("runtime.host_names", clean, clean), LS_CHANGE_VOIDING);
    ck_assert_int_eq(ls_manifest_classify("topology.tp_degree", clean, clean), LS_CHANGE_VOIDING);
    {
        /* docs/parallel.md §4: informational between strict manifests of the
         * same numerics and reduction tree; voiding in fast mode, across
         * other numerics or another tree, and for unknown topology fields */
        json_t *s1 = json_pack("{s:{s:s, s:s, s:{s:{s:s}}}, s:{s:i, s:s}}", "numerics", "backend", "cuda", "mode",
                               "strict", "operators", "linear", "reduction_order", "dot32", "topology",
                               "ep_degree", 1, "communicator", "none");
        json_t *s2 = json_deep_copy(s1), *old = json_deep_copy(s1), *fast = json_deep_copy(s1);
        json_t *tree = json_deep_copy(s1), *other = json_deep_copy(s1);
        json_object_set_new(json_object_get(s2, "topology"), "ep_degree", json_integer(2));
        json_object_set_new(json_object_get(s2, "topology"), "communicator", json_string("cpu-socket"));
        json_object_del(json_object_get(old, "topology"), "communicator"); /* pinned before the field */
        json_object_set_new(json_object_get(fast, "numerics"), "mode", json_string("fast"));
        json_object_set_new(json_object_get(tree, "topology"), "reduction_tree", json_string("k8-binary"));
        json_object_set_new(json_object_get(json_object_get(json_object_get(other, "numerics"), "operators"),
                                            "linear"), "reduction_order", json_string("dot32-k8-tree"));
        const char *leaves[] = {"topology.ep_degree", "topology.world_size", "topology.tp_degree",
                                "topology.communicator", "topology.afd", "topology.afd.ffn_ranks",
                                "runtime.gpu.nccl_version", "runtime.gpus[1].name"};
        for (size_t i = 0; i < sizeof leaves / sizeof *leaves; i++) {
            ck_assert_msg(ls_manifest_classify(leaves[i], s1, s2) == LS_CHANGE_INFORMATIONAL, "%s", leaves[i]);
            ck_assert_msg(ls_manifest_classify(leaves[i], old, s2) == LS_CHANGE_INFORMATIONAL, "%s", leaves[i]);
            ck_assert_msg(ls_manifest_classify(leaves[i], fast, s2) == LS_CHANGE_VOIDING, "%s", leaves[i]);
            ck_assert_msg(ls_manifest_classify(leaves[i], tree, s2) == LS_CHANGE_VOIDING, "%s", leaves[i]);
            ck_assert_msg(ls_manifest_classify(leaves[i], other, s2) == LS_CHANGE_VOIDING, "%s", leaves[i]);
        }
        ck_assert_int_eq(ls_manifest_classify("topology.reduction_tree", s1, tree), LS_CHANGE_VOIDING);
        ck_assert_int_eq(ls_manifest_classify("topology.ranks_per_node", s1, s2), LS_CHANGE_VOIDING);
        /* the claim: one digest for EP1 and EP2 (and a manifest pinned before
         * the fields), another for another tree */
        ls_digest d1, d2, d3, d4;
        ls_error derr;
        ck_assert_int_eq(ls_manifest_digest(s1, &d1, &derr), LS_OK);
        ck_assert_int_eq(ls_manifest_digest(s2, &d2, &derr), LS_OK);
        ck_assert_int_eq(ls_manifest_digest(old, &d3, &derr), LS_OK);
        ck_assert_int_eq(ls_manifest_digest(tree, &d4, &derr), LS_OK);
        ck_assert(ls_digest_equal(&d1, &d2) && ls_digest_equal(&d1, &d3) && !ls_digest_equal(&d1, &d4));
        json_decref(s1);
        json_decref(s2);
        json_decref(old);
        json_decref(fast);
        json_decref(tree);
        json_decref(other);
    }
    ck_assert_int_eq(ls_manifest_classify("some.unknown.field", clean, clean), LS_CHANGE_VOIDING);
    /* kernel code changed under an otherwise equal row: informational */
    ck_assert_int_eq(ls_manifest_classify("numerics.operators.linear.code_sha256", cuda, cuda),
                     LS_CHANGE_INFORMATIONAL);
    ck_assert_int_eq(ls_manifest_classify("numerics.operators.linear.kernel_id", cuda, cuda),
                     LS_CHANGE_VOIDING);
    ck_assert_int_eq(ls_manifest_classify("numerics.code_sha256", cuda, cuda), LS_CHANGE_VOIDING);
    ck_assert_int_eq(ls_manifest_classify("build.code_sha256", cuda, cuda), LS_CHANGE_VOIDING);
    json_decref(clean);
    json_decref(dirty);
    json_decref(cuda);
}
END_TEST

START_TEST(test_perturbation_and_mode_void)
{
    char *d = make_single();
    char *a = pin(d, "strict", NULL);
    char *b = pin(d, "perturbed", "--perturb attention@layer3:split-kv");
    char *out;
    ck_assert_int_eq(ls_test_cli(&out, "manifest diff %s %s", a, b), 1);
    ck_assert_ptr_nonnull(strstr(out, "voiding       numerics.mode: \"strict\" -> \"fast\""));
    ck_assert_ptr_nonnull(strstr(out, "numerics.perturbation: null -> \"attention@layer3:split-kv\""));
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "manifest pin --checkpoint %s --mode strict --perturb x -o -", d), 2);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "manifest pin --checkpoint %s --backend tpu -o -", d), 2);
    ck_assert_ptr_nonnull(strstr(out, "tpu"));
    free(out);
    /* the CUDA backend registers its portable strict providers */
    size_t nc = 0;
    const ls_provider *cr = ls_backend_list_providers("cuda", &nc);
    ck_assert_ptr_nonnull(cr);
    ck_assert_ptr_nonnull(ls_backend_find_provider("cuda", "gdn_recurrent"));
    ck_assert_str_eq(ls_backend_find_provider("cuda", "gdn_recurrent")->kernel_id,
                     "ls_gdn_recurrent_kernel+ls_gdn_decode_kernel");
    /* pinning them probes the GPU (reduction fingerprints): where there is
     * none, the pin fails closed naming the backend instead of pinning names */
    int rc = ls_test_cli(&out, "manifest pin --checkpoint %s --backend cuda -o -", d);
    if (rc == 0) {
        ck_assert_ptr_nonnull(strstr(out, "cuda-portable"));
        ck_assert_ptr_nonnull(strstr(out, "reduction_fingerprint"));
    } else {
        ck_assert_int_eq(rc, 2);
        ck_assert_msg(strstr(out, "cuda is not available"), "%s", out);
    }
    free(out);
    /* --gpu chooses a CUDA device: refused with the cpu backend (given at
     * all, even 0), and a device the machine lacks is named with those it has */
    for (const char *g = "0\0" "1\0"; *g; g += strlen(g) + 1) {
        ck_assert_int_eq(ls_test_cli(&out, "manifest pin --checkpoint %s --gpu %s -o -", d, g), 2);
        ck_assert_msg(strstr(out, "--gpu applies to --backend cuda only"), "%s", out);
        free(out);
        ck_assert_int_eq(ls_test_cli(&out, "manifest verify %s --checkpoint %s --backend cpu --gpu %s",
                                     a, d, g), 2);
        ck_assert_msg(strstr(out, "--gpu applies to --backend cuda only"), "%s", out);
        free(out);
    }
    ck_assert_int_eq(ls_test_cli(&out, "manifest pin --checkpoint %s --backend cuda --gpu 4096 -o -",
                                 d), 2);
    ck_assert_msg(strstr(out, "no CUDA device 4096") && (strstr(out, "this machine has") ||
                                                         strstr(out, "built without CUDA")),
                  "%s", out);
    free(out);
    free(a);
    free(b);
    free(d);
}
END_TEST

static void expect_bad(const char *dir, const char *tag, const char *text, const char *needle)
{
    char path[4400];
    snprintf(path, sizeof path, "%s.bad-%s.json", dir, tag);
    ls_test_write(path, text, strlen(text));
    char *out;
    int rc = ls_test_cli(&out, "manifest diff %s %s", path, path);
    ck_assert_msg(rc == 2, "%s: exit %d, want 2: %s", tag, rc, out);
    ck_assert_msg(strstr(out, path) && strstr(out, needle), "%s: message lacks file or '%s': %s",
                  tag, needle, out);
    ck_assert_msg(strchr(out, '\n') == out + strlen(out) - 1, "%s: more than one line: %s", tag, out);
    free(out);
}

START_TEST(test_malformed_manifests)
{
    char *d = make_single();
    char *m = pin(d, "good", NULL);
    expect_bad(d, "notjson", "{\"manifest_version\": 1,", "invalid JSON");
    expect_bad(d, "array", "[1, 2]", "JSON object");
    expect_bad(d, "version", "{\"manifest_version\": 2}", "manifest_version");
    expect_bad(d, "nover", "{}", "manifest_version");
    expect_bad(d, "dup", "{\"manifest_version\": 1, \"manifest_version\": 1}", "duplicate");
    expect_bad(d, "nock", "{\"manifest_version\": 1}", "checkpoint");

    /* Structural edits of a good manifest. */
    ls_error err;
    json_t *j;
    ck_assert_int_eq(ls_manifest_load(m, &j, &err), LS_OK);
    json_t *tensors = json_object_get(json_object_get(j, "checkpoint"), "tensors");
    json_t *t = json_object_get(tensors, "model.norm.weight");
    json_t *orig = json_deep_copy(t);

    json_object_set_new(t, "sha256", json_string("00"));
    char *s = json_dumps(j, 0);
    expect_bad(d, "shortsha", s, "checkpoint.tensors[\"model.norm.weight\"].sha256");
    free(s);

    json_object_set_new(t, "sha256", json_string("0000000000000000000000000000000000000000000000000000000000000000"));
    s = json_dumps(j, 0);
    expect_bad(d, "merkle", s, "checkpoint.merkle_root");
    free(s);

    json_object_set(tensors, "model.norm.weight", orig);
    json_object_set_new(json_object_get(j, "numerics"), "mode", json_integer(3));
    s = json_dumps(j, 0);
    expect_bad(d, "mode", s, "numerics.mode");
    free(s);

    json_object_set_new(json_object_get(j, "numerics"), "mode", json_string("strict"));
    json_object_set_new(json_object_get(j, "topology"), "tp_degree", json_integer(0));
    s = json_dumps(j, 0);
    expect_bad(d, "tp", s, "topology.tp_degree");
    free(s);
    json_t *topo = json_object_get(j, "topology");
    json_object_set_new(topo, "tp_degree", json_integer(1));
    json_object_set_new(topo, "ep_degree", json_integer(2)); /* world_size 1 */
    s = json_dumps(j, 0);
    expect_bad(d, "world", s, "topology.world_size");
    free(s);
    json_object_set_new(topo, "world_size", json_integer(2));
    json_object_set_new(topo, "communicator", json_string("none")); /* two ranks need one */
    s = json_dumps(j, 0);
    expect_bad(d, "comm", s, "topology.communicator");
    free(s);
    json_object_set_new(topo, "communicator", json_string("mpi"));
    s = json_dumps(j, 0);
    expect_bad(d, "comm2", s, "topology.communicator");
    free(s);
    json_object_set_new(topo, "communicator", json_string("cpu-socket"));
    json_object_set_new(topo, "reduction_tree", json_string("ring"));
    s = json_dumps(j, 0);
    expect_bad(d, "tree", s, "topology.reduction_tree");
    free(s);
    json_object_set_new(topo, "reduction_tree", json_string("none"));
    json_object_set_new(topo, "ranks_per_node", json_integer(2));
    s = json_dumps(j, 0);
    expect_bad(d, "extra", s, "topology.ranks_per_node");
    free(s);
    json_object_del(topo, "ranks_per_node");
    json_object_set_new(topo, "world_size", json_integer(1));
    json_object_set_new(topo, "ep_degree", json_integer(1));
    json_object_set_new(topo, "communicator", json_string("none"));
    json_decref(orig);
    json_decref(j);

    char *out;
    ck_assert_int_eq(ls_test_cli(&out, "manifest diff %s /nonexistent-manifest.json", m), 2);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "manifest diff %s", m), 2);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "manifest frobnicate"), 2);
    free(out);
    free(m);
    free(d);
}
END_TEST

START_TEST(test_verify_pass_then_fail)
{
    char *d = make_sharded();
    char *m = pin(d, "v", NULL);
    char *out;
    ck_assert_int_eq(ls_test_cli(&out, "manifest verify %s --checkpoint %s", m, d), 0);
    ck_assert_ptr_nonnull(strstr(out, "verify: OK"));
    free(out);
    /* another backend voids the claim */
    ck_assert_int_eq(ls_test_cli(&out, "manifest verify %s --checkpoint %s --mode fast", m, d), 1);
    ck_assert_ptr_nonnull(strstr(out, "numerics"));
    free(out);
    flip_byte(d, "model-00002-of-00003.safetensors", "model.layers.0.input_layernorm.weight");
    ck_assert_int_eq(ls_test_cli(&out, "manifest verify %s --checkpoint %s", m, d), 1);
    ck_assert_msg(strstr(out, "FAILED: checkpoint.tensors[\"model.layers.0.input_layernorm.weight\"].sha256") != NULL,
                  "first mismatch not named: %s", out);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "manifest verify %s", m), 2);
    free(out);
    free(m);
    free(d);
}
END_TEST

START_TEST(test_build_in_process_and_digest)
{
    char *d = make_single();
    ls_error err;
    ls_checkpoint *ck;
    ck_assert_int_eq(ls_checkpoint_open(d, &ck, &err), LS_OK);
    ls_manifest_opts o = ls_manifest_opts_default();
    o.checkpoint = ck;
    o.threads = 2;
    o.providers = ls_backend_list_providers("cpu", &o.n_providers);
    json_t *m;
    ck_assert_msg(ls_manifest_build(&o, &m, &err) == LS_OK, "%s", err.msg);
    ck_assert_int_eq(ls_manifest_validate(m, "built", &err), LS_OK);
    ls_digest d1, d2;
    ck_assert_int_eq(ls_manifest_digest(m, &d1, &err), LS_OK);
    /* save + load gives the same digest (canonical form, not the file's bytes) */
    char path[4400];
    snprintf(path, sizeof path, "%s.inproc.json", d);
    ck_assert_int_eq(ls_manifest_save(m, path, &err), LS_OK);
    json_t *back;
    ck_assert_int_eq(ls_manifest_load(path, &back, &err), LS_OK);
    ck_assert_int_eq(ls_manifest_digest(back, &d2, &err), LS_OK);
    ck_assert(ls_digest_equal(&d1, &d2));
    char hex[65], *out;
    ls_digest_to_hex(&d1, hex);
    ck_assert_int_eq(ls_test_cli(&out, "manifest digest %s", path), 0);
    ck_assert_ptr_nonnull(strstr(out, hex));
    free(out);
    /* the digest is the claim's: informational changes (host, pin time)
     * keep it, a voiding change (the numerics mode) moves it */
    json_object_set_new(json_object_get(back, "runtime"), "host_name", json_string("x"));
    json_object_set_new(json_object_get(back, "runtime"), "pinned_at", json_string("2001-01-01T00:00:00Z"));
    ck_assert_int_eq(ls_manifest_digest(back, &d2, &err), LS_OK);
    ck_assert(ls_digest_equal(&d1, &d2));
    json_object_set_new(json_object_get(back, "numerics"), "mode", json_string("fast"));
    ck_assert_int_eq(ls_manifest_digest(back, &d2, &err), LS_OK);
    ck_assert(!ls_digest_equal(&d1, &d2));
    /* verify in process */
    ls_manifest_delta delta;
    ck_assert_int_eq(ls_manifest_verify(m, &o, &delta, &err), LS_OK);
    ck_assert_uint_eq(delta.voiding, 0);
    ls_manifest_diff_free(&delta);
    json_decref(m);
    json_decref(back);
    ls_checkpoint_close(ck);
    free(d);
}
END_TEST

/* The tc and fast tiers' rows (providers.h ls_backend_tier_providers)
 * replace the linear, lm_head and experts rows of the CUDA registry whatever
 * their mode, and the fast tier's also the attention, combine and GDN rows
 * (the chunk-aligned form's GDN row, when asked for, wins); every other op
 * keeps its portable row; tc records its pinned GEMMs and tier
 * "tensor-core", fast mode "fast" and no records. */
START_TEST(test_tier_rows)
{
    char *d = make_single();
    ls_error err;
    ls_checkpoint *ck;
    ck_assert_int_eq(ls_checkpoint_open(d, &ck, &err), LS_OK);
    static const char *const rec[] = {
        "{\"kind\": \"linear_bf16_f32_tn\", \"n\": 1000, \"k\": 128, \"algo_id\": 66, \"tile\": 7, "
        "\"stages\": 35, \"splitk\": 1, \"reduction\": 0, \"swizzle\": 0, \"custom\": 0, "
        "\"inner_shape\": 0, \"cluster_shape\": 3, \"cublaslt_version\": 130100, \"cc\": \"9.0\", "
        "\"qualified_rows\": 1024}"};
    for (int run = 0; run < 4; run++) {
        int fast = run % 2, gdn = run / 2; /* gdn: the chunk-aligned form's row, the tier's */
        ls_tier tier = fast ? LS_TIER_FAST : LS_TIER_TC;
        ls_manifest_opts o = ls_manifest_opts_default();
        o.checkpoint = ck;
        o.threads = 2;
        o.backend = "cuda";
        o.mode = fast ? "fast" : "strict";
        o.providers = ls_backend_list_providers("cuda", &o.n_providers);
        o.tier_providers = ls_backend_tier_providers("cuda", tier, &o.n_tier_providers);
        if (gdn) o.gdn_chunked = ls_backend_gdn_chunked_provider("cuda", tier);
        ck_assert_uint_eq(o.n_tier_providers, fast ? 6 : 3);
        if (!fast) {
            o.tc_gemms = rec;
            o.n_tc_gemms = 1;
        }
        json_t *m;
        ck_assert_msg(ls_manifest_build(&o, &m, &err) == LS_OK, "%s", err.msg);
        ck_assert_int_eq(ls_manifest_validate(m, "built", &err), LS_OK);
        json_t *num = json_object_get(m, "numerics"), *ops = json_object_get(num, "operators");
        const char *want = fast ? "cuda-fast" : "cuda-tensor-core";
        static const char *const tier_ops[] = {"linear", "lm_head", "experts"};
        for (size_t i = 0; i < 3; i++) {
            json_t *row = json_object_get(ops, tier_ops[i]);
            ck_assert_str_eq(json_string_value(json_object_get(row, "provider")), want);
            ck_assert_str_eq(json_string_value(json_object_get(row, "tier")), "tensor-core");
            ck_assert_ptr_null(json_object_get(row, "reduction_fingerprint"));
        }
        ck_assert_str_eq(json_string_value(json_object_get(json_object_get(ops, "experts"), "reduction_order")),
                         "wmma-k16-ascending-4slices");
        ck_assert_str_eq(json_string_value(json_object_get(json_object_get(ops, "rmsnorm"), "provider")),
                         "cuda-portable");
        static const char *const fast_ops[] = {"attention", "combine"};
        for (size_t i = 0; i < 2; i++) {
            json_t *row = json_object_get(ops, fast_ops[i]);
            ck_assert_str_eq(json_string_value(json_object_get(row, "provider")), fast ? "cuda-fast" : "cuda-portable");
            ck_assert_str_eq(json_string_value(json_object_get(row, "mode")), fast ? "fast" : "strict");
        }
        /* the chunk-aligned form's row wins over the fast tier's own GDN row */
        json_t *g = json_object_get(ops, "gdn_recurrent");
        ck_assert_str_eq(json_string_value(json_object_get(g, "provider")), gdn || fast ? want : "cuda-portable");
        ck_assert_str_eq(json_string_value(json_object_get(g, "reduction_order")),
                         gdn    ? "chunk-aligned-64-wmma-tf32"
                         : fast ? "chunked-64-from-call-start-wmma-tf32-recurrent-decode"
                                : "gdn-recurrent-dot32");
        ck_assert_int_eq(json_object_get(num, "gdn_form") != NULL, gdn);
        ck_assert_str_eq(json_string_value(json_object_get(num, "tier")), "tensor-core");
        ck_assert_str_eq(json_string_value(json_object_get(num, "mode")), fast ? "fast" : "strict");
        ck_assert_int_eq(json_object_get(num, "tc_gemms") != NULL, !fast);
        json_decref(m);
    }
    ls_checkpoint_close(ck);
    free(d);
}
END_TEST

START_TEST(test_manifest_matches_schema)
{
    char *d = make_sharded();
    char *m = pin(d, "schema", "--perturb combine:atomic");
    char *m2 = pin(d, "schema2", NULL);
    char *out;
    int rc = ls_test_sh(&out, "/usr/bin/python3 -c 'import jsonschema' 2>/dev/null");
    free(out);
    if (rc != 0) {
        /* harness/setup installs python3-jsonschema; refuse to pass silently */
        ck_abort_msg("python3-jsonschema is not installed (run harness/setup)");
    }
    const char *py =
        "import json,sys,jsonschema\n"
        "s=json.load(open(sys.argv[1]))\n"
        "jsonschema.Draft202012Validator.check_schema(s)\n"
        "for p in sys.argv[2:]:\n"
        "    jsonschema.Draft202012Validator(s).validate(json.load(open(p)))\n"
        "bad=json.load(open(sys.argv[2])); bad['topology']['world_size']='1'\n"
        "try:\n"
        "    jsonschema.Draft202012Validator(s).validate(bad); print('schema accepted a bad manifest')\n"
        "except jsonschema.ValidationError: print('ok')\n";
    char pyfile[4400];
    snprintf(pyfile, sizeof pyfile, "%s.check.py", d);
    ls_test_write(pyfile, py, strlen(py));
    rc = ls_test_sh(&out, "/usr/bin/python3 %s %s/manifest/schema.json %s %s", pyfile,
                    LS_SOURCE_DIR, m, m2);
    ck_assert_msg(rc == 0 && strcmp(out, "ok\n") == 0, "schema check failed (%d): %s", rc, out);
    free(out);
    free(m);
    free(m2);
    free(d);
}
END_TEST

/* The serving section (issue: the manifest states how the rollout was
 * served): pinned with run's flags, every field recorded; informational in
 * diff and outside the digest (none changes a bit of lockstep's engine);
 * bad values refused naming the flag, edited sections naming the field; the
 * schema takes it and refuses a bad one. */
START_TEST(test_serving_section)
{
    char *d = make_single();
    char *plain = pin(d, "plain", NULL);
    char *a = pin(d, "served-a", "--kv-page 17 --samples-per-prompt 8 --prefix-cache aligned --prefix-block 64 "
                  "--preempt seeded:3");
    char *b = pin(d, "served-b", "--kv-page 100 --prefix-cache any");
    char *k0 = pin(d, "served-k0", "--samples-per-prompt 1 --prefix-cache off --preempt none");
    ls_error err;
    ls_error_clear(&err);
    json_t *ma, *mb, *mp, *m0;
    ck_assert_msg(ls_manifest_load(a, &ma, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_manifest_load(b, &mb, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_manifest_load(plain, &mp, &err) == LS_OK, "%s", err.msg);
    ck_assert_msg(ls_manifest_load(k0, &m0, &err) == LS_OK, "%s", err.msg);
    char *sa = json_dumps(json_object_get(ma, "serving"), JSON_COMPACT | JSON_SORT_KEYS);
    char *sb = json_dumps(json_object_get(mb, "serving"), JSON_COMPACT | JSON_SORT_KEYS);
    ck_assert_str_eq(sa, "{\"kv_page\":17,\"preemption\":{\"policy\":\"seeded\",\"seed\":3},\"prefix_cache\":"
                         "{\"block\":64,\"policy\":\"aligned\"},\"samples_per_prompt\":8}");
    ck_assert_str_eq(sb, "{\"kv_page\":100,\"preemption\":{\"policy\":\"none\"},\"prefix_cache\":{\"policy\":"
                         "\"any\"},\"samples_per_prompt\":1}");
    free(sa);
    free(sb);
    /* the plain engine's values, stated or not: no section */
    ck_assert_ptr_null(json_object_get(mp, "serving"));
    ck_assert_ptr_null(json_object_get(m0, "serving"));
    /* the section sits between topology and build (the order diff reports in) */
    const char *key, *prev = NULL, *before = NULL;
    json_t *v;
    json_object_foreach(ma, key, v) {
        if (!strcmp(key, "serving")) before = prev;
        prev = key;
    }
    ck_assert_msg(before && !strcmp(before, "topology"), "serving follows %s", before ? before : "nothing");
    /* one claim: the same manifest digest */
    ls_digest da, db, dp;
    ck_assert_int_eq(ls_manifest_digest(ma, &da, &err), LS_OK);
    ck_assert_int_eq(ls_manifest_digest(mb, &db, &err), LS_OK);
    ck_assert_int_eq(ls_manifest_digest(mp, &dp, &err), LS_OK);
    ck_assert_msg(ls_digest_equal(&da, &dp) && ls_digest_equal(&db, &dp), "the serving section changed the digest");
    ck_assert_int_eq(ls_manifest_classify("serving.kv_page", ma, mb), LS_CHANGE_INFORMATIONAL);
    ck_assert_int_eq(ls_manifest_classify("serving", mp, ma), LS_CHANGE_INFORMATIONAL);
    char *out;
    ck_assert_int_eq(ls_test_cli(&out, "manifest diff %s %s", plain, a), 0);
    ck_assert_msg(strstr(out, "informational serving: (absent) -> {") && strstr(out, "0 voiding"), "%s", out);
    free(out);
    ck_assert_int_eq(ls_test_cli(&out, "manifest diff %s %s", a, b), 0);
    ck_assert_msg(strstr(out, "informational serving.kv_page: 17 -> 100") &&
                  strstr(out, "informational serving.samples_per_prompt: 8 -> 1") &&
                  strstr(out, "informational serving.prefix_cache.policy: \"aligned\" -> \"any\"") &&
                  strstr(out, "informational serving.preemption.policy: \"seeded\" -> \"none\""), "%s", out);
    free(out);
    /* bad values: exit 2, naming the flag, nothing written */
    static const struct {
        const char *flags, *needle;
    } bad[] = {{"--kv-page -1", "--kv-page -1"},
               {"--kv-page 0", "--kv-page 0: a page holds at least 1 position"},
               {"--kv-page 2000000", "--kv-page 2000000"},
               {"--samples-per-prompt 0", "--samples-per-prompt"},
               {"--prefix-cache some", "--prefix-cache"},
               {"--prefix-block 4", "--prefix-block"},
               {"--prefix-cache any --prefix-block 4", "--prefix-block"},
               {"--preempt seeded:", "--preempt"},
               {"--preempt sometimes", "--preempt"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = ls_test_cli(&out, "manifest pin --checkpoint %s %s -o %s.bad.json", d, bad[i].flags, d);
        ck_assert_msg(rc == 2 && out && strstr(out, bad[i].needle), "%s: exit %d: %s", bad[i].flags, rc, out);
        free(out);
        ck_assert_int_eq(ls_test_sh(&out, "test ! -e %s.bad.json", d), 0);
        free(out);
    }
    /* edited sections: refused naming the field */
    static const struct {
        const char *tag, *serving, *needle;
    } edits[] = {
        {"sv-type", "3", "field serving"},
        {"sv-page", "{\"kv_page\": -1, \"samples_per_prompt\": 1, \"prefix_cache\": {\"policy\": \"off\"}, "
                    "\"preemption\": {\"policy\": \"none\"}}", "serving.kv_page"},
        {"sv-samples", "{\"kv_page\": 0, \"samples_per_prompt\": 0, \"prefix_cache\": {\"policy\": \"off\"}, "
                       "\"preemption\": {\"policy\": \"none\"}}", "serving.samples_per_prompt"},
        {"sv-policy", "{\"kv_page\": 0, \"samples_per_prompt\": 1, \"prefix_cache\": {\"policy\": \"some\"}, "
                      "\"preemption\": {\"policy\": \"none\"}}", "serving.prefix_cache"},
        {"sv-block", "{\"kv_page\": 0, \"samples_per_prompt\": 1, \"prefix_cache\": {\"policy\": \"aligned\"}, "
                     "\"preemption\": {\"policy\": \"none\"}}", "serving.prefix_cache.block"},
        {"sv-anyblock", "{\"kv_page\": 0, \"samples_per_prompt\": 1, \"prefix_cache\": {\"policy\": \"any\", "
                        "\"block\": 4}, \"preemption\": {\"policy\": \"none\"}}", "serving.prefix_cache"},
        {"sv-seed", "{\"kv_page\": 0, \"samples_per_prompt\": 1, \"prefix_cache\": {\"policy\": \"off\"}, "
                    "\"preemption\": {\"policy\": \"seeded\"}}", "serving.preemption.seed"},
        {"sv-extra", "{\"kv_page\": 0, \"samples_per_prompt\": 1, \"prefix_cache\": {\"policy\": \"off\"}, "
                     "\"preemption\": {\"policy\": \"none\"}, \"page\": 3}", "field serving"}};
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        json_t *e = json_deep_copy(mp), *sv = json_loads(edits[i].serving, JSON_DECODE_ANY, NULL);
        ck_assert_ptr_nonnull(sv);
        json_object_set_new(e, "serving", sv);
        char *text = json_dumps(e, 0);
        expect_bad(d, edits[i].tag, text, edits[i].needle);
        free(text);
        json_decref(e);
    }
    /* the schema takes the section and refuses a bad one */
    const char *py = "import json,sys,jsonschema\n"
                     "v=jsonschema.Draft202012Validator(json.load(open(sys.argv[1])))\n"
                     "for p in sys.argv[2:]: v.validate(json.load(open(p)))\n"
                     "bad=json.load(open(sys.argv[2])); bad['serving']['prefix_cache']={'policy':'any','block':4}\n"
                     "print('ok' if not v.is_valid(bad) else 'schema accepted a block with policy any')\n";
    char pyfile[4400];
    snprintf(pyfile, sizeof pyfile, "%s.serving-check.py", d);
    ls_test_write(pyfile, py, strlen(py));
    int rc = ls_test_sh(&out, "/usr/bin/python3 %s %s/manifest/schema.json %s %s", pyfile, LS_SOURCE_DIR, a, b);
    ck_assert_msg(rc == 0 && out && strcmp(out, "ok\n") == 0, "schema: %s", out);
    free(out);
    json_decref(ma);
    json_decref(mb);
    json_decref(mp);
    json_decref(m0);
    free(plain), free(a), free(b), free(k0), free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("manifest");
    TCase *tc = tcase_create("all");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_merkle_shapes_of_tree);
    tcase_add_test(tc, test_leaf_encoding_bytes);
    tcase_add_test(tc, test_root_independent_of_shards_and_threads);
    tcase_add_test(tc, test_root_matches_reference_script);
    tcase_add_test(tc, test_fingerprint_cli_errors);
    tcase_add_test(tc, test_registry_cpu_rows);
    tcase_add_test(tc, test_pin_diff_self_identical);
    tcase_add_test(tc, test_tensor_byte_change_voids);
    tcase_add_test(tc, test_host_name_change_is_informational);
    tcase_add_test(tc, test_classification_rules);
    tcase_add_test(tc, test_perturbation_and_mode_void);
    tcase_add_test(tc, test_malformed_manifests);
    tcase_add_test(tc, test_verify_pass_then_fail);
    tcase_add_test(tc, test_build_in_process_and_digest);
    tcase_add_test(tc, test_tier_rows);
    tcase_add_test(tc, test_manifest_matches_schema);
    tcase_add_test(tc, test_serving_section);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
