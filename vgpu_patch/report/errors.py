"""Every error the tool raises on purpose, and the exit code each maps to.

Exit codes (the contract scripts rely on; also printed in `vgpu-patch --help`):
  0  success, nothing left to do
  1  the operation failed: a file that exists but is not what it should be, a node that failed
     (or `--dry-run` found changes pending)
  2  usage error, found before anything is read or touched: an unknown option, a malformed value,
     a file or directory named on the command line that does not exist
  3  a fleet run where some nodes succeeded and some failed
  4  `check` found a blocking incompatibility (see `vgpu-patch check --help` for its bitmask)
  5  `status`: a live file was replaced outside vgpu-patch (the device plugin's copy-back?)

Each message is one line naming what failed, where, and what to do next.
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PARTIAL = 3
EXIT_INCOMPATIBLE = 4
EXIT_REPLACED = 5


class VgpuPatchError(Exception):
    """Root of the tool's own errors; the CLI prints the message on one line and exits."""

    exit_code = EXIT_FAILED


class UsageError(VgpuPatchError, ValueError):
    """The user's input is malformed (a limit, a host spec, an option)."""

    exit_code = EXIT_USAGE


class LimitParseError(UsageError):
    """A memory or SM limit string does not follow `<number>[k|m|g|t][i][b]`."""


class BuildError(VgpuPatchError):
    """The shim could not be built (no compiler, no headers, compiler error)."""


class ElfError(VgpuPatchError):
    """A file is not a readable ELF shared object (truncated, not ELF, wrong class)."""


class GpuError(VgpuPatchError):
    """No usable CUDA driver or GPU here (no libcuda.so.1, cuInit failing), or a GPU program failed on it."""


class RegionError(VgpuPatchError):
    """A shared-region file is missing, truncated, or not HAMi layout 1.x."""


class DeployError(VgpuPatchError):
    """A deploy, status or rollback step failed on a node; the node was left on a whole file."""


class ConnectionFailure(DeployError, ConnectionError):
    """The node could not be reached or the connection broke."""


class HostKeyError(ConnectionFailure):
    """The node's host key is unknown or changed; nothing was sent to it."""


class AuthFailure(DeployError, PermissionError):
    """Authentication or sudo was refused on the node."""


class LockedError(DeployError):
    """Another deploy holds the node's lock."""


class IntegrityError(DeployError):
    """A sha256 did not match what was expected; the live file was not replaced."""


class SignatureError(IntegrityError):
    """A library's OpenSSH signature is missing, from a key not allowed, or does not match it; nothing changed."""


class StopRequested(DeployError):
    """A fleet run is stopping (its failure budget is spent): this node was left untouched."""


class FleetError(VgpuPatchError):
    """Some nodes of a fleet run failed; carries every node's result."""

    exit_code = EXIT_PARTIAL

    def __init__(self, message: str, results: dict | None = None) -> None:
        super().__init__(message)
        self.results = results or {}
