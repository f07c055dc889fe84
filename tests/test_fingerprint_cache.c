/* The fingerprint cache (fingerprint/cache.h, ls_fingerprint_checkpoint_cached):
 * hits and misses by file identity, strict rejection of damaged entries,
 * racy entries, an unwritable cache directory, refresh, concurrent writers,
 * and that digests, root and manifest digest never depend on the cache. */
#include <check.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/providers.h"
#include "fingerprint/cache.h"
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

/* Six tensors, data derived from the name; shard s of a checkpoint holds
 * specs[2s], specs[2s+1] (the second shard also a skipped mtp tensor, which
 * the model never reads but the fingerprint covers). */
static const st_spec specs[] = {
    {"model.embed_tokens.weight", "BF16", 2, {128, 64}, 2, NULL},
    {"lm_head.weight", "BF16", 2, {128, 64}, 2, NULL},
    {"model.layers.0.input_layernorm.weight", "BF16", 1, {64}, 2, NULL},
    {"model.layers.1.input_layernorm.weight", "F32", 1, {64}, 4, NULL},
    {"model.norm.weight", "BF16", 1, {64}, 2, NULL},
    {"model.layers.0.mlp.gate.weight", "BF16", 2, {4, 64}, 2, NULL},
};
static const st_spec mtp_spec = {"mtp.fc.weight", "BF16", 2, {8, 8}, 2, NULL};

static const char *shard_name(int s)
{
    static const char *names[] = {"model-00001-of-00003.safetensors",
                                  "model-00002-of-00003.safetensors",
                                  "model-00003-of-00003.safetensors"};
    return names[s];
}

static uint64_t shard_bytes(int s)
{
    return st_spec_bytes(&specs[2 * s]) + st_spec_bytes(&specs[2 * s + 1]) +
           (s == 1 ? st_spec_bytes(&mtp_spec) : 0);
}

static char *shard_path(const char *dir, int s)
{
    char *p = malloc(strlen(dir) + 64);
    ck_assert_ptr_nonnull(p);
    sprintf(p, "%s/%s", dir, shard_name(s));
    return p;
}

static void write_shard(const char *dir, int s)
{
    st_spec t[3] = {specs[2 * s], specs[2 * s + 1], mtp_spec};
    st_write_file(dir, shard_name(s), t, s == 1 ? 3 : 2);
}

/* Waits until a file's ctime is older than the coarse clock, so that a hash
 * begun now may be cached (ls_fpcache_racy); a few ms at most. */
static void settle(const char *path)
{
    ls_error err;
    ls_file_identity id;
    ck_assert_msg(ls_file_identity_stat(path, &id, &err) == LS_OK, "%s", err.msg);
    for (int i = 0; i < 5000 && ls_fpcache_racy(&id, ls_fpcache_clock_ns()); i++) usleep(1000);
    ck_assert(!ls_fpcache_racy(&id, ls_fpcache_clock_ns()));
}

/* A checkpoint of nshards (2 or 3) shards plus its index. Caller frees. */
static char *make_ck(int nshards)
{
    char *dir = ls_test_tmpdir("fpc");
    ls_test_write_text(dir, "config.json", config_json);
    char idx[4096];
    size_t k = (size_t)snprintf(idx, sizeof idx, "{\"metadata\": {}, \"weight_map\": {");
    for (int s = 0; s < nshards; s++) {
        write_shard(dir, s);
        for (int t = 0; t < 2; t++)
            k += (size_t)snprintf(idx + k, sizeof idx - k, "%s\"%s\": \"%s\"", (s || t) ? ", " : "",
                                  specs[2 * s + t].name, shard_name(s));
        if (s == 1)
            k += (size_t)snprintf(idx + k, sizeof idx - k, ", \"%s\": \"%s\"", mtp_spec.name,
                                  shard_name(s));
    }
    snprintf(idx + k, sizeof idx - k, "}}\n");
    ls_test_write_text(dir, "model.safetensors.index.json", idx);
    for (int s = 0; s < nshards; s++) {
        char *p = shard_path(dir, s);
        settle(p);
        free(p);
    }
    return dir;
}

static char *cache_of(const char *dir)
{
    char *c = malloc(strlen(dir) + 16);
    ck_assert_ptr_nonnull(c);
    sprintf(c, "%s/cache", dir);
    return c;
}

/* The entry file of shard s. Caller frees. */
static char *entry_of(const char *cache, const char *dir, int s)
{
    char *p = shard_path(dir, s), *canon = realpath(p, NULL), *e = NULL;
    ck_assert_ptr_nonnull(canon);
    ls_error err;
    ck_assert_int_eq(ls_fpcache_entry_path(cache, canon, &e, &err), LS_OK);
    free(p);
    free(canon);
    return e;
}

/* Opens dir and fingerprints it (cache NULL: no cache). The checkpoint stays
 * open (names are borrowed); close it with done(). */
static void fp_run(const char *dir, const char *cache, int refresh, ls_checkpoint **ck,
                   ls_fingerprint *fp)
{
    ls_error err;
    ls_error_clear(&err);
    ck_assert_msg(ls_checkpoint_open(dir, ck, &err) == LS_OK, "%s", err.msg);
    ls_fingerprint_opts o = {2, 0};
    ls_fingerprint_cache_opts c = {cache, refresh};
    ck_assert_msg(ls_fingerprint_checkpoint_cached(*ck, &o, &c, fp, &err) == LS_OK, "%s", err.msg);
    ck_assert_uint_eq(fp->bytes_hashed + fp->bytes_cached, fp->total_bytes);
}

static void done(ls_checkpoint *ck, ls_fingerprint *fp)
{
    ls_fingerprint_free(fp);
    ls_checkpoint_close(ck);
}

/* Every digest and the root equal; the first differing tensor is named with
 * both digests in hex. */
