"""Decode HAMi's shared-region file (layout 1.2) the way HAMi's node monitor reads it.

The file is written by the shim (ours or the vendor's) in every process of a container. The monitor
maps it without locks, checks the magic and the major version, and sums `used[d].total` over
`procs[0..proc_num)` skipping slots with status 0. This module does the same, read-only, plus an
encoder that tests use to produce a "vendor-format" file. Offsets are x86-64/aarch64 (glibc sem_t = 32 B)
and are pinned against the C header by tests/region/test_layout.py.
"""
from __future__ import annotations

import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..report.errors import RegionError

MAGIC = 19920718
MAJOR = 1
MINOR = 2
MAX_DEVICES = 16
MAX_PROCS = 1024
UUID_LEN = 96
SEM_SIZE = 32

# One table: (field, offset, struct format). Per-element strides follow below.
REGION_FIELDS: dict[str, tuple[int, str]] = {
    "initialized_flag": (0, "<i"),
    "major_version": (4, "<I"),
    "minor_version": (8, "<I"),
    "sm_init_flag": (12, "<i"),
    "owner_pid": (16, "<Q"),
    "sem": (24, f"<{SEM_SIZE}s"),
    "device_num": (56, "<Q"),
    "uuids": (64, f"<{MAX_DEVICES * UUID_LEN}s"),
    "limit": (1600, f"<{MAX_DEVICES}Q"),
    "sm_limit": (1728, f"<{MAX_DEVICES}Q"),
    "procs": (1856, ""),
    "proc_num": (2008896, "<i"),
    "utilization_switch": (2008900, "<i"),
    "recent_kernel": (2008904, "<i"),
    "priority": (2008908, "<i"),
    "last_kernel_time": (2008912, "<Q"),
    "sem_postinit": (2008920, f"<{SEM_SIZE}s"),
}
SLOT_FIELDS: dict[str, tuple[int, str]] = {
    "pid": (0, "<i"),
    "hostpid": (4, "<i"),
    "used": (8, ""),
    "monitorused": (1032, f"<{MAX_DEVICES}Q"),
    "device_util": (1160, ""),
    "status": (1928, "<i"),
    "seqlock": (1936, "<Q"),
    "unused": (1944, "<2Q"),
}
MEMORY_FIELDS: dict[str, int] = {
    "context_size": 0, "module_size": 8, "data_size": 16, "offset": 24, "total": 32, "unused": 40,
}
UTIL_FIELDS: dict[str, int] = {"dec_util": 0, "enc_util": 8, "sm_util": 16, "unused": 24}
MEMORY_SIZE = 64
UTIL_SIZE = 48
SLOT_SIZE = 1960
REGION_SIZE = 2008952

STATUS_NAMES = {0: "exited", 1: "running", 2: "suspended"}


@dataclass
class ProcSlot:
    index: int
    pid: int
    hostpid: int
    status: int
    seqlock: int
    used: list[int]  # used[d].total, bytes
    sm_util: list[int]
    starttime: int  # our shim's owner start time (slot unused[0]); 0 when written by the vendor
    pid_ns: int = 0  # our shim's owner pid-namespace inode (slot unused[1]); 0 from the vendor
    # our shim's stamp check word and nonce (used[0].unused[0..1]): the words above are trusted only
    # when the check matches (c_src/region/ident.c); vendor writers never write any of them
    stamp_check: int = 0
    nonce: int = 0

    @property
    def status_name(self) -> str:
        return STATUS_NAMES.get(self.status, f"unknown({self.status})")


@dataclass
class Region:
    path: str
    major_version: int
    minor_version: int
    sm_init_flag: int
    owner_pid: int
    device_num: int
    uuids: list[str]
    limit: list[int]
    sm_limit: list[int]
    proc_num: int
    utilization_switch: int
    recent_kernel: int
    priority: int
    last_kernel_time: int
    procs: list[ProcSlot] = field(default_factory=list)  # procs[0..proc_num), free slots included
    # per device: GPU ns the container may still use (negative: in debt); None: no ledger kept
    sm_budget_ns: list[int | None] = field(default_factory=lambda: [None] * MAX_DEVICES)

    def used(self, dev: int) -> int:
        """Bytes in use on device `dev`, summed exactly as the monitor does (skips status 0)."""
        return sum(p.used[dev] for p in self.procs if p.status != 0)

    def live_procs(self) -> list[ProcSlot]:
        return [p for p in self.procs if p.status != 0]

    def to_json(self) -> dict[str, Any]:
        n = min(self.device_num, MAX_DEVICES)
        return {
            "path": self.path,
            "version": f"{self.major_version}.{self.minor_version}",
            "owner_pid": self.owner_pid,
            "sm_init_flag": self.sm_init_flag,
            "devices": [
                {"index": d, "uuid": self.uuids[d], "limit": self.limit[d], "used": self.used(d),
                 "sm_limit": self.sm_limit[d], "sm_budget_ns": self.sm_budget_ns[d]}
                for d in range(n)
            ],
            "proc_num": self.proc_num,
            "procs": [
                {**asdict(p), "status_name": p.status_name, "used": p.used[:n], "sm_util": p.sm_util[:n]}
                for p in self.live_procs()
            ],
            "priority": self.priority,
            "utilization_switch": self.utilization_switch,
            "recent_kernel": self.recent_kernel,
            "last_kernel_time": self.last_kernel_time,
        }


