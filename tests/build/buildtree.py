"""The fixture shim tree for build tests (a helper module; conftest.py holds the fixtures).

Ours, not c_src: a hooks.def, exported wrappers, a hidden cross-file helper and data object, an
assembler file for both arches, calls that pull versioned glibc symbols (dlsym, pthread_create:
GLIBC_2.34 when linked against a new host glibc), and a broken tests/ file the build must ignore.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

HOOKS_DEF = """\
/* fixture table: HOOK(name, lib, kind) */
HOOK(cuInit, CUDA, OWN)
HOOK(cuMemGetInfo_v2, CUDA, OWN)
HOOK(nvmlInit_v2, NVML, OWN)
HOOK(vgpuFixtureTrampoline, CUDA, PASS)
"""

HOOKS_C = """\
#include <cuda.h>
#include <nvml.h>
#include "core.h"

VGPU_EXPORT CUresult cuInit(unsigned int flags)
{
    return fx_core_init(flags) ? CUDA_ERROR_NOT_INITIALIZED : CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    if (free_b) *free_b = fx_limit();
    if (total_b) *total_b = fx_limit();
    return CUDA_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
"""

CORE_H = """\
#ifndef FX_CORE_H
#define FX_CORE_H
#include <stddef.h>
#define VGPU_HIDDEN __attribute__((visibility("hidden")))
#define VGPU_EXPORT __attribute__((visibility("default")))
#ifndef VGPU_VERSION
#define VGPU_VERSION "0"
#endif
VGPU_HIDDEN int fx_core_init(unsigned int flags);
VGPU_HIDDEN size_t fx_limit(void);
VGPU_HIDDEN extern int fx_internal_counter;
#endif
"""

CORE_C = """\
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "core.h"

__attribute__((used)) static const char ident[] = "vgpu-patch-shim " VGPU_VERSION;
int fx_internal_counter;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static void *real_init;

static void *worker(void *arg) { return arg; }

static void do_init(void)
{
    pthread_t t;
    real_init = dlsym(RTLD_NEXT, "cuInit");
    if (pthread_create(&t, NULL, worker, NULL) == 0)
        pthread_join(t, NULL);
#ifdef VGPU_DEBUG_BUILD
    fprintf(stderr, "vgpu: debug init at %s:%d\\n", __FILE__, __LINE__);
#endif
}

int fx_core_init(unsigned int flags)
{
    (void)flags;
    pthread_once(&once, do_init);
    fx_internal_counter++;
    return real_init == NULL && getenv("FX_STRICT") != NULL;
}

size_t fx_limit(void) { return (size_t)4 << 30; }
"""

TRAMPOLINE_S = """\
/* one exported symbol from assembler, for both arches */
    .text
    .globl vgpuFixtureTrampoline
    .type vgpuFixtureTrampoline, @function
vgpuFixtureTrampoline:
#if defined(__x86_64__)
    xorl %eax, %eax
    ret
#elif defined(__aarch64__)
    mov w0, #0
    ret
#endif
    .size vgpuFixtureTrampoline, .-vgpuFixtureTrampoline
    .section .note.GNU-stack,"",@progbits
"""

FILES = {
    "driver/hooks.def": HOOKS_DEF,
    "interpose/hooks.c": HOOKS_C,
    "interpose/trampoline.S": TRAMPOLINE_S,
    "core.h": CORE_H,
    "core.c": CORE_C,
    "tests/broken.c": "this is not C and must never be compiled\n",
    "README": "not a source file\n",
}
EXPORTS = ["cuInit", "cuMemGetInfo_v2", "nvmlInit_v2", "vgpuFixtureTrampoline"]


def write_tree(root: Path, files: dict[str, str] | None = None) -> Path:
    for rel, text in (files or FILES).items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root



def have_gcc() -> bool:
    return shutil.which("gcc") is not None


needs_gcc = pytest.mark.skipif(not have_gcc(), reason="gcc not installed")
