"""Real OpenSSH keys and allowed-signers files for the signature tests (ssh-keygen, no stand-in)."""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Key:
    private: Path
    principal: str

    @property
    def public(self) -> Path:
        return self.private.with_name(self.private.name + ".pub")

    def allowed_line(self) -> str:
        return f'{self.principal} namespaces="vgpu-patch" {self.public.read_text().strip()}\n'


def make_key(d: Path, principal: str) -> Key:
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen not installed (openssh-client)")
    d.mkdir(parents=True, exist_ok=True)
    path = d / principal.split("@")[0]
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", principal, "-f", str(path)], check=True,
                   timeout=60)
    return Key(path, principal)


def allowed_signers(path: Path, *keys: Key) -> Path:
    path.write_text("".join(k.allowed_line() for k in keys))
    return path


def sign(library: Path, key: Key) -> Path:
    """What `vgpu-patch build --sign` does, by hand: ssh-keygen -Y sign into <library>.sig."""
    library.with_name(library.name + ".sig").unlink(missing_ok=True)  # ssh-keygen keeps an existing one
    subprocess.run(["ssh-keygen", "-Y", "sign", "-q", "-f", str(key.private), "-n", "vgpu-patch", str(library)],
                   check=True, capture_output=True, timeout=60)
    return library.with_name(library.name + ".sig")
