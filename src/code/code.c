/* lockstep — code digests of provider rows (code.h). */
#include "code/code.h"

#include <stdlib.h>
#include <string.h>

#include "fingerprint/sha256.h"

/* Written by cmake/gen_code_digests.c into the build tree. */
extern const ls_code_entry ls_code_entries[];
extern const size_t ls_code_n_entries;

const ls_code_entry *ls_code_list(size_t *count)
{
    *count = ls_code_n_entries;
    return ls_code_entries;
}

const ls_code_entry *ls_code_find(const char *backend, const char *name)
{
    for (size_t i = 0; i < ls_code_n_entries; i++)
        if (!strcmp(ls_code_entries[i].backend, backend) && !strcmp(ls_code_entries[i].name, name))
            return &ls_code_entries[i];
    return NULL;
}

static int ident_char(char c)
{
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

static int cmp_entry_name(const void *a, const void *b)
{
    return strcmp((*(const ls_code_entry *const *)a)->name, (*(const ls_code_entry *const *)b)->name);
}

static ls_status put_str(ls_sha256 *h, const char *s, ls_error *err)
{
    return ls_sha256_update(h, s, strlen(s) + 1, err);
}

ls_status ls_code_digest(const char *backend, const char *kernel_id, char hex[65], ls_error *err)
{
    hex[0] = '\0';
    size_t len = strlen(kernel_id), n = 0;
    /* at most one named function per two characters of text */
    const ls_code_entry **named = malloc(sizeof *named * (len / 2 + 1));
    if (!named) return ls_fail(err, LS_E_NOMEM, "code digest: out of memory");
    for (const char *p = kernel_id; *p;) {
        if (!ident_char(*p)) { p++; continue; }
        const char *e = p;
        while (ident_char(*e)) e++;
        size_t w = (size_t)(e - p);
        char name[128];
        int has_underscore = memchr(p, '_', w) != NULL;
        if (has_underscore && w < sizeof name && !(*p >= '0' && *p <= '9')) {
            memcpy(name, p, w);
            name[w] = '\0';
            const ls_code_entry *c = ls_code_find(backend, name);
            if (!c) {
                free(named);
                return ls_fail(err, LS_E_UNSUPPORTED, "code digest: %s provider '%s': '%s' names "
                               "no function in this build's code table", backend, kernel_id, name);
            }
            int dup = 0;
            for (size_t i = 0; i < n && !dup; i++) dup = named[i] == c;
            if (c->sha256 && !dup) named[n++] = c;
        } else if (has_underscore) {
            free(named);
            return ls_fail(err, LS_E_UNSUPPORTED, "code digest: %s provider '%s': identifier at "
                           "offset %zu is not a function name", backend, kernel_id,
                           (size_t)(p - kernel_id));
        }
        p = e;
    }
    if (n == 0) {
        free(named);
        return ls_fail(err, LS_E_UNSUPPORTED, "code digest: %s provider '%s' names no function "
                       "with machine code in this build", backend, kernel_id);
    }
    qsort(named, n, sizeof *named, cmp_entry_name);
    ls_sha256 h;
    ls_status st = ls_sha256_init(&h, err);
    if (st == LS_OK) st = put_str(&h, backend, err);
    for (size_t i = 0; i < n && st == LS_OK; i++) {
        st = put_str(&h, named[i]->name, err);
        if (st == LS_OK) st = put_str(&h, named[i]->sha256, err);
        if (st == LS_OK) st = put_str(&h, named[i]->ptx_sha256 ? named[i]->ptx_sha256 : "", err);
    }
    free(named);
    ls_digest d;
    if (st == LS_OK) st = ls_sha256_final(&h, &d, err);
    else ls_sha256_discard(&h);
    if (st != LS_OK) return st;
    ls_digest_to_hex(&d, hex);
    return LS_OK;
}
