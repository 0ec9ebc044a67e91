/* The one limit grammar: <number>[k|m|g|t][i][b], case-insensitive, decimal digits only,
 * binary multiples (k = KiB ... t = TiB), bare number = bytes, 0 with any unit = no limit.
 * SM limits: decimal digits only (no sign, space, '%' or unit), a whole percent; the caller maps
 * 0 and >= 100 to "no limit". Values that do not fit in 64 bits are rejected in both.
 * Mirrored exactly by vgpu_patch/limits.py (a property test proves they agree). */
#ifndef VGPU_LIMITS_PARSE_H
#define VGPU_LIMITS_PARSE_H

#include <stdint.h>

/* 0 and *bytes set on success; -1 and *why (static string) on a malformed value. */
__attribute__((visibility("hidden"))) int vgpu_limit_parse(const char *s, uint64_t *bytes, const char **why);
/* 0 and *pct set (the number as written) on success; -1 and *why on a malformed value. */
__attribute__((visibility("hidden"))) int vgpu_sm_parse(const char *s, uint64_t *pct, const char **why);

#endif
