"""Where the shim's C sources live, for a checkout and for an installed wheel alike.

`vgpu_patch/c_src` is a link to the repository's `c_src/` in a checkout and a copied directory in an
installed wheel (package data), so both are found through importlib.resources, never by walking up
from this file to a repository that a wheel install does not have.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

# hooks.def is the one symbol table; it sits with the driver layer (the table and the resolver at
# the bottom of the shim) and, in trees from before that move, in interpose/. Either is accepted.
HOOKS_DEF_PLACES = ("driver/hooks.def", "interpose/hooks.def")


def c_src_dir() -> Path:
    """The packaged shim source tree (it may be missing from a broken install; callers check)."""
    # files() is a real directory for every unpacked install (wheels always are) and for a checkout
    return Path(str(resources.files("vgpu_patch") / "c_src")).resolve()


def find_hooks_def(src_dir: Path | None = None) -> Path:
    """src_dir's hooks.def (default: the packaged tree); the first of HOOKS_DEF_PLACES that exists,
    else the first place, so a caller's "not found" names where it belongs."""
    base = c_src_dir() if src_dir is None else Path(src_dir)
    for rel in HOOKS_DEF_PLACES:
        if (base / rel).is_file():
            return base / rel
    return base / HOOKS_DEF_PLACES[0]
