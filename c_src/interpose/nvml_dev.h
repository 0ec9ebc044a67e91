/* For the NVML wrappers: the container's CUDA ordinal of an NVML device (nvml_dev.c), our host pid noted (procs.c),
 * the application's own NVML session (nvml_init.c). */
#ifndef VGPU_NVML_DEV_H
#define VGPU_NVML_DEV_H

#include <nvml.h>

#include "vgpu.h"

/* matched by UUID; NVML's index before the CUDA driver can name its devices; VGPU_DEV_UNKNOWN for a device
 * this container's CUDA does not see */
VGPU_HIDDEN int vgpu_nvml_dev(nvmlDevice_t device);

/* our region slot records the host pid NVML knows this process by, once the identity probe found it, unless the
 * node side filled it (interpose/procs.c): the container's process listings then show this process */
VGPU_HIDDEN void vgpu_note_host_pid(void);

/* whether the application holds an NVML session of its own (interpose/nvml_init.c): without one a wrapped
 * NVML call answers NVML_ERROR_UNINITIALIZED, as NVML would were the shim's own session not open */
VGPU_HIDDEN int vgpu_nvml_app_open(void);

#endif