def _get(buf: bytes, base: int, fmt: str) -> Any:
    vals = struct.unpack_from(fmt, buf, base)
    return vals[0] if len(vals) == 1 else list(vals)


def _rf(buf: bytes, name: str) -> Any:
    off, fmt = REGION_FIELDS[name]
    return _get(buf, off, fmt)


# The container's compute ledger (c_src/region/layout.h): the SM budget every process of the
# container draws from, kept in the last slot's used[] entries, which the monitor never reads.
LEDGER_SLOT = MAX_PROCS - 1
LEDGER_CHECK = 0x7667707573686172  # "vgpushar", xor the device index


def ledger_offset(dev: int) -> int:
    """Offset of device `dev`'s ledger entry: check word, tokens (int64 ns), refill time (int64 ns)."""
    return slot_offset(LEDGER_SLOT) + SLOT_FIELDS["used"][0] + dev * MEMORY_SIZE


def slot_offset(i: int) -> int:
    return REGION_FIELDS["procs"][0] + i * SLOT_SIZE


def _decode_slot(buf: bytes, i: int) -> ProcSlot:
    base = slot_offset(i)
    s = {k: _get(buf, base + off, fmt) for k, (off, fmt) in SLOT_FIELDS.items() if fmt}
    used_base = base + SLOT_FIELDS["used"][0]
    util_base = base + SLOT_FIELDS["device_util"][0]
    used = [_get(buf, used_base + d * MEMORY_SIZE + MEMORY_FIELDS["total"], "<Q") for d in range(MAX_DEVICES)]
    sm = [_get(buf, util_base + d * UTIL_SIZE + UTIL_FIELDS["sm_util"], "<Q") for d in range(MAX_DEVICES)]
    stamp = _get(buf, used_base + MEMORY_FIELDS["unused"], "<2Q")
    return ProcSlot(i, s["pid"], s["hostpid"], s["status"], s["seqlock"], used, sm, s["unused"][0], s["unused"][1],
                    stamp[0], stamp[1])


def decode(buf: bytes, path: str = "<bytes>") -> Region:
    """Decode a region image; raise RegionError (one line) when the monitor would reject it."""
    if len(buf) < REGION_SIZE:
        raise RegionError(
            f"{path}: {len(buf)} bytes, a layout 1.2 region is {REGION_SIZE}; the file is truncated or not a region"
        )
    magic = _rf(buf, "initialized_flag")
    if magic != MAGIC:
        raise RegionError(
            f"{path}: magic {magic} is not {MAGIC}; not a HAMi shared region (or not initialised yet)"
        )
    major = _rf(buf, "major_version")
    if major != MAJOR:
        raise RegionError(
            f"{path}: layout major version {major}, this reader understands {MAJOR}.x; upgrade vgpu-patch"
        )
    raw_uuids = _rf(buf, "uuids")
    uuids = [raw_uuids[d * UUID_LEN:(d + 1) * UUID_LEN].split(b"\0", 1)[0].decode("utf-8", "replace")
             for d in range(MAX_DEVICES)]
    proc_num = _rf(buf, "proc_num")
    n = max(0, min(proc_num, MAX_PROCS))  # a corrupt count never makes us read past the table
    return Region(
        path=path,
        major_version=major,
        minor_version=_rf(buf, "minor_version"),
        sm_init_flag=_rf(buf, "sm_init_flag"),
        owner_pid=_rf(buf, "owner_pid"),
        device_num=_rf(buf, "device_num"),
        uuids=uuids,
        limit=_rf(buf, "limit"),
        sm_limit=_rf(buf, "sm_limit"),
        proc_num=proc_num,
        utilization_switch=_rf(buf, "utilization_switch"),
        recent_kernel=_rf(buf, "recent_kernel"),
        priority=_rf(buf, "priority"),
        last_kernel_time=_rf(buf, "last_kernel_time"),
        procs=[_decode_slot(buf, i) for i in range(n)],
        sm_budget_ns=[_ledger_tokens(buf, d) for d in range(MAX_DEVICES)],
    )