static void assert_same_fp(const ls_fingerprint *a, const ls_fingerprint *b)
{
    ck_assert_uint_eq(a->count, b->count);
    char ha[65], hb[65];
    for (size_t i = 0; i < a->count; i++) {
        ck_assert_str_eq(a->tensors[i].name, b->tensors[i].name);
        if (!ls_digest_equal(&a->tensors[i].digest, &b->tensors[i].digest)) {
            ls_digest_to_hex(&a->tensors[i].digest, ha);
            ls_digest_to_hex(&b->tensors[i].digest, hb);
            ck_abort_msg("tensor %zu (%s): digest %s vs %s", i, a->tensors[i].name, ha, hb);
        }
    }
    ls_digest_to_hex(&a->merkle_root, ha);
    ls_digest_to_hex(&b->merkle_root, hb);
    ck_assert_msg(ls_digest_equal(&a->merkle_root, &b->merkle_root), "root %s vs %s", ha, hb);
    ck_assert(ls_digest_equal(&a->config_digest, &b->config_digest));
}

/* The uncached fingerprint of dir, for reference. */
static ls_digest plain_root(const char *dir, ls_fingerprint *keep, ls_checkpoint **keep_ck)
{
    fp_run(dir, NULL, 0, keep_ck, keep);
    ck_assert_uint_eq(keep->files_cached, 0);
    ck_assert_uint_eq(keep->cache_entries_written, 0);
    return keep->merkle_root;
}

/* stderr of a stretch of code, captured through a file. */
typedef struct capture {
    int saved_fd;
    char path[4400];
} capture;

