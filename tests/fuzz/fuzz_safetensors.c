/* libFuzzer target: the whole safetensors validator on an arbitrary file
 * image. Accepted images are walked completely so that every tensor's span is
 * read (ASan catches any view outside the image). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ls_safetensors *st = NULL;
    ls_error err;
    ls_error_clear(&err);
    if (ls_safetensors_open_mem("fuzz.safetensors", data, size, &st, &err) != LS_OK) {
        /* A failure always carries a message naming the file. */
        if (strncmp(err.msg, "fuzz.safetensors", 16) != 0 && err.status == LS_E_INPUT) abort();
        return 0;
    }
    uint64_t expect = 0;
    unsigned sum = 0;
    for (size_t i = 0; i < ls_safetensors_count(st); i++) {
        const ls_tensor *t = ls_safetensors_at(st, i);
        /* Data order tiles the data region without gaps. */
        if (i == 0) expect = t->file_offset_bytes;
        if (t->file_offset_bytes != expect) abort();
        expect += t->size_bytes;
        if (t->numel * ls_dtype_size(t->dtype) != t->size_bytes) abort();
        const unsigned char *p = t->data;
        for (uint64_t k = 0; k < t->size_bytes; k++) sum += p[k];
        if (ls_safetensors_find(st, t->name) != t) abort();
    }
    if (ls_safetensors_count(st) && expect != size) abort();
    for (size_t i = 0; i < ls_safetensors_metadata_count(st); i++) {
        const char *k, *v;
        ls_safetensors_metadata_at(st, i, &k, &v);
        sum += (unsigned)strlen(k) + (unsigned)strlen(v);
    }
    ls_safetensors_close(st);
    return (int)(sum & 0); /* keep the reads alive */
}
