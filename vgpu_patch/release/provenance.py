"""Build provenance beside the signature: `build --sign KEY` also writes `<library>.intoto.json`, an in-toto
Statement v1 whose predicate is a SLSA v1 provenance (the build's inputs: the source digest and commit when known,
the toolchain and its version, the headers, target, profile, defines and flags, and the whole build manifest), and
signs it with the same key, in the same `vgpu-patch` namespace (so the allowed-signers files that allow the library
allow its statement; neither can stand in for the other: a library must be an ELF file, a statement this JSON).
`deploy --allowed-signers` checks it, when it is beside the library, and says what it states about the file it
verified; `build --reproduce` takes it in place of the manifest."""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..report.errors import SignatureError, UsageError

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:vgpu-patch:build:v1"
SUFFIX = ".intoto.json"
MAX_BYTES = 1 << 20  # a statement is a few KiB; a larger file is not one


def statement_path(library: Path | str) -> Path:
    """Where a library's provenance statement lives: `<library>.intoto.json` beside it."""
    library = Path(library)
    return library.with_name(library.name + SUFFIX)


def statement(manifest: dict[str, Any], commit: str | None = None) -> dict[str, Any]:
    """The in-toto statement of a build, from its manifest (build.py's libvgpu.so.json)."""
    source: dict[str, Any] = {"name": "c_src", "digest": {"sha256": manifest["source_sha256"]},
                              "annotations": {"hooks_def_sha256": manifest["hooks_def_sha256"]}}
    if commit:
        source["annotations"]["commit"] = commit
    compiler = manifest["compiler"]
    headers = manifest["headers"]
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": manifest["file"], "digest": {"sha256": manifest["sha256"]}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {k: manifest[k] for k in ("arch", "target", "glibc_floor", "profile",
                                                                "defines")},
                "internalParameters": {"flags": manifest["flags"], "manifest": manifest},
                "resolvedDependencies": [
                    source,
                    {"name": str(compiler.get("name")), "annotations": {
                        "kind": compiler.get("kind"), "version": compiler.get("version"),
                        "package": compiler.get("package")}},
                    {"name": "cuda-headers", "digest": {"sha256": headers.get("sha256")},
                     "annotations": {"cuda_version": headers.get("cuda_version"),
                                     "packages": headers.get("packages")}},
                ],
            },
            "runDetails": {"builder": {"id": f"urn:vgpu-patch:builder:{manifest['tool'].replace(' ', ':')}"}},
        },
    }


def write(library: Path, manifest: dict[str, Any], commit: str | None = None) -> Path:
    """`<library>.intoto.json`, written atomically."""
    path = statement_path(library)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(statement(manifest, commit), indent=2, sort_keys=True) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def parse(data: bytes, where: Path | str) -> dict[str, Any]:
    """A statement's JSON, or SignatureError (one line) when it is not an in-toto statement of a SLSA provenance."""
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise SignatureError(f"{where}: not JSON ({e}); rebuild with `vgpu-patch build --sign KEY`") from None
    return check(doc, where)


def check(doc: Any, where: Path | str) -> dict[str, Any]:
    """`doc` when it is an in-toto statement of a SLSA v1 provenance, else SignatureError (one line)."""
    ok = (isinstance(doc, dict) and doc.get("_type") == STATEMENT_TYPE and doc.get("predicateType") == PREDICATE_TYPE
          and isinstance(doc.get("subject"), list) and isinstance(doc.get("predicate"), dict))
    if not ok:
        raise SignatureError(f"{where}: not an in-toto statement of a SLSA v1 provenance; rebuild with "
                             "`vgpu-patch build --sign KEY`")
    return doc


def manifest_of(doc: dict[str, Any], where: Path | str) -> dict[str, Any]:
    """The build manifest a statement carries (for `build --reproduce`), its sha256 the statement's subject's."""
    manifest = doc["predicate"].get("buildDefinition", {}).get("internalParameters", {}).get("manifest")
    if not isinstance(manifest, dict) or subject_sha256(doc) != manifest.get("sha256"):
        raise UsageError(f"{where}: the statement carries no build manifest of its subject: give the "
                         "libvgpu.so.intoto.json `vgpu-patch build --sign` wrote, or the libvgpu.so.json")
    return manifest


