/* lockstep — synth: writing the checkpoint directory (shards, index, config)
 * into a temporary directory that is renamed into place when complete. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"
#include "io/checkpoint.h"
#include "synth/synth.h"

ls_synth_options ls_synth_options_default(void)
{
    ls_synth_options o = {0};
    o.max_shard_bytes = 5000000000ull;
    return o;
}

static uint64_t tensor_bytes(const ls_synth_tensor *t)
{
    return ls_synth_tensor_bytes(t);
}

/* ---- one safetensors file ----------------------------------------------------- */

/* Generates tensors [0, count) into one buffer and writes them to path. */
static ls_status write_shard(const ls_synth_tensor *t, size_t count, uint64_t seed,
                             const char *path, const char *provenance, ls_progress *prog,
                             ls_error *err)
{
    /* each tensor at an 8-byte aligned offset of the buffer (an F8_E4M3
     * tensor of odd size must not leave the next one's elements unaligned) */
    uint64_t total = 0;
    for (size_t i = 0; i < count; i++) total += (tensor_bytes(&t[i]) + 7) & ~7ull;
    if (total > (uint64_t)SIZE_MAX - 64)
        return ls_fail(err, LS_E_NOMEM, "%s: shard of %llu bytes does not fit in memory", path,
                       (unsigned long long)total);
    uint8_t *buf = malloc(total ? (size_t)total : 1); /* all tensors of this shard, as stored */
    if (!buf)
        return ls_fail(err, LS_E_NOMEM,
                       "%s: cannot allocate %llu bytes for one shard (lower max_shard_bytes)",
                       path, (unsigned long long)total);
    ls_safetensors_writer *w = NULL;
    ls_status st = ls_safetensors_writer_new(&w, err);
    uint64_t off = 0;
    for (size_t i = 0; st == LS_OK && i < count; i++) {
        void *dst = buf + off;
        ls_dtype dt = ls_synth_tensor_dtype(&t[i]);
        st = ls_synth_fill_bytes(&t[i], seed, dst, err);
        if (st == LS_OK)
            st = ls_safetensors_writer_add(w, t[i].name, dt, t[i].ndim, t[i].shape, dst, err);
        off += (tensor_bytes(&t[i]) + 7) & ~7ull;
        ls_progress_add(prog, tensor_bytes(&t[i]));
    }
    if (st == LS_OK) st = ls_safetensors_writer_set_metadata(w, "format", "pt", err);
    if (st == LS_OK) st = ls_safetensors_writer_set_metadata(w, "lockstep_synth", provenance, err);
    if (st == LS_OK) st = ls_safetensors_writer_write(w, path, err);
    ls_safetensors_writer_free(w);
    free(buf);
    return st;
}

/* ---- model.safetensors.index.json ----------------------------------------------- */

static ls_status write_index(const char *path, const ls_synth_tensor *t, size_t count,
                             const size_t *shard_of, size_t n_shards, uint64_t total_bytes,
                             ls_error *err)
{
    size_t cap = 128 + count * (sizeof t[0].name + 48);
    char *s = malloc(cap);
    if (!s) return ls_fail(err, LS_E_NOMEM, "synth: out of memory (index)");
    size_t n = (size_t)snprintf(s, cap, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n"
                                        "  \"weight_map\": {\n",
                                (unsigned long long)total_bytes);
    for (size_t i = 0; i < count; i++)
        n += (size_t)snprintf(s + n, cap - n,
                              "    \"%s\": \"model-%05zu-of-%05zu.safetensors\"%s\n", t[i].name,
                              shard_of[i] + 1, n_shards, i + 1 < count ? "," : "");
    n += (size_t)snprintf(s + n, cap - n, "  }\n}\n");
    ls_status st = ls_write_file_atomic(path, s, n, err);
    free(s);
    return st;
}

/* ---- directories -------------------------------------------------------------------- */

/* Removes the regular files of a flat directory and then the directory.
 * Returns 0 when it is gone. Never descends into subdirectories. */
static int remove_flat_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    char p[8192];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && !S_ISDIR(sb.st_mode)) unlink(p);
    }
    closedir(d);
    return rmdir(dir);
}

/* 1 when dir exists and holds at least one entry, 0 when empty, -1 absent. */
static int dir_state(const char *dir, int *is_dir)
{
    struct stat sb;
    *is_dir = 0;
    if (stat(dir, &sb) != 0) return -1;
    if (!S_ISDIR(sb.st_mode)) return 1;
    *is_dir = 1;
    DIR *d = opendir(dir);
    if (!d) return 1;
    struct dirent *e;
    int any = 0;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) any = 1;
    closedir(d);
    return any;
}

