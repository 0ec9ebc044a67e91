/* One log contract: errors always on stderr as `vgpu: <pid>: ...`; level from LIBCUDA_LOG_LEVEL
 * (0 errors, 2 warnings (default), 3 info, 4 debug). VGPU_DEBUG compiles away in release builds. */
#ifndef VGPU_LOG_H
#define VGPU_LOG_H

#include "vgpu.h"

enum { VGPU_LOG_ERROR = 0, VGPU_LOG_WARN = 2, VGPU_LOG_INFO = 3, VGPU_LOG_DEBUG = 4 };

VGPU_HIDDEN extern int vgpu_log_level;
VGPU_HIDDEN void vgpu_log_init_from_env(void);
VGPU_HIDDEN void vgpu_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define VGPU_ERROR(...) vgpu_log(VGPU_LOG_ERROR, __VA_ARGS__)
#define VGPU_WARN(...) do { if (vgpu_log_level >= VGPU_LOG_WARN) vgpu_log(VGPU_LOG_WARN, __VA_ARGS__); } while (0)
#define VGPU_INFO(...) do { if (vgpu_log_level >= VGPU_LOG_INFO) vgpu_log(VGPU_LOG_INFO, __VA_ARGS__); } while (0)
#ifdef VGPU_DEBUG_BUILD
#define VGPU_DEBUG(...) do { if (vgpu_log_level >= VGPU_LOG_DEBUG) vgpu_log(VGPU_LOG_DEBUG, __VA_ARGS__); } while (0)
#else
#define VGPU_DEBUG(...) do { } while (0)
#endif

#endif
