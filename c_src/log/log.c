/* stderr logging with one write(2) per line, so lines from many threads never interleave. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "log/log.h"

VGPU_HIDDEN int vgpu_log_level = VGPU_LOG_WARN;

VGPU_HIDDEN void vgpu_log_init_from_env(void)
{
    const char *s = getenv("LIBCUDA_LOG_LEVEL");
    if (s && s[0] >= '0' && s[0] <= '9' && s[1] == '\0')
        vgpu_log_level = s[0] - '0';
}

VGPU_HIDDEN void vgpu_log(int level, const char *fmt, ...)
{
    char buf[1024];
    int n;
    va_list ap;

    if (level > vgpu_log_level)
        return;
    n = snprintf(buf, sizeof buf, "vgpu: %d: ", (int)getpid());
    if (n < 0 || (size_t)n >= sizeof buf)
        return;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof buf - 1)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    /* stderr only, never stdout: applications parse their stdout */
    if (write(2, buf, (size_t)n) < 0)
        return;
}
