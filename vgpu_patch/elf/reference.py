"""The vendor library's exports as bundled in data/vendor-exports.txt: the reference surface `check` holds a
candidate to when no vendor file is given (and uses to sort a vendor file's names into entry points and leaked
internals)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources


@dataclass(frozen=True)
class ReferenceSurface:
    surface: frozenset[str]  # entry points applications reach through the preload
    internal: frozenset[str]  # helpers the vendor build leaks; a replacement must not export them


@lru_cache(maxsize=1)
def reference_surface() -> ReferenceSurface:
    """The vendor build's exports, from the bundled data/vendor-exports.txt."""
    text = resources.files("vgpu_patch").joinpath("data/vendor-exports.txt").read_text()
    sections: dict[str, set[str]] = {"surface": set(), "internal": set()}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            continue
        if current in sections:
            sections[current].add(line)
    return ReferenceSurface(frozenset(sections["surface"]), frozenset(sections["internal"]))
