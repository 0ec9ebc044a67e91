/* Project-wide definitions shared by every layer of the shim. */
#ifndef VGPU_H
#define VGPU_H

#define VGPU_HIDDEN __attribute__((visibility("hidden")))
#define VGPU_EXPORT __attribute__((visibility("default")))
#define VGPU_LIKELY(x) __builtin_expect(!!(x), 1)
#define VGPU_UNLIKELY(x) __builtin_expect(!!(x), 0)

#ifndef VGPU_VERSION
#define VGPU_VERSION "0.1.0"
#endif

/* HAMi's layout and the monitor both assume at most 16 devices per container. */
#define VGPU_MAX_DEVICES 16

/* device ids returned by accounting/device.c when nothing must be charged */
#define VGPU_DEV_UNKNOWN (-1)
#define VGPU_DEV_HOST (-2)

#endif
