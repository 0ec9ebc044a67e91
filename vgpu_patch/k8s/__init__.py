"""Kubernetes-facing parts: which pod a process belongs to (cgroup), the API over plain HTTPS, restart plans."""
from __future__ import annotations
