"""Checks on the library the image carries, before anything on the host is touched."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..deploy.candidate import Candidate, inspect
from ..release import provenance
from ..release.signing import Signature, verified
from ..report.errors import ElfError, IntegrityError, UsageError

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class ImageLibrary:
    path: Path
    sha256: str
    version: str | None  # from the embedded `vgpu-patch-shim <version>`, None for a foreign build
    candidate: Candidate
    signature: Signature | None = None  # with --allowed-signers: who signed it, and the .sig the node keeps
    provenance: provenance.Provenance | None = None  # with --allowed-signers: what its signed statement says


def default_manifest(library: Path) -> Path:
    """`vgpu-patch build` writes `<library>.json` next to the library."""
    return library.with_name(library.name + ".json")


def expected_sha256(library: Path, sha256: str | None, manifest: Path | None) -> tuple[str, str]:
    """The sha256 the image's library must have, and where that value came from."""
    if sha256:
        want = sha256.strip().lower()
        if not _HEX64.match(want):
            raise UsageError(f"--sha256 {sha256!r} is not 64 hex digits; give the sha256 from the build manifest")
        return want, "--sha256"
    path = manifest or default_manifest(library)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise IntegrityError(
            f"{library}: no expected sha256 (no --sha256 and no manifest {path}); "
            "ship the build's manifest in the image"
        ) from None
    except (OSError, ValueError) as e:
        raise IntegrityError(f"{path}: unreadable manifest ({e}); rebuild the image with the build's manifest") from e
    want = str(doc.get("sha256", "") if isinstance(doc, dict) else "").lower()
    if not _HEX64.match(want):
        raise IntegrityError(f"{path}: manifest has no valid \"sha256\"; rebuild the image with the build's manifest")
    return want, str(path)


def verify_image(library: Path | str, *, sha256: str | None = None, manifest: Path | str | None = None,
                 allowed_signers: Path | str | None = None) -> ImageLibrary:
    """Refuse image content that is not what was built: a sha256 mismatch, a file that is not a shared object,
    or (with allowed_signers) a library without a valid signature by an allowed key beside it."""
    library = Path(library)
    want, source = expected_sha256(library, sha256, Path(manifest) if manifest else None)
    try:
        cand = inspect(library)
    except ElfError as e:
        raise ElfError(f"image library refused: {e}") from e
    if cand.sha256 != want:
        raise IntegrityError(
            f"image library {library} has sha256 {cand.sha256}, but {source} expects {want}: "
            "the image is damaged or mismatched; rebuild it, nothing on the host was touched"
        )
    # the snapshot's copy of the library and its .sig: what was hashed is what is verified and installed
    signature = verified(cand.path, allowed_signers, shown=library) if allowed_signers else None
    # and of the build's provenance statement beside it, when the image carries one (`build --sign`)
    prov = provenance.verified(cand.path, cand.sha256, allowed_signers, shown=library) if allowed_signers else None
    return ImageLibrary(library, cand.sha256, cand.ours_version, cand, signature, prov)
