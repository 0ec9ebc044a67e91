"""Kubernetes-facing parts: which pod a process belongs to (cgroup), the API over plain HTTPS, restart plans,
the node agent's DaemonSet and Helm chart values (daemonset) and HAMi's device-plugin image carrying our
library (plugin_image)."""
from __future__ import annotations
