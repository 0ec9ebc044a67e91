"""The node agent: installs the image's library into the host path and keeps it there.

It is the deploy protocol of docs/node-state.md run over the local transport (`vgpu_patch.deploy.swap`),
plus a watcher (inotify, else polling), a JSON status file and optional Prometheus metrics.
"""
from __future__ import annotations

from .image import ImageLibrary, verify_image
from .loop import Agent, AgentConfig

__all__ = ["Agent", "AgentConfig", "ImageLibrary", "verify_image"]