/* Writes everything into tmp (which exists and is empty). */
static ls_status write_contents(const ls_synth_config *cfg, uint64_t seed, const char *tmp,
                                const ls_synth_options *opt, ls_error *err)
{
    char path[4300];
    char *text = NULL;
    size_t len = 0;
    LS_TRY(ls_synth_config_render(cfg, &text, &len, err));
    snprintf(path, sizeof path, "%s/config.json", tmp);
    ls_status st = ls_write_file_atomic(path, text, len, err);
    free(text);
    if (st != LS_OK || opt->config_only) return st;

    ls_synth_tensor *t = NULL;
    size_t count = 0;
    LS_TRY(ls_synth_list_tensors(cfg, &t, &count, err));
    size_t *shard_of = malloc((count ? count : 1) * sizeof *shard_of);
    if (!shard_of) {
        free(t);
        return ls_fail(err, LS_E_NOMEM, "synth: out of memory");
    }
    /* Greedy split in name order: a new shard starts when the next tensor
     * would push the current one past max_shard_bytes (a tensor larger than
     * the limit gets a shard of its own, as Hugging Face does). */
    uint64_t total = 0, cur = 0;
    size_t shard = 0;
    for (size_t i = 0; i < count; i++) {
        uint64_t b = tensor_bytes(&t[i]);
        if (cur > 0 && cur + b > opt->max_shard_bytes) {
            shard++;
            cur = 0;
        }
        shard_of[i] = shard;
        cur += b;
        total += b;
    }
    size_t n_shards = count ? shard + 1 : 1;

    char provenance[96];
    snprintf(provenance, sizeof provenance, "generator %d, seed %llu%s",
             LS_SYNTH_GENERATOR_VERSION, (unsigned long long)seed, cfg->fp8 ? ", fp8" : "");
    ls_progress prog;
    ls_progress_begin(&prog, "synth", total, "B");
    if (n_shards == 1) {
        snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        st = write_shard(t, count, seed, path, provenance, &prog, err);
    } else {
        size_t begin = 0;
        for (size_t s = 0; st == LS_OK && s < n_shards; s++) {
            size_t end = begin;
            while (end < count && shard_of[end] == s) end++;
            snprintf(path, sizeof path, "%s/model-%05zu-of-%05zu.safetensors", tmp, s + 1,
                     n_shards);
            st = write_shard(t + begin, end - begin, seed, path, provenance, &prog, err);
            begin = end;
        }
        if (st == LS_OK) {
            snprintf(path, sizeof path, "%s/model.safetensors.index.json", tmp);
            st = write_index(path, t, count, shard_of, n_shards, total, err);
        }
    }
    ls_progress_end(&prog);
    free(shard_of);
    free(t);
    return st;
}

ls_status ls_synth_write(const ls_synth_config *cfg, uint64_t seed, const char *dir_in,
                         const ls_synth_options *opt, ls_error *err)
{
    char dir[4096];
    size_t dl = strlen(dir_in);
    if (dl == 0 || dl >= sizeof dir - 64)
        return ls_fail(err, LS_E_USAGE, "output directory: bad name '%s'", dir_in);
    memcpy(dir, dir_in, dl + 1);
    while (dl > 1 && dir[dl - 1] == '/') dir[--dl] = '\0';

    int is_dir = 0;
    int state = dir_state(dir, &is_dir);
    struct stat sb;
    if (state >= 0 && !is_dir)
        return ls_fail(err, LS_E_USAGE, "%s: exists and is %s, not a directory", dir,
                       stat(dir, &sb) == 0 ? ls_file_kind_name(sb.st_mode) : "not a directory");
    if (state == 1 && !opt->force)
        return ls_fail(err, LS_E_USAGE, "%s exists and is not empty (the force option replaces it)", dir);

    char tmp[4200], old[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", dir, (long)getpid());
    snprintf(old, sizeof old, "%s.old.%ld", dir, (long)getpid());
    /* DIR.tmp.<pid> of a killed synth (gigabytes, maybe) goes now; this
     * one's goes on failure or on SIGTERM/SIGINT (core/util.h). */
    ls_temp_sweep_stale(dir);
    ls_temp_register(tmp, LS_TEMP_DIR);
    if (mkdir(tmp, 0777) != 0) {
        int e = errno;
        ls_temp_unregister(tmp);
        return ls_fail(err, LS_E_IO, "%s: cannot create: %s", tmp, strerror(e));
    }
    ls_status st = write_contents(cfg, seed, tmp, opt, err);
    if (st != LS_OK) {
        remove_flat_dir(tmp);
        ls_temp_unregister(tmp);
        return st;
    }
    if (state == 0 && rmdir(dir) != 0) {
        int e = errno;
        remove_flat_dir(tmp);
        ls_temp_unregister(tmp);
        return ls_fail(err, LS_E_IO, "%s: cannot replace: %s", dir, strerror(e));
    }
    if (state == 1 && rename(dir, old) != 0) {
        int e = errno;
        remove_flat_dir(tmp);
        ls_temp_unregister(tmp);
        return ls_fail(err, LS_E_IO, "%s: cannot move aside: %s", dir, strerror(e));
    }
    if (rename(tmp, dir) != 0) {
        int e = errno;
        if (state == 1) rename(old, dir);
        remove_flat_dir(tmp);
        ls_temp_unregister(tmp);
        return ls_fail(err, LS_E_IO, "%s: cannot rename into place: %s", dir, strerror(e));
    }
    ls_temp_unregister(tmp);
    if (state == 1 && remove_flat_dir(old) != 0)
        ls_log_warn("synth: the previous contents of %s were left in %s (it has subdirectories)",
                    dir, old);
    /* the files were synced when written (ls_outfile); the rename is made
     * durable here */
    return ls_fsync_parent_dir(dir, err);
}
