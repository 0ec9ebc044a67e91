"""Swap a library onto 1, 10 and 50 loopback sshd nodes in parallel, and compare with a naive loop.

Each node is a real OpenSSH sshd on 127.0.0.1 (tests/sshd_harness.py) with its own library dir.
"ours" = the full protocol per node (probe, upload, sha256 on the node, backup, atomic swap,
re-verify, history), through `vgpu_patch.deploy.fleet.run_fleet` with --parallel workers.
"naive" = a sequential `ssh node 'sudo sh -c "cat > tmp; cp tmp live"' < file` loop with the OpenSSH
client: no checks, no backup, an in-place cp (what the tool exists to avoid), one connection per node.

    python3 bench/deploy_fleet.py [--nodes 1,10,50] [--parallel 10,50] [--size-kib 512]
Target: 50 nodes swapped and verified in <= 5 s on 2 cores.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from sshd_harness import known_hosts_file, ssh_config_file, start_many

from vgpu_patch.deploy.fleet import run_fleet
from vgpu_patch.deploy.swap import deploy_file
from vgpu_patch.deploy.targets import HostSpec, make_transport


def build(out: Path, version: int, size_kib: int) -> Path:
    src = out.with_suffix(".c")
    src.write_text(
        f'static const char m[] __attribute__((used)) = "vgpu-patch-shim 0.{version}.0";\n'
        f"static const unsigned char pad[{size_kib * 1024}] __attribute__((used)) = {{{version}}};\n"
        f"int bench_version(void) {{ return {version}; }}\n"
    )
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return out


def reset(dirs: list[Path], lib: Path) -> None:
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        shutil.copyfile(lib, d / "libvgpu.so")


def ours(servers, dirs, lib: Path, known_hosts: Path, parallel: int) -> float:
    specs = [HostSpec(name=s.alias, hostname=s.host, port=s.port, user=s.user, key_files=[str(s.key_path)],
                      target_dir=str(d)) for s, d in zip(servers, dirs)]

    def op(t, spec):  # type: ignore[no-untyped-def]
        r = deploy_file(t, lib, spec.target_dir, operator="bench")
        return ("changed" if r.changed else "unchanged"), r

    connect = lambda spec: make_transport(spec, known_hosts=str(known_hosts))  # noqa: E731
    start = time.perf_counter()
    res = run_fleet(specs, op, connect, parallel=parallel, canary=0)
    took = time.perf_counter() - start
    bad = [o for o in res.outcomes if o.status != "changed"]
    if bad:
        raise SystemExit(f"bench: {len(bad)} node(s) did not change: {bad[0].error}")
    want = lib.read_bytes()
    assert all((d / "libvgpu.so").read_bytes() == want for d in dirs)
    return took


def naive(servers, dirs, lib: Path, ssh_config: Path) -> float:
    start = time.perf_counter()
    for s, d in zip(servers, dirs):
        live = d / "libvgpu.so"
        cmd = f"sudo sh -c 'cat > {live}.new; cp {live}.new {live}'"
        with open(lib, "rb") as f:
            subprocess.run(["ssh", "-F", str(ssh_config), s.alias, cmd], stdin=f, check=True)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1,10,50")
    ap.add_argument("--parallel", default="10,50")
    ap.add_argument("--size-kib", type=int, default=512, help="size of the library deployed")
    args = ap.parse_args()
    counts = [int(x) for x in args.nodes.split(",")]
    parallels = [int(x) for x in args.parallel.split(",")]
    base = Path(tempfile.mkdtemp(prefix="vgpu-bench-"))
    servers = []
    try:
        t0 = time.perf_counter()
        # A login user with /bin/sh and a sudo rule, as on real nodes. (Logging in as root here would
        # also time root's ~/.bashrc, which bash sources for every ssh command: 0.3 s on dev boxes.)
        login = dict(user="vgpubench", create_user=True, sudo=True) if os.geteuid() == 0 else {}
        if not login:
            print("not root: logging in as the current user (its shell rc files are timed too)")
        servers = start_many(max(counts), base / "sshd", **login)
        print(f"started {len(servers)} sshd in {time.perf_counter() - t0:.2f}s; cpus={os.cpu_count()}")
        kh = known_hosts_file(servers, base / "known_hosts")
        cfg = ssh_config_file(servers, base / "ssh_config")
        old, new = build(base / "old.so", 1, args.size_kib), build(base / "new.so", 2, args.size_kib)
        print(f"library {new.stat().st_size // 1024} KiB")
        warm = [base / "lib" / "warmup"]
        reset(warm, old)
        print(f"warm-up (first connection, lazy imports, crypto init): {ours(servers[:1], warm, new, kh, 1):.2f}s")
        print(f"{'nodes':>5} {'parallel':>8} {'ours s':>8} {'naive s':>8} {'naive/ours':>10} {'ours/node ms':>12}")
        for n in counts:
            dirs = [base / "lib" / str(i) for i in range(n)]
            reset(dirs, old)
            t_naive = naive(servers[:n], dirs, new, cfg)
            for p in parallels:
                if p > n and p != parallels[0]:
                    continue
                reset(dirs, old)
                t_ours = ours(servers[:n], dirs, new, kh, p)
                print(f"{n:>5} {min(p, n):>8} {t_ours:>8.2f} {t_naive:>8.2f} {t_naive / t_ours:>10.2f} "
                      f"{1000 * t_ours / n:>12.1f}")
        print("target: 50 nodes swapped and verified in <= 5 s on 2 cores")
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
