/* Context and stream pre-charges (precharge.h): the charging floor above overhead.c's measurement.
 * They decide what may be taken (vgpu_charge_quiet) and refuse; overhead.c only measures. */
#include "accounting/budget.h"
#include "accounting/charge.h"
#include "accounting/overhead.h"
#include "accounting/precharge.h"
#include "log/log.h"

#define MiB (1024.0 * 1024.0)
/* The driver keeps its streams' state in pieces of device memory (on an H200 a 2 MiB piece for
 * every four streams, kept when streams are destroyed), outside any allocation. */
#define PIECE_BYTES (2u << 20)

static void drop_precharge(struct vgpu_ctx_probe *p)
{
    if (!p->precharge)
        return;
    vgpu_budget_release(p->dev, p->precharge);
    vgpu_overhead_standin(p->dev, p->precharge, 0);
    p->precharge = 0;
}

/* A context's memory is taken by the driver during the call: charged after, a context the container
 * has no room for was over the limit until it was destroyed again. So what such a context takes
 * (this process's last one, else what the container's last new process's first one took) is
 * charged first, and a context that would not fit is refused before the driver makes it. */
VGPU_HIDDEN CUresult vgpu_ctx_before(int dev, struct vgpu_ctx_probe *p)
{
    uint64_t est, room, limit;

    p->dev = dev;
    p->armed = 0;
    p->precharge = 0;
    p->added = 0;
    if (dev < 0 || dev >= VGPU_MAX_DEVICES || !(limit = vgpu_budget_limit(dev)))
        return CUDA_SUCCESS;
    est = vgpu_overhead_ctx_estimate(dev);
    /* with room for the probe that finds our NVML entry, while it is unknown (a second room is
     * given back under the lock) */
    room = vgpu_overhead_room_wanted(dev);
    if (room && vgpu_charge_quiet(dev, est + room) != CUDA_SUCCESS)
        room = 0; /* no room for it: the context alone (our entry is found later, or never) */
    if (!room && est && vgpu_charge_quiet(dev, est) != CUDA_SUCCESS) {
        VGPU_WARN("device %d: a new CUDA context would take about %.0f MiB (what the container's last one took), "
                  "more than the container has (%.0f of %.0f MiB used): refused before the driver makes it",
                  dev, est / MiB, vgpu_budget_used(dev) / MiB, limit / MiB);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (room)
        vgpu_overhead_keep_room(dev, room);
    if (est) { /* a stand-in for the context's memory, not an allocation: measured as overhead once made */
        vgpu_overhead_standin(dev, est, 1);
        p->precharge = est;
    }
    /* landed once known for what they are: a reading in between would take them for allocations held */
    vgpu_budget_landed(dev, est + room);
    vgpu_overhead_snapshot(p);
    return CUDA_SUCCESS;
}

VGPU_HIDDEN CUresult vgpu_ctx_after(CUresult rc, struct vgpu_ctx_probe *p)
{
    uint64_t limit, took;
    int judge;

    if (!p->armed || rc != CUDA_SUCCESS) {
        drop_precharge(p); /* no context, or no NVML to measure it with (then it goes uncounted, said once) */
        return rc;
    }
    limit = vgpu_budget_limit(p->dev);
    judge = vgpu_overhead_measure_ctx(p, limit, &took);
    drop_precharge(p); /* the context itself is charged now: what the stand-in did not cover goes */
    /* a context the container has no room for is refused, as a full GPU refuses it: on our own
     * figure, or on the device-wide delta when NVML cannot list processes at all (it may hold a
     * neighbour's memory, but nothing better will ever come); not while our entry is merely not
     * found yet */
    if (judge && limit && vgpu_budget_used(p->dev) > limit) {
        VGPU_WARN("device %d: a new CUDA context takes %.0f MiB the container does not have (%.0f of %.0f MiB "
                  "used): refused",
                  p->dev, took / MiB, vgpu_budget_used(p->dev) / MiB, limit / MiB);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return rc;
}

VGPU_HIDDEN void vgpu_ctx_undo(struct vgpu_ctx_probe *p)
{
    vgpu_overhead_forget_ctx(p, vgpu_budget_limit(p->dev));
}

VGPU_HIDDEN CUresult vgpu_growth_before(int dev, struct vgpu_growth *g)
{
    g->dev = dev;
    g->standin = 0;
    if (dev < 0 || dev >= VGPU_MAX_DEVICES || !vgpu_budget_limit(dev))
        return CUDA_SUCCESS;
    if (vgpu_charge_quiet(dev, PIECE_BYTES) != CUDA_SUCCESS) {
        vgpu_charge_refused(dev, PIECE_BYTES, "a new stream, for which the driver may take");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    vgpu_overhead_standin(dev, PIECE_BYTES, 1);
    vgpu_budget_landed(dev, PIECE_BYTES); /* once known for a stand-in */
    g->standin = PIECE_BYTES;
    return CUDA_SUCCESS;
}

VGPU_HIDDEN void vgpu_growth_after(CUresult rc, struct vgpu_growth *g)
{
    if (g->dev < 0 || g->dev >= VGPU_MAX_DEVICES || !g->standin)
        return;
    if (rc == CUDA_SUCCESS) /* what the call took is overhead now, and held at the stand-in until ruled out */
        vgpu_overhead_measure_growth(g, vgpu_budget_limit(g->dev));
    /* given back before it stops being a stand-in: a reading in between would take it for held */
    vgpu_budget_release(g->dev, g->standin);
    vgpu_overhead_standin(g->dev, g->standin, 0);
}
