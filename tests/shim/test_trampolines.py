"""PASS trampolines: arguments survive the slow path, calls before init (from another library's
constructor) work, and the generated code addresses the right slot on x86_64 and aarch64."""
from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from vgpu_patch.shim_build.surface import parse_hooks

from .harness import Env

C_SRC = Path(__file__).resolve().parents[2] / "c_src"

SNIPPET = r"""
#include <cuda.h>
#include <stdio.h>
void fake_last_args(unsigned long long out[6]);
int main(void)
{
    unsigned long long a[6];
    /* the very first call into the shim: the slot is empty, the slow path resolves it */
    CUresult rc = cuMemsetD2D32Async(0x1111222233334444ull, 0x5555, 0x66667777u, 0x8888, 0x9999, (CUstream)0xabcdef);
    fake_last_args(a);
    printf("%d %llx %llx %llx %llx %llx %llx\n", rc, a[0], a[1], a[2], a[3], a[4], a[5]);
    return 0;
}
"""


def test_slow_path_keeps_every_argument(env: Env) -> None:
    exe = env.compile_c("six_args", SNIPPET, f"-L{env.fake_dir}", "-l:libcuda.so.1")
    child = env.run_c(exe)
    assert child.rc == 0, child.stderr
    assert child.stdout.split() == ["777", "1111222233334444", "5555", "66667777", "8888", "9999", "abcdef"]


CTOR_LIB = r"""
#include <cuda.h>
#include <stdio.h>
/* runs before main, possibly before the shim's own constructor has read the environment */
__attribute__((constructor)) static void early(void)
{
    int n = -1;
    CUdevice d = -1;
    CUcontext c = 0;
    CUdeviceptr p = 0;
    size_t f = 0, t = 0;
    CUresult r0 = cuInit(0), r1 = cuDeviceGetCount(&n), r2 = cuDevicePrimaryCtxRetain(&c, 0);
    cuCtxSetCurrent(c);
    CUresult r3 = cuCtxGetDevice(&d), r4 = cuMemAlloc_v2(&p, 48 << 20), r5 = cuMemAlloc_v2(&p, 48 << 20);
    CUresult r6 = cuMemGetInfo_v2(&f, &t);
    printf("early %d %d %d %d %d %d %d n=%d d=%d total=%zu\n", r0, r1, r2, r3, r4, r5, r6, n, d, t);
}
"""


def test_calls_from_another_librarys_constructor(env: Env) -> None:
    src = env.tmp / "early.c"
    src.write_text(CTOR_LIB)
    lib = env.tmp / "libearly.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wall", "-Werror", f"-I{env.shim.parent}", f"-I{_headers()}",
                    str(src), "-o", str(lib), f"-L{env.fake_dir}", "-l:libcuda.so.1"], check=True,
                   capture_output=True, text=True)
    exe = env.compile_c("early_main", "int main(void) { return 0; }\n", f"-L{env.tmp}", f"-Wl,-rpath,{env.tmp}",
                        "-Wl,--no-as-needed", "-learly")
    child = env.run_c(exe, {"CUDA_DEVICE_MEMORY_LIMIT": "64m"})
    assert child.rc == 0, child.stderr
    assert child.stdout.split() == ["early", "0", "0", "0", "0", "0", "2", "0", "n=2", "d=0", f"total={64 << 20}"]


def _headers() -> Path:
    from vgpu_patch.shim_build.build import header_dir
    return header_dir()


def _slot_of_x86(data: bytes, off: int, addr: int) -> tuple[int, int]:
    # movq disp32(%rip), %r11 ; testq ; jz ; jmpq *%r11 ; movl $idx, %r11d
    assert data[off:off + 3] == b"\x4c\x8b\x1d", data[off:off + 8].hex()
    slot = addr + 7 + struct.unpack_from("<i", data, off + 3)[0]
    assert data[off + 15:off + 17] == b"\x41\xbb"
    return slot, struct.unpack_from("<I", data, off + 17)[0]


def _slot_of_aarch64(data: bytes, off: int, addr: int) -> tuple[int, int]:
    adrp, ldr, _cbz, br, movz = struct.unpack_from("<5I", data, off)
    assert adrp & 0x9F00001F == 0x90000010, "adrp x16"
    assert br == 0xD61F0220, "br x17"
    page = (((adrp >> 5) & 0x7FFFF) << 2 | ((adrp >> 29) & 3)) << 12
    if page & (1 << 32):
        page -= 1 << 33
    slot = (addr & ~0xFFF) + page + ((ldr >> 10) & 0xFFF) * 8
    assert movz & 0xFFE0001F == 0xD2800010, "movz x16, #idx"
    return slot, (movz >> 5) & 0xFFFF