def subject_sha256(doc: dict[str, Any]) -> str | None:
    subjects = doc.get("subject") or []
    first = subjects[0] if len(subjects) == 1 and isinstance(subjects[0], dict) else {}
    digest = first.get("digest")
    value = digest.get("sha256") if isinstance(digest, dict) else None
    return value.lower() if isinstance(value, str) else None


@dataclass(frozen=True)
class Provenance:
    """What a verified statement says about the library it names."""

    signer: str  # the principal that signed the statement
    source_sha256: str
    commit: str | None
    compiler: str
    builder: str

    def to_dict(self) -> dict[str, Any]:
        return {"signer": self.signer, "source_sha256": self.source_sha256, "commit": self.commit,
                "compiler": self.compiler, "builder": self.builder}

    def __str__(self) -> str:
        commit = f" (commit {self.commit})" if self.commit else ""
        return f"built by {self.builder} from c_src {self.source_sha256[:12]}{commit} with {self.compiler}"


def summary(doc: dict[str, Any], signer: str) -> Provenance:
    build = doc["predicate"].get("buildDefinition") or {}
    deps = build.get("resolvedDependencies") or []
    source = next((d for d in deps if isinstance(d, dict) and d.get("name") == "c_src"), {})
    compiler = deps[1] if len(deps) > 1 and isinstance(deps[1], dict) else {}
    notes = compiler.get("annotations")
    notes = notes if isinstance(notes, dict) else {}
    builder = ((doc["predicate"].get("runDetails") or {}).get("builder") or {}).get("id", "?")
    return Provenance(signer, str((source.get("digest") or {}).get("sha256", "?")),
                      (source.get("annotations") or {}).get("commit"), str(notes.get("version") or "?"), str(builder))


def verified(library_copy: Path, sha256: str, allowed_signers: Path | str, *, shown: Path | str) -> Provenance | None:
    """The provenance beside a private library copy (deploy.candidate.snapshot copies `.intoto.json` and its `.sig`
    with it), checked: signed by an allowed key, and naming exactly `sha256`; None when there is none.
    SignatureError (one line) for a statement that is there but false, unsigned or signed by another key."""
    from . import signing

    path = statement_path(library_copy)
    if not path.is_file():
        return None
    where = statement_path(shown)
    doc = parse(path.read_bytes(), where)
    named = subject_sha256(doc)
    if named != sha256:
        raise SignatureError(f"{where}: states the build of sha256 {str(named)[:12]}, not of this file "
                             f"({sha256[:12]}); refused, nothing was changed: rebuild, or remove the stale statement")
    signer = signing.verify(path, allowed_signers, shown=where)
    return summary(doc, signer.principal)


def main(argv: list[str]) -> int:
    """`python3 -m vgpu_patch.release.provenance COPY SHA256 ALLOWED_SIGNERS SHOWN`: `verified` for the Ansible
    role, which reads the candidate, its statement and their signatures once into a private directory (COPY is
    the library's copy there, SHOWN the file the operator named). Prints what the statement says as JSON
    (`null`: there is none) and exits 0, or prints `@@err <one line>` and exits 1."""
    from ..report.errors import VgpuPatchError

    if len(argv) != 4:
        print("@@err usage: python3 -m vgpu_patch.release.provenance COPY SHA256 ALLOWED_SIGNERS SHOWN")
        return 2
    copy, sha256, allowed, shown = argv
    try:
        prov = verified(Path(copy), sha256.lower(), allowed, shown=shown)
    except VgpuPatchError as e:
        print("@@err " + " ".join(str(e).split()))
        return 1
    print(json.dumps(prov and {**prov.to_dict(), "text": str(prov)}, sort_keys=True))
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
