"""Swap a library onto 50 and 100 loopback sshd nodes: the CLI against a plain `xargs -P` OpenSSH loop and
against the Ansible role, on the same fleet, in one run, interleaved, as ratios.

Each node is a real OpenSSH sshd on 127.0.0.1 (tests/sshd_harness.py) with its own library dir, logged in
as an unprivileged user with sudo (as root; as another user, the current user without sudo).
"cli"     = `vgpu-patch deploy -I hosts.ini --no-check --parallel P` in a fresh process: the whole
            protocol per node (ssh -G, probe, upload, sha256 on the node, backup, atomic swap, re-verify,
            history), startup and inventory reading (ansible-core) included.
"xargs"   = `xargs -P N` running `ssh node 'sudo sh -c "cat > tmp; cp tmp live"' < lib`: no checks, no
            backup, an in-place cp (what the tool exists to avoid), one OpenSSH connection per node.
"ansible" = `ansible-playbook deploy.yml` with serial 100% and forks = N.

    python3 bench/deploy_fleet.py [--nodes 50,100] [--rounds 3] [--ansible 50] [--size-kib 512]
Targets (issue 13): cli(50) <= xargs(50) and <= 5 s on a quiet 2-core machine; cli(100) <= 2.2 x cli(50);
ansible(50) <= 10 x cli(50). It prints every round, then each run's median and spread, and each ratio of the
medians with its spread round by round.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from sshd_harness import known_hosts_file, ssh_config_file, start_many


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
    """Every node back to just `lib`: a leftover (the xargs loop's `libvgpu.so.new` is a versioned library
    name to the tool) would turn the next run into a no-op on that node."""
    for d in dirs:
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        shutil.copyfile(lib, d / "libvgpu.so")
        left = sorted(p.name for p in d.iterdir())
        if left != ["libvgpu.so"]:
            raise SystemExit(f"bench: reset of {d} left {left}")


def inventory(servers, dirs: list[Path], path: Path) -> Path:  # type: ignore[no-untyped-def]
    lines = ["[gpu]"] + [f"{s.alias} {s.inventory_vars()} vgpu_patch_target_dir={d} "
                         f"ansible_python_interpreter={sys.executable}" for s, d in zip(servers, dirs)]
    path.write_text("\n".join(lines) + "\n")
    return path


LAST: dict[str, dict] = {}  # the last --json document of each tool, to explain a failed check


def check(dirs: list[Path], lib: Path, what: str) -> None:
    want = lib.read_bytes()
    bad = [d for d in dirs if (d / "libvgpu.so").read_bytes() != want]
    if bad:
        doc = LAST.get(what, {})
        nodes = [n for n in doc.get("nodes", []) if (n.get("result") or {}).get("path", "").startswith(f"{bad[0]}/")]
        raise SystemExit(f"bench: {what}: {len(bad)} node(s) do not have the new file, e.g. {bad[0]} "
                         f"(counts {doc.get('counts')}; its outcome {json.dumps(nodes)[:2000]})")


def cli(inv: Path, kh: Path, lib: Path, parallel: int, sudo: bool) -> float:
    cmd = [sys.executable, "-m", "vgpu_patch.cli", "deploy", "-I", str(inv), "--known-hosts", str(kh), "--no-check",
           "--canary", "0", "--parallel", str(parallel), "--json", str(lib)] + ([] if sudo else ["--no-sudo"])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    took = time.perf_counter() - start
    doc = json.loads(proc.stdout) if proc.stdout.startswith("{") else {}
    if proc.returncode != 0:
        raise SystemExit(f"bench: cli exit {proc.returncode}: {doc.get('counts')} {proc.stderr[-500:]}")
    LAST["cli"] = doc
    return took


def xargs(servers: list, dirs: list[Path], lib: Path, cfg: Path, parallel: int, sudo: bool) -> float:
    lines = "".join(f"{s.alias} {d / 'libvgpu.so'}\n" for s, d in zip(servers, dirs))
    pre = "sudo " if sudo else ""
    inner = f'ssh -F {cfg} "$1" "{pre}sh -c \'cat > $2.new && cp $2.new $2\'" < {lib}'
    start = time.perf_counter()
    argv = ["xargs", "-P", str(parallel), "-L", "1", "sh", "-c", inner, "_"]
    subprocess.run(argv, input=lines, text=True, check=True)
    return time.perf_counter() - start


def ansible(inv: Path, lib: Path, forks: int, sudo: bool) -> float:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible" / "ansible.cfg"), "ANSIBLE_FORKS": str(forks),
           "ANSIBLE_NOCOLOR": "1"}
    extra = json.dumps({"vgpu_patch_library": str(lib), "vgpu_patch_serial": "100%", "vgpu_patch_become": sudo})
    start = time.perf_counter()
    proc = subprocess.run(["ansible-playbook", "-i", str(inv), "deploy.yml", "-e", extra], cwd=REPO / "ansible",
                          capture_output=True, text=True, env=env)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"bench: ansible-playbook exit {proc.returncode}: {proc.stdout[-1500:]}")
    return took


def spread(values: list[float], digits: int = 2) -> str:
    """`median (min-max; every round)` of one series."""
    every = ", ".join(f"{v:.{digits}f}" for v in values)
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f}; {every})"


# the targets (issue 13), as (numerator, denominator, target, note)
RATIOS = [("cli(50)", "xargs(50)", 1.0, "and cli(50) <= 5 s quiet"), ("cli(100)", "cli(50)", 2.2, ""),
          ("ansible(50)", "cli(50)", 10.0, "")]


def summary(rounds: dict[str, list[float]]) -> list[str]:
    """Each run's median, spread and rounds, then each target ratio: the ratio of the medians, and the spread
    of the ratios round by round (the engines were interleaved within a round, so a round compares like with
    like on a machine whose speed drifts)."""
    lines = ["median of the rounds (min-max; every round), seconds:"]
    lines += [f"  {key:<14} {spread(values)}" for key, values in rounds.items()]
    for top, bottom, target, note in RATIOS:
        if top in rounds and bottom in rounds:
            medians = statistics.median(rounds[top]) / statistics.median(rounds[bottom])
            per_round = [a / b for a, b in zip(rounds[top], rounds[bottom])]
            lines.append(f"{top} / {bottom} = {medians:.2f} of the medians; by round {spread(per_round)}  "
                         f"(target <= {target:g}{'; ' + note if note else ''})")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="50,100")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved repetitions; each run's median, spread and every round are reported")
    ap.add_argument("--ansible", type=int, default=50, help="fleet size for the Ansible run (0: skip)")
    ap.add_argument("--size-kib", type=int, default=512, help="size of the library deployed")
    args = ap.parse_args()
    counts = [int(x) for x in args.nodes.split(",")]
    base = Path(tempfile.mkdtemp(prefix="vgpu-bench-"))
    base.chmod(0o755)
    servers = []
    try:
        t0 = time.perf_counter()
        login = dict(user="vgpubench", create_user=True, sudo=True) if os.geteuid() == 0 else {}
        sudo = bool(login)
        servers = start_many(max(counts), base / "sshd", **login)
        print(f"started {len(servers)} sshd in {time.perf_counter() - t0:.1f}s; cpus={os.cpu_count()}; "
              f"load {os.getloadavg()[0]:.2f}")
        kh = known_hosts_file(servers, base / "known_hosts")
        cfg = ssh_config_file(servers, base / "ssh_config")
        libs = [build(base / f"v{i}.so", i, args.size_kib) for i in range(1, 4)]
        print(f"library {libs[0].stat().st_size // 1024} KiB")
        rounds: dict[str, list[float]] = {}
        for r in range(args.rounds):
            for n in counts:
                dirs = [base / "lib" / str(i) for i in range(n)]
                inv = inventory(servers[:n], dirs, base / f"hosts{n}.ini")
                fleet, d, i = servers[:n], dirs, inv
                runs = [("xargs", lambda f=fleet, d=d: xargs(f, d, libs[1], cfg, 50, sudo)),
                        ("cli", lambda i=i: cli(i, kh, libs[1], 50, sudo))]
                if r % 2:
                    runs.reverse()  # interleaved: neither goes first every time
                if n == args.ansible:
                    runs.append(("ansible", lambda i=i: ansible(i, libs[1], 50, sudo)))
                for name, fn in runs:
                    reset(dirs, libs[0])
                    took = fn()
                    check(dirs, libs[1], name)
                    key = f"{name}({n})"
                    rounds.setdefault(key, []).append(took)
                    print(f"round {r + 1}: {key:<14} {took:7.2f} s  ({1000 * took / n:.0f} ms/node)", flush=True)
        print()
        print("\n".join(summary(rounds)))
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
