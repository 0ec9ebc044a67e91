"""known_hosts files read as OpenSSH reads them: hashed names, patterns and negation, `[host]:port`,
`@revoked` keys (refused wherever they appear) and `@cert-authority` lines (host certificates are not
verified by paramiko: such lines are skipped, never fatal). A malformed line is skipped, not fatal.
"""
from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Entry:
    marker: str | None  # None, "@revoked" or "@cert-authority"
    patterns: tuple[str, ...]
    key_type: str
    key_blob: bytes
    where: str  # file:line

    def matches(self, name: str) -> bool:
        """OpenSSH's rule: some pattern matches and no negated pattern does."""
        hit = False
        for pat in self.patterns:
            if pat.startswith("|1|"):
                if _hashed_match(pat, name):
                    hit = True
                continue
            neg = pat.startswith("!")
            if _glob(pat.lstrip("!").lower()).fullmatch(name.lower()):
                if neg:
                    return False
                hit = True
        return hit


@functools.lru_cache(maxsize=4096)
def _glob(pattern: str) -> re.Pattern[str]:
    """OpenSSH's host patterns know only `*` and `?` (brackets are literal: `[host]:port`)."""
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern))


def _hashed_match(pattern: str, name: str) -> bool:
    try:
        _, _, salt64, hash64 = pattern.split("|", 3)
        salt, want = base64.b64decode(salt64), base64.b64decode(hash64)
    except (ValueError, binascii.Error):
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), want)


@dataclass
class KnownHosts:
    entries: list[Entry] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # file:line of lines that could not be read

    @classmethod
    def load(cls, paths: Iterable[str]) -> KnownHosts:
        kh = cls()
        for p in paths:
            path = os.path.expanduser(p)
            kh.files.append(path)
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                continue
            except OSError:
                kh.skipped.append(path)
                continue
            for n, raw in enumerate(data.splitlines(), 1):
                kh._add(raw.decode("utf-8", "replace").strip(), f"{path}:{n}")
        return kh

    def _add(self, line: str, where: str) -> None:
        if not line or line.startswith("#"):
            return
        words = line.split()
        marker = None
        if words[0].startswith("@"):
            marker, words = words[0].lower(), words[1:]
            if marker not in ("@revoked", "@cert-authority"):
                self.skipped.append(where)
                return
        if len(words) < 3:
            self.skipped.append(where)
            return
        try:
            blob = base64.b64decode(words[2], validate=True)
        except (ValueError, binascii.Error):
            self.skipped.append(where)
            return
        self.entries.append(Entry(marker, tuple(words[0].split(",")), words[1], blob, where))

    def revoked(self, key_blob: bytes) -> Entry | None:
        return next((e for e in self.entries if e.marker == "@revoked" and e.key_blob == key_blob), None)

    def for_host(self, name: str) -> list[Entry]:
        """Plain (unmarked) entries for `name`, revoked keys left out."""
        revoked = {e.key_blob for e in self.entries if e.marker == "@revoked"}
        return [e for e in self.entries if e.marker is None and e.key_blob not in revoked and e.matches(name)]

    def has_cert_authority_for(self, name: str) -> bool:
        return any(e.marker == "@cert-authority" and e.matches(name) for e in self.entries)


def lookup_name(host: str, port: int) -> str:
    """How known_hosts names a host: `host`, or `[host]:port` off port 22."""
    return host if port == 22 else f"[{host}]:{port}"
