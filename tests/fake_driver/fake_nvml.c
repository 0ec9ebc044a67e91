/* A fake libnvidia-ml.so.1: the same devices as the fake libcuda (FAKE_CUDA_DEVICES,
 * FAKE_CUDA_MEM_MB), handles are pointers to a per-device record. */
#include <stdlib.h>

#include <nvml.h>

#define EXPORT __attribute__((visibility("default")))
#define MAXDEV 16

struct nvmlDevice_st {
    unsigned index;
};

static struct nvmlDevice_st devs[MAXDEV];
static unsigned ndev = 2;
static unsigned long long total = 1024ull << 20;
static int inited;

__attribute__((constructor)) static void fake_config(void)
{
    const char *s = getenv("FAKE_CUDA_DEVICES");
    if (s)
        ndev = (unsigned)atoi(s) > MAXDEV ? MAXDEV : (unsigned)atoi(s);
    s = getenv("FAKE_CUDA_MEM_MB");
    if (s)
        total = strtoull(s, NULL, 10) << 20;
    for (unsigned i = 0; i < MAXDEV; i++)
        devs[i].index = i;
}

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    inited = 1;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    inited = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n)
{
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!n)
        return NVML_ERROR_INVALID_ARGUMENT;
    *n = ndev;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
    if (!inited)
        return NVML_ERROR_UNINITIALIZED;
    if (!d || i >= ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    *d = &devs[i];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i)
{
    if (!d || !i || d < devs || d >= devs + ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    *i = d->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
    if (!d || !m || d < devs || d >= devs + ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    m->total = total;
    m->used = 0;
    m->free = total;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
    if (!d || !m || d < devs || d >= devs + ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    m->total = total;
    m->reserved = 0;
    m->used = 0;
    m->free = total;
    return NVML_SUCCESS;
}