def _ledger_tokens(buf: bytes, dev: int) -> int | None:
    check, tokens = struct.unpack_from("<Qq", buf, ledger_offset(dev))
    return tokens if check == LEDGER_CHECK ^ dev else None


def read_region(path: str | Path) -> Region:
    """Read and decode the region file at `path`."""
    p = Path(path)
    try:
        buf = p.read_bytes()
    except FileNotFoundError:
        raise RegionError(f"{p}: no such file; set CUDA_DEVICE_MEMORY_SHARED_CACHE's path "
                          "or run a CUDA program first") from None
    except OSError as e:
        raise RegionError(f"{p}: cannot read ({e.strerror}); run as the file's owner or root") from None
    return decode(buf, str(p))


# --- encoder: only for tests, to produce what a vendor writer leaves on disk ---------------------

@dataclass
class SlotSpec:
    pid: int
    used: dict[int, int]  # device -> bytes
    status: int = 1
    hostpid: int = 0
    sm_util: dict[int, int] = field(default_factory=dict)
    starttime: int = 0
    pid_ns: int = 0
    stamp_check: int = 0  # used[0].unused[0]
    nonce: int = 0  # used[0].unused[1]


def encode(
    *,
    uuids: list[str],
    limit: list[int],
    sm_limit: list[int] | None = None,
    procs: list[SlotSpec] | None = None,
    priority: int = 1,
    utilization_switch: int = 1,
    recent_kernel: int = 0,
    last_kernel_time: int = 0,
    owner_pid: int = 0,
    sm_init_flag: int = 0,
    magic: int = MAGIC,
    major: int = MAJOR,
    minor: int = MINOR,
) -> bytes:
    """A full region image as a vendor writer lays it out (semaphores zeroed; readers ignore them)."""
    buf = bytearray(REGION_SIZE)

    def put(off: int, fmt: str, *vals: Any) -> None:
        struct.pack_into(fmt, buf, off, *vals)

    def pad16(vals: list[int]) -> list[int]:
        return list(vals) + [0] * (MAX_DEVICES - len(vals))

    put(0, "<i", magic)
    put(4, "<I", major)
    put(8, "<I", minor)
    put(12, "<i", sm_init_flag)
    put(16, "<Q", owner_pid)
    put(56, "<Q", len(uuids))
    for d, u in enumerate(uuids):
        raw = u.encode()[: UUID_LEN - 1]
        buf[64 + d * UUID_LEN: 64 + d * UUID_LEN + len(raw)] = raw
    put(REGION_FIELDS["limit"][0], f"<{MAX_DEVICES}Q", *pad16(limit))
    put(REGION_FIELDS["sm_limit"][0], f"<{MAX_DEVICES}Q", *pad16(sm_limit or []))
    for i, spec in enumerate(procs or []):
        base = slot_offset(i)
        put(base, "<ii", spec.pid, spec.hostpid)
        for d, b in spec.used.items():
            put(base + 8 + d * MEMORY_SIZE + MEMORY_FIELDS["data_size"], "<Q", b)
            put(base + 8 + d * MEMORY_SIZE + MEMORY_FIELDS["total"], "<Q", b)
        for dev, util in spec.sm_util.items():
            put(base + SLOT_FIELDS["device_util"][0] + dev * UTIL_SIZE + UTIL_FIELDS["sm_util"], "<Q", util)
        put(base + SLOT_FIELDS["status"][0], "<i", spec.status)
        put(base + SLOT_FIELDS["unused"][0], "<QQ", spec.starttime, spec.pid_ns)
        put(base + 8 + MEMORY_FIELDS["unused"], "<QQ", spec.stamp_check, spec.nonce)
    put(REGION_FIELDS["proc_num"][0], "<i", len(procs or []))
    put(REGION_FIELDS["utilization_switch"][0], "<i", utilization_switch)
    put(REGION_FIELDS["recent_kernel"][0], "<i", recent_kernel)
    put(REGION_FIELDS["priority"][0], "<i", priority)
    put(REGION_FIELDS["last_kernel_time"][0], "<Q", last_kernel_time)
    return bytes(buf)