static void capture_begin(capture *c, const char *dir)
{
    snprintf(c->path, sizeof c->path, "%s/stderr.txt", dir);
    fflush(stderr);
    c->saved_fd = dup(2);
    int fd = open(c->path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    dup2(fd, 2);
    close(fd);
}

static char *capture_end(capture *c)
{
    fflush(stderr);
    dup2(c->saved_fd, 2);
    close(c->saved_fd);
    char *s = ls_test_read(c->path, NULL);
    ck_assert_ptr_nonnull(s);
    return s;
}

static int count_lines_with(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

static uint8_t *read_entry(const char *path, size_t *len)
{
    return (uint8_t *)ls_test_read(path, len);
}

/* ---- hits and misses ----------------------------------------------------------- */

START_TEST(test_miss_then_hit)
{
    char *dir = make_ck(3), *cache = cache_of(dir);
    ls_checkpoint *ck0, *ck1, *ck2;
    ls_fingerprint plain, a, b;
    plain_root(dir, &plain, &ck0);

    fp_run(dir, cache, 0, &ck1, &a);
    ck_assert_uint_eq(a.files_hashed, 3);
    ck_assert_uint_eq(a.files_cached, 0);
    ck_assert_uint_eq(a.bytes_hashed, a.total_bytes);
    ck_assert_uint_eq(a.cache_entries_written, 3);
    assert_same_fp(&plain, &a);

    fp_run(dir, cache, 0, &ck2, &b);
    ck_assert_uint_eq(b.files_hashed, 0);
    ck_assert_uint_eq(b.files_cached, 3);
    ck_assert_uint_eq(b.bytes_hashed, 0);
    ck_assert_uint_eq(b.bytes_cached, b.total_bytes);
    ck_assert_uint_eq(b.cache_entries_written, 0);
    ck_assert_int_eq(b.threads_used, 0);
    assert_same_fp(&plain, &b);
    done(ck0, &plain);
    done(ck1, &a);
    done(ck2, &b);
    free(cache);
    ls_test_rm_tmpdir(dir);
}
END_TEST

START_TEST(test_touch_rehashes_that_shard_only)
{
    char *dir = make_ck(3), *cache = cache_of(dir);
    ls_checkpoint *ck0, *ck1, *ck2, *ck3;
    ls_fingerprint plain, a, b, c;
    plain_root(dir, &plain, &ck0);
    fp_run(dir, cache, 0, &ck1, &a);

    /* mtime one second later, content unchanged */
    char *p = shard_path(dir, 2);
    struct stat sb;
    ck_assert_int_eq(stat(p, &sb), 0);
    struct timespec ts[2] = {sb.st_atim, sb.st_mtim};
    ts[1].tv_sec += 1;
    ck_assert_int_eq(utimensat(AT_FDCWD, p, ts, 0), 0);
    settle(p);

    fp_run(dir, cache, 0, &ck2, &b);
    ck_assert_uint_eq(b.files_hashed, 1);
    ck_assert_uint_eq(b.files_cached, 2);
    ck_assert_uint_eq(b.bytes_hashed, shard_bytes(2));
    ck_assert_uint_eq(b.cache_entries_written, 1);
    assert_same_fp(&plain, &b);

    fp_run(dir, cache, 0, &ck3, &c);
    ck_assert_uint_eq(c.files_hashed, 0);
    ck_assert_uint_eq(c.files_cached, 3);
    assert_same_fp(&plain, &c);
    free(p);
    done(ck0, &plain);
    done(ck1, &a);
    done(ck2, &b);
    done(ck3, &c);
    free(cache);
    ls_test_rm_tmpdir(dir);
}
END_TEST

/* Shard 0 rewritten in place with other bytes of the same size and its mtime
 * set back: only ctime tells, and it must be enough. */
START_TEST(test_same_size_rewrite_misses)
{
    char *dir = make_ck(3), *cache = cache_of(dir);
    ls_checkpoint *ck0, *ck1, *ck2;
    ls_fingerprint old_fp, a, b;
    fp_run(dir, cache, 0, &ck0, &old_fp);
    ck_assert_uint_eq(old_fp.cache_entries_written, 3);

    char *p = shard_path(dir, 0);
    struct stat before, after;
    ck_assert_int_eq(stat(p, &before), 0);
    unsigned char *data = malloc(st_spec_bytes(&specs[0]));
    ck_assert_ptr_nonnull(data);
    memset(data, 0x5a, st_spec_bytes(&specs[0]));
    st_spec t[2] = {specs[0], specs[1]};
    t[0].data = data;
    st_write_file(dir, shard_name(0), t, 2);
    free(data);
    struct timespec ts[2] = {before.st_atim, before.st_mtim};
    ck_assert_int_eq(utimensat(AT_FDCWD, p, ts, 0), 0);
    ck_assert_int_eq(stat(p, &after), 0);
    ck_assert_int_eq(after.st_size, before.st_size);
    ck_assert_int_eq(after.st_ino, before.st_ino);
    ck_assert(after.st_mtim.tv_sec == before.st_mtim.tv_sec &&
              after.st_mtim.tv_nsec == before.st_mtim.tv_nsec);
    settle(p);

    ls_fingerprint plain;
    ls_checkpoint *ckp;
    plain_root(dir, &plain, &ckp);
    ck_assert(!ls_digest_equal(&plain.merkle_root, &old_fp.merkle_root));
    fp_run(dir, cache, 0, &ck1, &a);
    ck_assert_uint_eq(a.files_hashed, 1);
    ck_assert_uint_eq(a.bytes_hashed, shard_bytes(0));
    assert_same_fp(&plain, &a);
    fp_run(dir, cache, 0, &ck2, &b);
    ck_assert_uint_eq(b.files_cached, 3);
    assert_same_fp(&plain, &b);
    free(p);
    done(ck0, &old_fp);
    done(ckp, &plain);
    done(ck1, &a);
    done(ck2, &b);
    free(cache);
    ls_test_rm_tmpdir(dir);
}
END_TEST

START_TEST(test_two_shards_partially_cached)
{
    char *dir = make_ck(2), *cache = cache_of(dir);
    ls_checkpoint *ck0, *ck1, *ck2, *ck3;
    ls_fingerprint plain, a, b, c;
    plain_root(dir, &plain, &ck0);
    fp_run(dir, cache, 0, &ck1, &a);
    ck_assert_uint_eq(a.cache_entries_written, 2);
    /* shard 1 holds the skipped mtp tensor: its entry has its digest too */
    char *e1 = entry_of(cache, dir, 1);
    ls_fpcache_entry ent;
    int found;
    ls_error err;
    ck_assert_int_eq(ls_fpcache_load(e1, &ent, &found, &err), LS_OK);
    ck_assert_int_eq(found, 1);
    ck_assert_uint_eq(ent.count, 3);
    int with = 0;
    for (size_t i = 0; i < ent.count; i++) with += ent.tensors[i].has_digest;
    ck_assert_int_eq(with, 3);
    /* An entry written before skipped tensors were fingerprinted lists the
     * mtp tensor without a digest: it misses, the shard is hashed and the
     * entry rewritten. */
    for (size_t i = 0; i < ent.count; i++)
        if (strcmp(ent.tensors[i].name, mtp_spec.name) == 0) ent.tensors[i].has_digest = 0;
    ck_assert_msg(ls_fpcache_store(e1, &ent, &err) == LS_OK, "%s", err.msg);
    ls_fpcache_entry_free(&ent);

    fp_run(dir, cache, 0, &ck2, &b);
    ck_assert_uint_eq(b.files_hashed, 1);
    ck_assert_uint_eq(b.files_cached, 1);
    ck_assert_uint_eq(b.bytes_hashed, shard_bytes(1));
    ck_assert_uint_eq(b.bytes_cached, shard_bytes(0));
    ck_assert_uint_eq(b.cache_entries_written, 1);
    assert_same_fp(&plain, &b);
    ck_assert_int_eq(ls_fpcache_load(e1, &ent, &found, &err), LS_OK);
    with = 0;
    for (size_t i = 0; i < ent.count; i++) with += ent.tensors[i].has_digest;
    ck_assert_int_eq(with, 3);
    ls_fpcache_entry_free(&ent);
    fp_run(dir, cache, 0, &ck3, &c);
    ck_assert_uint_eq(c.files_cached, 2);
    assert_same_fp(&plain, &c);
    free(e1);
    done(ck0, &plain);
    done(ck1, &a);
    done(ck2, &b);
    done(ck3, &c);
    free(cache);
    ls_test_rm_tmpdir(dir);
}
END_TEST

START_TEST(test_refresh_hashes_all_and_rewrites)
{
    char *dir = make_ck(3), *cache = cache_of(dir);
    ls_checkpoint *ck1, *ck2, *ck3;
    ls_fingerprint a, b, c;
    fp_run(dir, cache, 0, &ck1, &a);
    fp_run(dir, cache, 1, &ck2, &b);
    ck_assert_uint_eq(b.files_hashed, 3);
    ck_assert_uint_eq(b.files_cached, 0);
    ck_assert_uint_eq(b.bytes_hashed, b.total_bytes);
    ck_assert_uint_eq(b.cache_entries_written, 3);
    assert_same_fp(&a, &b);
    fp_run(dir, cache, 0, &ck3, &c);
    ck_assert_uint_eq(c.files_cached, 3);
    assert_same_fp(&a, &c);
    done(ck1, &a);
    done(ck2, &b);
    done(ck3, &c);
    free(cache);
    ls_test_rm_tmpdir(dir);
}
END_TEST

/* ---- entries that must not be trusted -------------------------------------------- */

typedef enum damage { FLIP_PATH, TRUNCATE, FOREIGN_MAGIC, EMPTY, TRAILING, OTHER_VERSION } damage;

/* Damages shard 1's entry; returns the message fragment the warning must hold. */
static void apply_damage(const char *entry, damage how, char *expect, size_t cap)
{
    size_t len;
    uint8_t *b = read_entry(entry, &len);
    ck_assert_ptr_nonnull(b);
    ck_assert_uint_gt(len, 100);
    switch (how) {
    case FLIP_PATH: /* a byte of the shard path: still well-formed, checksum wrong */
        b[70] ^= 0x01;
        snprintf(expect, cap, "checksum mismatch: the entry was altered or not completely "
                 "written (byte offset %zu)", len - 32);
        break;
    case TRUNCATE:
        snprintf(expect, cap, "truncated: checksum needs 32 bytes but the %zu-byte entry ends "
                 "first (byte offset %zu)", len - 10, len - 32);
        len -= 10;
        break;
    case FOREIGN_MAGIC:
        memcpy(b, "PK\x03\x04....", 8);
        snprintf(expect, cap, "not a lockstep fingerprint cache entry (magic is not \"LSFPCACH\") "
                 "(byte offset 0)");
        break;
    case EMPTY:
        len = 0;
        snprintf(expect, cap, "truncated: magic needs 8 bytes but the 0-byte entry ends first "
                 "(byte offset 0)");
        break;
    case TRAILING:
        b = realloc(b, len + 3);
        ck_assert_ptr_nonnull(b);
        memcpy(b + len, "abc", 3);
        snprintf(expect, cap, "3 bytes after the checksum (byte offset %zu)", len);
        len += 3;
        break;
    case OTHER_VERSION:
        b[8] = 3;
        snprintf(expect, cap, "version 3, this lockstep reads version 2 (byte offset 8)");
        break;
    }
    ls_test_write(entry, b, len);
    free(b);
}

START_TEST(test_damaged_entry_is_rehashed)
{
    static const damage all[] = {FLIP_PATH, TRUNCATE, FOREIGN_MAGIC,
                                 EMPTY, TRAILING, OTHER_VERSION};
    char *dir = make_ck(3), *cache = cache_of(dir);
    ls_checkpoint *ck0;
    ls_fingerprint plain;
    plain_root(dir, &plain, &ck0);
    char *e1 = entry_of(cache, dir, 1);
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        ls_checkpoint *ck1, *ck2, *ck3;
        ls_fingerprint a, b, c;
        fp_run(dir, cache, 1, &ck1, &a); /* fresh, valid entries */
        char expect[512];
        apply_damage(e1, all[k], expect, sizeof expect);
        capture cap;
        capture_begin(&cap, dir);
        fp_run(dir, cache, 0, &ck2, &b);
        char *log = capture_end(&cap);
        ck_assert_msg(strstr(log, e1) && strstr(log, expect),
                      "damage %zu: warning lacks '%s: %s':\n%s", k, e1, expect, log);
        ck_assert_msg(count_lines_with(log, "warning:") == 1, "damage %zu: %s", k, log);
        ck_assert_uint_eq(b.files_hashed, 1);
        ck_assert_uint_eq(b.files_cached, 2);
        ck_assert_uint_eq(b.bytes_hashed, shard_bytes(1));
        ck_assert_uint_eq(b.cache_entries_written, 1);
        assert_same_fp(&plain, &b);
        /* rewritten: the next run takes all three from the cache, silently */
        capture_begin(&cap, dir);
        fp_run(dir, cache, 0, &ck3, &c);
        free(log);
        log = capture_end(&cap);
        ck_assert_msg(log[0] == '\0', "damage %zu: %s", k, log);
        ck_assert_uint_eq(c.files_cached, 3);
        assert_same_fp(&plain, &c);
        free(log);
        done(ck1, &a);
        done(ck2, &b);
        done(ck3, &c);
    }
    free(e1);
    done(ck0, &plain);
    free(cache);
    ls_test_rm_tmpdir(dir);
}
END_TEST

/* An entry of the previous format (version 1, written before finiteness was
 * recorded) is not trusted, but it is an upgrade, not damage: the shard is
 * hashed and its entry replaced without a warning. */
START_TEST(test_older_version_entry_replaced_silently)
{
    char *dir = make_ck(3), *cache = cache_of(dir);
    ls_checkpoint *ck0, *ck1, *ck2;
    ls_fingerprint plain, a, b;
    plain_root(dir, &plain, &ck0);
    fp_run(dir, cache, 0, &ck1, &a);
    ck_assert_uint_eq(a.cache_entries_written, 3);
    char *e1 = entry_of(cache, dir, 1);
    size_t len;
    uint8_t *buf = read_entry(e1, &len);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(buf[8], LS_FPCACHE_VERSION);
    buf[8] = 1;
    ls_test_write(e1, buf, len);
    free(buf);
    capture cap;
    capture_begin(&cap, dir);
    fp_run(dir, cache, 0, &ck2, &b);
    char *log = capture_end(&cap);
    ck_assert_msg(log[0] == '\0', "an older entry warned:\n%s", log);
    ck_assert_uint_eq(b.files_hashed, 1);
    ck_assert_uint_eq(b.files_cached, 2);
    ck_assert_uint_eq(b.bytes_hashed, shard_bytes(1));
    ck_assert_uint_eq(b.cache_entries_written, 1);
    assert_same_fp(&plain, &b);
    buf = read_entry(e1, &len);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(buf[8], LS_FPCACHE_VERSION);
    free(buf);
    free(log);
    free(e1);
    done(ck0, &plain);
    done(ck1, &a);
    done(ck2, &b);
    free(cache);
    ls_test_rm_tmpdir(dir);
}
END_TEST

/* first_nonfinite is held to what a hashing pass can find: none for a tensor
 * without a digest or of an integer dtype, and inside the tensor. */
START_TEST(test_entry_first_nonfinite_rules)
{
    static const struct {
        ls_fpcache_tensor t;
        const char *why;
    } bad[] = {
        {{"a", LS_DTYPE_BF16, 1, {12}, 24, 100, 1, {{0}}, 12}, "first_nonfinite 12 is impossible (past its last element)"},
        {{"a", LS_DTYPE_I16, 1, {12}, 24, 100, 1, {{0}}, 3}, "first_nonfinite 3 is impossible (its dtype has no NaN or infinity)"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        ls_fpcache_entry e = {0};
        e.path = "/ckpt/model.safetensors";
        ls_fpcache_tensor t = bad[k].t;
        e.tensors = &t;
        e.count = 1;
        uint8_t *buf;
        size_t len;
        ls_error err;
        ck_assert_int_eq(ls_fpcache_encode(&e, &buf, &len, &err), LS_OK);
        ls_fpcache_entry back;
        ck_assert_int_eq(ls_fpcache_decode("x", buf, len, &back, &err), LS_E_INPUT);
        ck_assert_msg(strstr(err.msg, bad[k].why) && strstr(err.msg, "(byte offset "), "%zu: %s", k, err.msg);
        free(buf);
    }
    /* A record without a digest is always written as "none". */
    ls_fpcache_entry e = {0};
    e.path = "/ckpt/model.safetensors";
    ls_fpcache_tensor t = {"a", LS_DTYPE_BF16, 1, {12}, 24, 100, 0, {{0}}, 5};
    e.tensors = &t;
    e.count = 1;
    uint8_t *buf;
    size_t len;
    ls_error err;
    ck_assert_int_eq(ls_fpcache_encode(&e, &buf, &len, &err), LS_OK);
    ls_fpcache_entry back;
    ck_assert_msg(ls_fpcache_decode("x", buf, len, &back, &err) == LS_OK, "%s", err.msg);
    ck_assert_uint_eq(back.tensors[0].first_nonfinite, LS_FPCACHE_ALL_FINITE);
    ls_fpcache_entry_free(&back);
    free(buf);
}
END_TEST

/* Shard 1's entry copied over shard 2's: well-formed but for another path. */
START_TEST(test_entry_for_other_path_not_trusted)
{
    char *dir = make_ck(3), *cache = cache_of(dir);
    ls_checkpoint *ck1, *ck2;
    ls_fingerprint a, b;
    fp_run(dir, cache, 0, &ck1, &a);
    char *e1 = entry_of(cache, dir, 1), *e2 = entry_of(cache, dir, 2);
    size_t len;
    char *bytes = ls_test_read(e1, &len);
    ls_test_write(e2, bytes, len);
    free(bytes);
    capture cap;
    capture_begin(&cap, dir);
    fp_run(dir, cache, 0, &ck2, &b);
    char *log = capture_end(&cap);
    ck_assert_msg(strstr(log, e2) && strstr(log, "entry is for") && strstr(log, "(byte offset 68)"),
                  "%s", log);
    ck_assert_uint_eq(b.files_hashed, 1);
    ck_assert_uint_eq(b.bytes_hashed, shard_bytes(2));
    assert_same_fp(&a, &b);
    free(log);
    free(e1);
    free(e2);
    done(ck1, &a);
    done(ck2, &b);
    free(cache);
    ls_test_rm_tmpdir(dir);
}
END_TEST

/* Valid entries that must still miss: a racy one, and one whose tensor list
 * differs from the header. Neither is a warning: they are well-formed. */
START_TEST(test_racy_or_mismatched_entry_misses)
{
    char *dir = make_ck(3), *cache = cache_of(dir);
    ls_checkpoint *ck0, *ck1, *ck2, *ck3;
    ls_fingerprint plain, a, b, c;
    plain_root(dir, &plain, &ck0);
    fp_run(dir, cache, 0, &ck1, &a);
    char *e0 = entry_of(cache, dir, 0), *e2 = entry_of(cache, dir, 2);
    ls_fpcache_entry ent;
    int found;
    ls_error err;
    /* shard 0: hashing "began" at the file's ctime */
    ck_assert_int_eq(ls_fpcache_load(e0, &ent, &found, &err), LS_OK);
    ent.hashed_at_ns = ent.identity.ctime_ns;
    ck_assert_int_eq(ls_fpcache_store(e0, &ent, &err), LS_OK);
    ls_fpcache_entry_free(&ent);
    /* shard 2: a shape the header does not have, digests intact */
    ck_assert_int_eq(ls_fpcache_load(e2, &ent, &found, &err), LS_OK);
    ck_assert_int_eq(ent.tensors[0].ndim, 1); /* model.norm.weight [64] */
    ent.tensors[0].ndim = 2;
    ent.tensors[0].shape[0] = 2;
    ent.tensors[0].shape[1] = 32;
    ck_assert_int_eq(ls_fpcache_store(e2, &ent, &err), LS_OK);
    ls_fpcache_entry_free(&ent);

    capture cap;
    capture_begin(&cap, dir);
    fp_run(dir, cache, 0, &ck2, &b);
    char *log = capture_end(&cap);
    ck_assert_msg(log[0] == '\0', "%s", log);
    ck_assert_uint_eq(b.files_hashed, 2);
    ck_assert_uint_eq(b.files_cached, 1);
    ck_assert_uint_eq(b.bytes_hashed, shard_bytes(0) + shard_bytes(2));
    ck_assert_uint_eq(b.cache_entries_written, 2);
    assert_same_fp(&plain, &b);
    fp_run(dir, cache, 0, &ck3, &c);
    ck_assert_uint_eq(c.files_cached, 3);
    free(log);
    free(e0);
    free(e2);
    done(ck0, &plain);
    done(ck1, &a);
    done(ck2, &b);
    done(ck3, &c);
    free(cache);
    ls_test_rm_tmpdir(dir);
}
END_TEST

START_TEST(test_racy_rule)
{
    /* ns timestamps: racy until the clock has moved past ctime */
    ls_file_identity id = {1, 2, 3, 1700000000123456789, 1700000000123456789};
    ck_assert_int_eq(ls_fpcache_racy(&id, id.ctime_ns), 1);
    ck_assert_int_eq(ls_fpcache_racy(&id, id.ctime_ns - 5), 1);
    ck_assert_int_eq(ls_fpcache_racy(&id, id.ctime_ns + 1), 0);
    /* whole seconds: the file system may stamp a change 2 s later the same */
    id.ctime_ns = 1700000000000000000;
    ck_assert_int_eq(ls_fpcache_racy(&id, id.ctime_ns + 1999999999), 1);
    ck_assert_int_eq(ls_fpcache_racy(&id, id.ctime_ns + 2000000000), 0);
}
END_TEST

/* The file changed (or was replaced) after the checkpoint was opened: the
 * mapping, not the path, is what was fingerprinted; nothing is cached. */
START_TEST(test_changed_after_open_not_cached)
{
    char *dir = make_ck(3), *cache = cache_of(dir);
    ls_checkpoint *ck0, *ck1, *ck2, *ck3;
    ls_fingerprint plain, a, b, c;
    plain_root(dir, &plain, &ck0);
    fp_run(dir, cache, 0, &ck1, &a); /* all entries stored */
    ls_error err;
    ls_fingerprint_opts o = {2, 0};
    ls_fingerprint_cache_opts co = {cache, 0};

    /* replaced by rename with other content after open */
    ck_assert_int_eq(ls_checkpoint_open(dir, &ck2, &err), LS_OK);
    unsigned char *data = calloc(1, st_spec_bytes(&specs[2]));
    ck_assert_ptr_nonnull(data);
    st_spec t[3] = {specs[2], specs[3], mtp_spec};
    t[0].data = data;
    st_write_file(dir, "replacement.tmp", t, 3);
    free(data);
    char *p1 = shard_path(dir, 1), tmp[4400];
    snprintf(tmp, sizeof tmp, "%s/replacement.tmp", dir);
    ck_assert_int_eq(rename(tmp, p1), 0);
    settle(p1);
    ck_assert_msg(ls_fingerprint_checkpoint_cached(ck2, &o, &co, &b, &err) == LS_OK, "%s", err.msg);
    ck_assert_uint_eq(b.files_hashed, 1);
    ck_assert_uint_eq(b.bytes_hashed, shard_bytes(1));
    ck_assert_uint_eq(b.cache_entries_written, 0);
    assert_same_fp(&plain, &b); /* the old mapping's digests */

    /* reopened: the new content is hashed, cached, and differs */
    fp_run(dir, cache, 0, &ck3, &c);
    ck_assert_uint_eq(c.files_hashed, 1);
    ck_assert_uint_eq(c.cache_entries_written, 1);
    ck_assert(!ls_digest_equal(&c.merkle_root, &plain.merkle_root));
    ls_fingerprint fresh;
    ls_checkpoint *ckf;
    plain_root(dir, &fresh, &ckf);
    assert_same_fp(&fresh, &c);
    free(p1);
    done(ck0, &plain);
    done(ck1, &a);
    done(ck2, &b);
    done(ck3, &c);
    done(ckf, &fresh);
    free(cache);
    ls_test_rm_tmpdir(dir);
}
END_TEST

START_TEST(test_unwritable_cache_dir)
{
    char *dir = make_ck(3);
    ls_checkpoint *ck0, *ck1, *ck2;
    ls_fingerprint plain, a, b;
    plain_root(dir, &plain, &ck0);
    /* below a regular file: no user, root included, can create it */
    ls_test_write_text(dir, "not-a-dir", "x");
    char cache[4400];
    snprintf(cache, sizeof cache, "%s/not-a-dir/cache", dir);
    capture cap;
    capture_begin(&cap, dir);
    fp_run(dir, cache, 0, &ck1, &a);
    char *log = capture_end(&cap);
    ck_assert_msg(count_lines_with(log, "warning:") == 1 && strstr(log, "not-a-dir") &&
                  strstr(log, "continuing without storing entries"), "%s", log);
    ck_assert_uint_eq(a.files_hashed, 3);
    ck_assert_uint_eq(a.cache_entries_written, 0);
    assert_same_fp(&plain, &a);
    free(log);
    capture_begin(&cap, dir);
    fp_run(dir, cache, 0, &ck2, &b);
    log = capture_end(&cap);
    ck_assert_msg(count_lines_with(log, "warning:") == 1, "%s", log);
    ck_assert_uint_eq(b.files_hashed, 3);
    assert_same_fp(&plain, &b);
    free(log);
    done(ck0, &plain);
    done(ck1, &a);
    done(ck2, &b);
    ls_test_rm_tmpdir(dir);
}
END_TEST

/* ---- concurrency, the entry format, defaults, the manifest ---------------------- */

typedef struct worker_arg {
    const ls_checkpoint *ck;
    const char *cache;
    ls_fingerprint fp;
    ls_status st;
    ls_error err;
} worker_arg;

static void *fp_worker(void *p)
{
    worker_arg *w = p;
    ls_fingerprint_opts o = {1, 0};
    ls_fingerprint_cache_opts c = {w->cache, 1};
    w->st = LS_OK;
    for (int r = 0; r < 20 && w->st == LS_OK; r++) {
        if (r) ls_fingerprint_free(&w->fp);
        w->st = ls_fingerprint_checkpoint_cached(w->ck, &o, &c, &w->fp, &w->err);
    }
    return NULL;
}

/* Four threads refresh the same entries of one open checkpoint at once while
 * this thread reads its mapping: every result agrees and the entries left
 * behind are valid. */
START_TEST(test_concurrent_writers)
{
    char *dir = make_ck(3), *cache = cache_of(dir);
    ls_checkpoint *ck0, *ck1, *ck2;
    ls_fingerprint plain, c;
    plain_root(dir, &plain, &ck0);
    ls_error err;
    ck_assert_int_eq(ls_checkpoint_open(dir, &ck1, &err), LS_OK);
    worker_arg w[4];
    pthread_t tid[4];
    memset(w, 0, sizeof w);
    for (int i = 0; i < 4; i++) {
        w[i].ck = ck1;
        w[i].cache = cache;
        ck_assert_int_eq(pthread_create(&tid[i], NULL, fp_worker, &w[i]), 0);
    }
    unsigned sum = 0;
    for (size_t i = 0; i < ls_checkpoint_count(ck1); i++) {
        const ls_tensor *t = ls_checkpoint_at(ck1, i);
        for (uint64_t k = 0; k < t->size_bytes; k++) sum += ((const unsigned char *)t->data)[k];
    }
    ck_assert_uint_gt(sum, 0);
    for (int i = 0; i < 4; i++) {
        pthread_join(tid[i], NULL);
        ck_assert_msg(w[i].st == LS_OK, "%s", w[i].err.msg);
        assert_same_fp(&plain, &w[i].fp);
        ls_fingerprint_free(&w[i].fp);
    }
    capture cap;
    capture_begin(&cap, dir);
    fp_run(dir, cache, 0, &ck2, &c);
    char *log = capture_end(&cap);
    ck_assert_msg(log[0] == '\0', "%s", log);
    ck_assert_uint_eq(c.files_cached, 3);
    assert_same_fp(&plain, &c);
    /* no temporary files left behind */
    char *out = NULL;
    ck_assert_int_eq(ls_test_sh(&out, "ls -A '%s/fingerprint' | grep -c tmp", cache), 1);
    ck_assert_msg(out && strcmp(out, "0\n") == 0, "%s", out ? out : "");
    free(out);
    free(log);
    ls_checkpoint_close(ck1);
    done(ck0, &plain);
    done(ck2, &c);
    free(cache);
    ls_test_rm_tmpdir(dir);
}
END_TEST

/* A store never replaces what is not a regular file (a FIFO at the entry's
 * name stays a FIFO, and the store fails naming it), and it removes the
 * temporaries of the same entry left by processes that no longer run
 * ("<entry>.tmp.<pid>.<n>"), keeping those of a running one. */
START_TEST(test_store_fails_closed)
{
    char *dir = make_ck(1), *cache = cache_of(dir);
    ls_checkpoint *ck1;
    ls_fingerprint a;
    fp_run(dir, cache, 0, &ck1, &a);
    char *e0 = entry_of(cache, dir, 0);
    ls_fpcache_entry ent;
    int found;
    ls_error err;
    ck_assert_int_eq(ls_fpcache_load(e0, &ent, &found, &err), LS_OK);
    ck_assert_int_eq(found, 1);

    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) _exit(0);
    int status;
    waitpid(child, &status, 0); /* child's pid now names no process */
    char dead[PATH_MAX + 64], live[PATH_MAX + 64];
    snprintf(dead, sizeof dead, "%s.tmp.%ld.7", e0, (long)child);
    snprintf(live, sizeof live, "%s.tmp.%ld.7", e0, (long)getppid());
    ls_test_write(dead, "partial", 7);
    ls_test_write(live, "partial", 7);
    ck_assert_int_eq(ls_fpcache_store(e0, &ent, &err), LS_OK);
    struct stat sb;
    ck_assert_msg(stat(dead, &sb) != 0, "%s (pid %ld no longer runs) was not removed", dead, (long)child);
    ck_assert_msg(stat(live, &sb) == 0, "%s (pid %ld runs) was removed", live, (long)getppid());
    unlink(live);

    ck_assert_int_eq(unlink(e0), 0);
    ck_assert_int_eq(mkfifo(e0, 0600), 0);
    ls_error_clear(&err);
    ck_assert_int_eq(ls_fpcache_store(e0, &ent, &err), LS_E_USAGE);
    ck_assert_msg(strstr(err.msg, e0) && strstr(err.msg, "a FIFO"), "message: %s", err.msg);
    ck_assert_msg(stat(e0, &sb) == 0 && S_ISFIFO(sb.st_mode), "%s is no longer a FIFO", e0);
    char *out = NULL;
    ck_assert_int_eq(ls_test_sh(&out, "ls -A '%s/fingerprint' | grep -c tmp", cache), 1);
    ck_assert_msg(out && strcmp(out, "0\n") == 0, "temporary entries left: %s", out ? out : "");
    free(out);
    unlink(e0);
    ls_fpcache_entry_free(&ent);
    free(e0);
    done(ck1, &a);
    free(cache);
    ls_test_rm_tmpdir(dir);
}
END_TEST

/* Every truncation and every single-bit flip of a valid entry is rejected
 * with a byte offset, and the entry round-trips. */
START_TEST(test_entry_decode_strict)
{
    ls_fpcache_entry e = {0};
    e.path = "/ckpt/model.safetensors";
    e.identity = (ls_file_identity){7, 8, 9, 10, 11};
    e.hashed_at_ns = 12;
    ls_fpcache_tensor t[2] = {
        {"a.weight", LS_DTYPE_BF16, 2, {3, 4}, 24, 100, 1, {{0}}, 11},
        {"mtp.b", LS_DTYPE_F32, 0, {0}, 4, 124, 0, {{0}}, LS_FPCACHE_ALL_FINITE},
    };
    memset(t[0].digest.bytes, 0xcd, 32);
    e.tensors = t;
    e.count = 2;
    uint8_t *buf;
    size_t len;
    ls_error err;
    ck_assert_int_eq(ls_fpcache_encode(&e, &buf, &len, &err), LS_OK);
    ls_fpcache_entry back;
    ck_assert_msg(ls_fpcache_decode("x", buf, len, &back, &err) == LS_OK, "%s", err.msg);
    ck_assert_str_eq(back.path, e.path);
    ck_assert(ls_file_identity_equal(&back.identity, &e.identity));
    ck_assert_int_eq(back.hashed_at_ns, 12);
    ck_assert_uint_eq(back.count, 2);
    for (size_t i = 0; i < 2; i++) {
        ck_assert_str_eq(back.tensors[i].name, t[i].name);
        ck_assert_int_eq(back.tensors[i].dtype, t[i].dtype);
        ck_assert_int_eq(back.tensors[i].ndim, t[i].ndim);
        ck_assert_uint_eq(back.tensors[i].size_bytes, t[i].size_bytes);
        ck_assert_uint_eq(back.tensors[i].file_offset_bytes, t[i].file_offset_bytes);
        ck_assert_int_eq(back.tensors[i].has_digest, t[i].has_digest);
        ck_assert(ls_digest_equal(&back.tensors[i].digest, &t[i].digest));
        ck_assert_uint_eq(back.tensors[i].first_nonfinite, t[i].first_nonfinite);
    }
    ck_assert_int_eq(back.tensors[0].shape[1], 4);
    ls_fpcache_entry_free(&back);
    for (size_t n = 0; n < len; n++) {
        ck_assert_msg(ls_fpcache_decode("x", buf, n, &back, &err) == LS_E_INPUT,
                      "truncated to %zu accepted", n);
        ck_assert_msg(strstr(err.msg, "(byte offset "), "%s", err.msg);
        ck_assert_ptr_null(back.tensors);
    }
    for (size_t i = 0; i < len; i++)
        for (int bit = 0; bit < 8; bit++) {
            buf[i] ^= (uint8_t)(1u << bit);
            ck_assert_msg(ls_fpcache_decode("x", buf, len, &back, &err) == LS_E_INPUT,
                          "flip of byte %zu bit %d (0x%02x) accepted", i, bit, buf[i]);
            ck_assert_msg(strstr(err.msg, "(byte offset "), "%s", err.msg);
            buf[i] ^= (uint8_t)(1u << bit);
        }
    free(buf);
}
END_TEST

START_TEST(test_default_cache_dir)
{
    setenv("LOCKSTEP_CACHE_DIR", "/c/ls", 1);
    setenv("XDG_CACHE_HOME", "/x", 1);
    setenv("HOME", "/h", 1);
    char *d = ls_fingerprint_default_cache_dir();
    ck_assert_str_eq(d, "/c/ls");
    free(d);
    setenv("LOCKSTEP_CACHE_DIR", "", 1);
    d = ls_fingerprint_default_cache_dir();
    ck_assert_str_eq(d, "/x/lockstep");
    free(d);
    setenv("XDG_CACHE_HOME", "relative", 1); /* ignored, as the XDG spec says */
    d = ls_fingerprint_default_cache_dir();
    ck_assert_str_eq(d, "/h/.cache/lockstep");
    free(d);
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    ck_assert_ptr_null(ls_fingerprint_default_cache_dir());
}
END_TEST

static void manifest_digest(const ls_checkpoint *ck, const char *cache, ls_digest *d)
{
    ls_error err;
    ls_manifest_opts o = ls_manifest_opts_default();
    o.checkpoint = ck;
    o.threads = 2;
    o.cache_dir = cache;
    o.providers = ls_backend_list_providers("cpu", &o.n_providers);
    json_t *m;
    ck_assert_msg(ls_manifest_build(&o, &m, &err) == LS_OK, "%s", err.msg);
    ck_assert_int_eq(ls_manifest_digest(m, d, &err), LS_OK);
    json_decref(m);
}

START_TEST(test_manifest_independent_of_cache)
{
    char *dir = make_ck(3), *cache = cache_of(dir);
    ls_checkpoint *ck;
    ls_error err;
    ck_assert_int_eq(ls_checkpoint_open(dir, &ck, &err), LS_OK);
    ls_digest plain, miss, hit;
    manifest_digest(ck, NULL, &plain);
    manifest_digest(ck, cache, &miss);
    char *e0 = entry_of(cache, dir, 0);
    ck_assert_int_eq(access(e0, F_OK), 0); /* the manifest went through the cache */
    manifest_digest(ck, cache, &hit);
    char a[65], b[65], c[65];
    ls_digest_to_hex(&plain, a);
    ls_digest_to_hex(&miss, b);
    ls_digest_to_hex(&hit, c);
    ck_assert_msg(strcmp(a, b) == 0 && strcmp(a, c) == 0, "plain %s miss %s hit %s", a, b, c);
    free(e0);
    ls_checkpoint_close(ck);
    free(cache);
    ls_test_rm_tmpdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fingerprint_cache");
    TCase *tc = tcase_create("all");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_miss_then_hit);
    tcase_add_test(tc, test_touch_rehashes_that_shard_only);
    tcase_add_test(tc, test_same_size_rewrite_misses);
    tcase_add_test(tc, test_two_shards_partially_cached);
    tcase_add_test(tc, test_refresh_hashes_all_and_rewrites);
    tcase_add_test(tc, test_damaged_entry_is_rehashed);
    tcase_add_test(tc, test_entry_for_other_path_not_trusted);
    tcase_add_test(tc, test_racy_or_mismatched_entry_misses);
    tcase_add_test(tc, test_racy_rule);
    tcase_add_test(tc, test_changed_after_open_not_cached);
    tcase_add_test(tc, test_unwritable_cache_dir);
    tcase_add_test(tc, test_concurrent_writers);
    tcase_add_test(tc, test_store_fails_closed);
    tcase_add_test(tc, test_entry_decode_strict);
    tcase_add_test(tc, test_older_version_entry_replaced_silently);
    tcase_add_test(tc, test_entry_first_nonfinite_rules);
    tcase_add_test(tc, test_default_cache_dir);
    tcase_add_test(tc, test_manifest_independent_of_cache);
    suite_add_tcase(s, tc);
    return ls_test_run_suite(s, 0) ? 1 : 0;
}
