"""Files for ssl, which takes certificates and keys only by path: a 0600 temporary file per PEM, removed when
the process exits (inline kubeconfig data, an exec plugin's client certificate)."""
from __future__ import annotations

import atexit
import os
import tempfile


def _remove(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)


def private_file(data: bytes, prefix: str, suffix: str) -> str:
    """data in a new 0600 temporary file (mkstemp's mode), removed at exit; its path"""
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=suffix)
    atexit.register(_remove, path)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path
