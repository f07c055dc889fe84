/* lockstep — little-endian loads and stores of 16/32/64-bit integers, for
 * every binary format lockstep reads or writes (traces, caches). */
#ifndef LS_CORE_BYTES_H
#define LS_CORE_BYTES_H

#include <stdint.h>

static inline uint16_t ls_rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t ls_rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t ls_rd64(const uint8_t *p) { return ls_rd32(p) | ((uint64_t)ls_rd32(p + 4) << 32); }
static inline void ls_wr16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void ls_wr32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
static inline void ls_wr64(uint8_t *p, uint64_t v) { ls_wr32(p, (uint32_t)v); ls_wr32(p + 4, (uint32_t)(v >> 32)); }

#endif
