/* lockstep — uint32 -> uint32 map; see u32map.h. */
#include "core/u32map.h"

#include <stdlib.h>
#include <string.h>

static size_t u32_hash(uint32_t k, size_t cap) { return (size_t)((k * 2654435761u) ^ (k >> 16)) & (cap - 1); }

int ls_u32map_get(const ls_u32map *m, uint32_t key, uint32_t *val)
{
    if (!m->cap) return 0;
    for (size_t i = u32_hash(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (!m->used[i]) return 0;
        if (m->keys[i] == key) {
            *val = m->vals[i];
            return 1;
        }
    }
}

ls_status ls_u32map_put(ls_u32map *m, uint32_t key, uint32_t val, ls_error *err)
{
    if ((m->n + 1) * 2 > m->cap) {
        size_t ncap = m->cap ? m->cap * 2 : 64;
        ls_u32map nm = {calloc(ncap, 4), calloc(ncap, 4), calloc(ncap, 1), ncap, 0};
        if (!nm.keys || !nm.vals || !nm.used) {
            ls_u32map_free(&nm);
            return ls_fail_nomem(err, ncap * 9, "map of %zu entries", ncap);
        }
        for (size_t i = 0; i < m->cap; i++)
            if (m->used[i]) LS_TRY(ls_u32map_put(&nm, m->keys[i], m->vals[i], err));
        ls_u32map_free(m);
        *m = nm;
    }
    size_t i = u32_hash(key, m->cap);
    while (m->used[i] && m->keys[i] != key) i = (i + 1) & (m->cap - 1);
    if (!m->used[i]) m->n++;
    m->used[i] = 1;
    m->keys[i] = key;
    m->vals[i] = val;
    return LS_OK;
}

void ls_u32map_free(ls_u32map *m)
{
    free(m->keys);
    free(m->vals);
    free(m->used);
    memset(m, 0, sizeof *m);
}