STUB_RESOLVER = "void *vgpu_slot_resolve(int idx) { (void)idx; return 0; }\n"


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_each_trampoline_uses_its_own_slot(tmp_path: Path, arch: str) -> None:
    (tmp_path / "r.c").write_text(STUB_RESOLVER)
    so = tmp_path / "t.so"
    cc = ["gcc"] if arch == "x86_64" else [sys.executable, "-m", "ziglang", "cc", "-target", "aarch64-linux-gnu"]
    subprocess.run(cc + ["-shared", "-fPIC", "-nostdlib", f"-I{C_SRC}", str(C_SRC / "driver" / "trampolines.S"),
                         str(tmp_path / "r.c"), "-o", str(so)], check=True, capture_output=True, text=True)
    hooks = parse_hooks()
    with so.open("rb") as f:
        elf = ELFFile(f)
        syms = {s.name: s["st_value"] for s in elf.get_section_by_name(".symtab").iter_symbols()}
        text = elf.get_section_by_name(".text")
        data, base = text.data(), text["sh_addr"]
        real = syms["vgpu_real"]
        decode = _slot_of_x86 if arch == "x86_64" else _slot_of_aarch64
        checked = 0
        for i, h in enumerate(hooks):
            if h.kind != "PASS":
                assert h.name not in syms or syms[h.name] == 0
                continue
            slot, idx = decode(data, syms[h.name] - base, syms[h.name])
            assert (slot - real) // 8 == i and idx == i, h.name
            checked += 1
    assert checked == sum(h.kind == "PASS" for h in hooks) > 390


def test_shim_posing_as_libcuda_aborts_with_a_clear_message(env: Env) -> None:
    """libcuda.so.1 resolving to the shim itself (a bad symlink, two copies) must not recurse forever."""
    bad = env.tmp / "bad"
    bad.mkdir()
    (bad / "libcuda.so.1").symlink_to(env.shim)
    exe = env.compile_c("init_only", "#include <cuda.h>\nint main(void) { return cuInit(0); }\n",
                        f"-L{env.fake_dir}", "-l:libcuda.so.1")
    e = env.base_env({"LD_LIBRARY_PATH": str(bad), "LD_PRELOAD": str(env.shim)})
    p = subprocess.run([str(exe)], env=e, capture_output=True, text=True, timeout=60)
    assert p.returncode == -6, (p.returncode, p.stderr)  # SIGABRT
    assert "two copies of libvgpu are loaded" in p.stderr


RACE = r"""
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>

#define N 32
static pthread_barrier_t go;
static CUresult rcs[N][3];

static void *first_calls(void *arg)
{
    long i = (long)arg;
    int n = 0;
    CUdevice d;
    pthread_barrier_wait(&go);
    /* every thread's first call lands in an empty slot at the same moment */
    rcs[i][0] = (i & 1) ? cuInit(0) : cuDeviceGetCount(&n);
    rcs[i][1] = cuInit(0);
    rcs[i][2] = cuDeviceGet(&d, 0);
    return NULL;
}

int main(void)
{
    pthread_t t[N];
    long i;
    int bad = 0;
    pthread_barrier_init(&go, NULL, N);
    for (i = 0; i < N; i++)
        pthread_create(&t[i], NULL, first_calls, (void *)i);
    for (i = 0; i < N; i++)
        pthread_join(t[i], NULL);
    for (i = 0; i < N; i++)
        bad += ((i & 1) ? rcs[i][0] != 0 : (rcs[i][0] != 0 && rcs[i][0] != 3)) || rcs[i][1] != 0 || rcs[i][2] != 0;
    printf("bad=%d\n", bad);
    return 0;
}
"""


def test_first_calls_race_from_many_threads(env: Env) -> None:
    exe = env.compile_c("race", RACE, f"-L{env.fake_dir}", "-l:libcuda.so.1")
    for _ in range(5):
        child = env.run_c(exe)
        assert child.rc == 0 and child.stdout.strip() == "bad=0", (child.rc, child.stdout, child.stderr)
