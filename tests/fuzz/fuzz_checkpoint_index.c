/* libFuzzer: a sharded checkpoint's model.safetensors.index.json. The input
 * is the index; the directory around it holds a config.json and two small
 * shards (written once). ls_checkpoint_open either refuses, with a message
 * naming the checkpoint's directory or one of its files, or gives tensors
 * each of which is found by its name and lies inside its shard. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint.h"

static char g_dir[64];

static void write_shard(const char *name, const char *const *tensors, int n)
{
    static const uint16_t vals[8] = {0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0, 0x40c0, 0x40e0, 0x4100};
    ls_safetensors_writer *w;
    ls_error err;
    if (ls_safetensors_writer_new(&w, &err) != LS_OK) abort();
    for (int i = 0; i < n; i++) {
        int64_t shape[2] = {2, 4};
        if (ls_safetensors_writer_add(w, tensors[i], LS_DTYPE_BF16, 2, shape, vals, &err) != LS_OK) abort();
    }
    char path[128];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    if (ls_safetensors_writer_write(w, path, &err) != LS_OK) abort();
    ls_safetensors_writer_free(w);
}

static void cleanup(void)
{
    static const char *const names[] = {"config.json", "model.safetensors.index.json",
                                        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    char path[128];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", g_dir, names[i]);
        unlink(path);
    }
    rmdir(g_dir);
}

static void setup(void)
{
    if (g_dir[0]) return;
    snprintf(g_dir, sizeof g_dir, "/tmp/fuzz_ckindex_%d", (int)getpid());
    mkdir(g_dir, 0700);
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    fputs("{\"model_type\": \"qwen3_next\"}\n", f);
    fclose(f);
    static const char *const a[] = {"lm_head.weight", "model.embed_tokens.weight", "mtp.fc.weight"};
    static const char *const b[] = {"model.norm.weight", "model.language_model.layers.0.mlp.gate.weight",
                                    "model.visual.blocks.0.attn.qkv.weight"};
    write_shard("model-00001-of-00002.safetensors", a, 3);
    write_shard("model-00002-of-00002.safetensors", b, 3);
    atexit(cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1u << 16)) return 0;
    setup();
    char path[128];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", g_dir);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    ls_checkpoint *ck = NULL;
    ls_error err;
    ls_error_clear(&err);
    if (ls_checkpoint_open(g_dir, &ck, &err) != LS_OK) {
        if (strncmp(err.msg, g_dir, strlen(g_dir)) != 0 && err.status != LS_E_NOMEM) abort();
        return 0;
    }
    for (size_t i = 0; i < ls_checkpoint_count(ck); i++) {
        const ls_tensor *t = ls_checkpoint_at(ck, i);
        if (ls_checkpoint_find(ck, t->name) != t) abort();
        if (t->size_bytes) {
            volatile uint8_t sink = ((const uint8_t *)t->data)[t->size_bytes - 1];
            (void)sink;
        }
    }
    ls_checkpoint_close(ck);
    return 0;
}
