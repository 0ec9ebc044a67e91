"""OpenSSH signatures over a built library: `ssh-keygen -Y sign` writes `<library>.sig` in the `vgpu-patch`
namespace, and `verify` checks it against an allowed-signers file (ssh-keygen's own format) before
anything reaches a node. ssh-keygen does the cryptography; this module only reads the signature's
header, to name the key and namespace in a refusal."""
from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..report.errors import SignatureError, UsageError

NAMESPACE = "vgpu-patch"
SUFFIX = ".sig"
TIMEOUT_S = 120  # a passphrase prompt for --sign waits on the terminal
_ARMOR = ("-----BEGIN SSH SIGNATURE-----", "-----END SSH SIGNATURE-----")


@dataclass(frozen=True)
class Signer:
    principal: str  # the allowed-signers line's name that matched
    key: str  # `SHA256:...`, as ssh-keygen prints key fingerprints

    def __str__(self) -> str:
        return f"{self.principal} ({self.key})"

    def to_dict(self) -> dict[str, str]:
        """As `deploy --json`, the history and the node's signature records write it."""
        return {"principal": self.principal, "key": self.key}


@dataclass(frozen=True)
class Signature:
    """A verified signature as a node keeps it beside its backups: who signed, and the `.sig` itself."""

    signer: Signer
    text: str  # the armored SSHSIG, as ssh-keygen wrote it


def verified(library: Path | str, allowed_signers: Path | str, *, shown: Path | str | None = None) -> Signature:
    """`verify`, with the signature's text read first: what is kept on the node is what was checked. Give a
    private snapshot as `library` (deploy.candidate.snapshot: the `.sig` copied beside it) and the file the
    operator named as `shown`, for the messages."""
    sig = signature_path(library)
    before = sig.read_bytes() if sig.is_file() else b""
    signer = verify(library, allowed_signers, shown=shown)
    if sig.read_bytes() != before:
        raise SignatureError(f"{sig}: changed while it was being checked; rerun (nothing was changed)")
    return Signature(signer, before.decode(errors="replace").strip())


def signature_path(library: Path | str) -> Path:
    """Where a library's signature lives: `<library>.sig` beside it."""
    library = Path(library)
    return library.with_name(library.name + SUFFIX)


def _ssh_keygen() -> str:
    exe = shutil.which("ssh-keygen")
    if exe is None:
        raise UsageError("ssh-keygen not found on PATH: install the OpenSSH client (apt-get install openssh-client)")
    return exe


def _header(sig: Path, library: Path | str) -> tuple[str, str]:
    """(key fingerprint, namespace) from an armored SSHSIG, or SignatureError naming what is wrong."""
    shown = Path(library).with_name(sig.name)
    text = sig.read_text(errors="replace").strip().splitlines()
    if len(text) < 3 or text[0].strip() != _ARMOR[0] or text[-1].strip() != _ARMOR[1]:
        raise SignatureError(f"{shown}: not an OpenSSH signature (no SSH SIGNATURE armor): sign the library again")
    try:
        blob = base64.b64decode("".join(line.strip() for line in text[1:-1]), validate=True)
        if blob[:6] != b"SSHSIG":
            raise ValueError("no SSHSIG magic")
        fields, pos = [], 10  # magic, then a uint32 version
        for _ in range(2):  # the public key, then the namespace
            n = int.from_bytes(blob[pos:pos + 4], "big")
            if n <= 0 or pos + 4 + n > len(blob):
                raise ValueError("truncated")
            fields.append(blob[pos + 4:pos + 4 + n])
            pos += 4 + n
    except ValueError as e:
        raise SignatureError(f"{shown}: not an OpenSSH signature ({e}): sign the library again") from None
    key = "SHA256:" + base64.b64encode(hashlib.sha256(fields[0]).digest()).decode().rstrip("=")
    return key, fields[1].decode(errors="replace")


def verify(library: Path | str, allowed_signers: Path | str, *, shown: Path | str | None = None) -> Signer:
    """The signer of `library` per `allowed_signers`, or SignatureError: unsigned, a key not allowed, another
    namespace, or a signature that does not match the bytes (the file changed after it was signed). Messages
    name `shown` (default: `library`)."""
    library, allowed = Path(library), Path(allowed_signers)
    name = shown if shown is not None else library
    if not allowed.is_file():
        raise UsageError(f"allowed-signers file {allowed} not found: give the file of keys allowed to sign libraries")
    sig = signature_path(library)
    if not sig.is_file():
        raise SignatureError(f"{name}: unsigned (no {sig.name} beside it): sign it with "
                             f"`vgpu-patch build --sign KEY`; refused, nothing was changed")
    key, namespace = _header(sig, name)
    if namespace != NAMESPACE:
        raise SignatureError(f"{name}: {sig.name} was made for namespace {namespace!r}, not {NAMESPACE!r}: "
                             f"sign with `vgpu-patch build --sign KEY`; refused, nothing was changed")
    exe = _ssh_keygen()
    found = subprocess.run([exe, "-Y", "find-principals", "-s", str(sig), "-f", str(allowed)],
                           capture_output=True, text=True, timeout=TIMEOUT_S)
    principals = [p for p in found.stdout.split() if p]
    if found.returncode != 0 or not principals:
        raise SignatureError(f"{name}: signed by key {key}, which {allowed} does not allow; "
                             f"refused, nothing was changed")
    with open(library, "rb") as data:
        p = subprocess.run([exe, "-Y", "verify", "-f", str(allowed), "-I", principals[0], "-n", NAMESPACE,
                            "-s", str(sig)], stdin=data, capture_output=True, text=True, timeout=TIMEOUT_S)
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise SignatureError(f"{name}: {sig.name} by {principals[0]} does not match the file (changed after "
                             f"signing? ssh-keygen: {why}); refused, nothing was changed")
    return Signer(principals[0], key)


def sign(library: Path | str, key: Path | str) -> Path:
    """Sign `library` with the OpenSSH private key `key` (or a public key whose private half is in
    ssh-agent); writes `<library>.sig` atomically and returns its path."""
    library, key = Path(library), Path(key)
    if not key.is_file():
        raise UsageError(f"signing key {key} not found: give an OpenSSH private key (or a public key held by "
                         "ssh-agent)")
    sig = signature_path(library)
    with open(library, "rb") as data:
        p = subprocess.run([_ssh_keygen(), "-Y", "sign", "-q", "-f", str(key), "-n", NAMESPACE], stdin=data,
                           capture_output=True, timeout=TIMEOUT_S)
    if p.returncode != 0 or not p.stdout.startswith(_ARMOR[0].encode()):
        why = (p.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise SignatureError(f"signing {library} with {key} failed (ssh-keygen: {why}): check the key and its "
                             "passphrase")
    fd, tmp = tempfile.mkstemp(prefix=f".{sig.name}.", suffix=".tmp", dir=sig.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(p.stdout)
        os.chmod(tmp, 0o644)
        os.replace(tmp, sig)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return sig
