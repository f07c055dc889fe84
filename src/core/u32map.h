/* lockstep — a map from uint32 keys to uint32 values (open addressing,
 * linear probing, power-of-two capacity); zero-initialise to start empty.
 * The trace writer, reader and the comparator key sequences by id with it. */
#ifndef LS_CORE_U32MAP_H
#define LS_CORE_U32MAP_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct ls_u32map {
    uint32_t *keys;          /* [cap] */
    uint32_t *vals;          /* [cap] */
    uint8_t *used;           /* [cap] */
    size_t cap, n;
} ls_u32map;
/* Returns 1 and sets *val when key is present. */
int ls_u32map_get(const ls_u32map *m, uint32_t key, uint32_t *val);
ls_status ls_u32map_put(ls_u32map *m, uint32_t key, uint32_t val, ls_error *err);
void ls_u32map_free(ls_u32map *m);

#endif
