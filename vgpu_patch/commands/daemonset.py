"""`vgpu-patch daemonset`: render the node agent's DaemonSet manifest."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from ..report import verbosity
from .options import emit_json, json_option, verbose_option

EPILOG = """\b
Examples:
  vgpu-patch daemonset --image registry.example.com/vgpu-patch-agent:0.1.0 -o vgpu-patch-agent.yaml
  vgpu-patch daemonset --node-selector nvidia.com/gpu.present=true --namespace gpu-ops \\
      --sha256 "$(jq -r .sha256 out/libvgpu.so.json)" -o - | kubectl apply -f -
  # service account + RBAC (node annotations, `vgpu-patch restart-plan`), a private registry, OpenShift
  vgpu-patch daemonset --rbac --image-pull-secret regcred --toleration '*' --selinux type=spc_t
  # only libraries signed by a key in the ConfigMap (kubectl create configmap vgpu-patch-signers \
  #   --from-file=allowed_signers) go live (docs/signing.md)
  vgpu-patch daemonset --allowed-signers-configmap vgpu-patch-signers
  # the Helm chart's generated files (values.yaml, values.schema.json, Chart.yaml) from the same options
  vgpu-patch daemonset --write-chart charts/vgpu-patch-agent

\b
Exit codes: 0 written; 2 usage error (bad label, name, path, image reference or quantity).
"""


@click.command("daemonset", epilog=EPILOG)
@verbose_option
@click.option("--image", default=None, metavar="[REGISTRY/]REPOSITORY[:TAG|@sha256:DIGEST]",
              help="Agent image; the chart's image.registry, image.repository and image.tag "
                   "[default: vgpu-patch-agent:<version>, which no registry has: build and push it with "
                   "deploy/build-multiarch.sh].")
@click.option("--image-pull-policy", type=click.Choice(["IfNotPresent", "Always", "Never"]), default="IfNotPresent",
              show_default=True, help="The container's imagePullPolicy (the chart's image.pullPolicy).")
@click.option("--namespace", default="kube-system", show_default=True, help="Namespace of the DaemonSet.")
@click.option("--name", default="vgpu-patch-agent", show_default=True, help="Name of the DaemonSet.")
@click.option("--node-selector", "node_selector", multiple=True, metavar="KEY=VALUE",
              help="Run only on nodes with this label (repeatable) [default: gpu=on, HAMi's GPU node label].")
@click.option("--host-dir", default="/usr/local/vgpu", show_default=True,
              help="The host's library directory: under /usr/local, /opt or /var/lib, with no '.' or '..' parts "
                   "(the chart's hostDir takes the same).")
@click.option("--sha256", metavar="HEX", help="Pin the library's sha256 (else the image's manifest is used).")
@click.option("--interval", type=click.FloatRange(min=0.5), default=10.0, show_default=True,
              help="Agent re-check interval in seconds.")
@click.option("--metrics-port", type=click.IntRange(min=0, max=65535), default=9400, show_default=True,
              help="Prometheus metrics port; 0 turns metrics off.")
@click.option("--max-unavailable", default="1", show_default=True,
              help="Rolling update: nodes updated at once (N or N%).")
@click.option("--cpu-limit", default="200m", show_default=True, help="Container CPU limit (a Kubernetes quantity).")
@click.option("--memory-limit", default="128Mi", show_default=True,
              help="Container memory limit (a Kubernetes quantity).")
@click.option("--priority-class", default="auto", show_default=True,
              help="Pod priority class; auto = system-node-critical in kube-system (the only namespace that admits "
                   "system-* classes by default) and none elsewhere; empty for none.")
@click.option("--toleration", "tolerations", multiple=True, metavar="KEY[=VALUE][:EFFECT]",
              help="Tolerate this taint too (repeatable; '*' tolerates every taint); nvidia.com/gpu is tolerated "
                   "already.")
@click.option("--image-pull-secret", "pull_secrets", multiple=True, metavar="NAME",
              help="imagePullSecrets entry for a private registry (repeatable).")
@click.option("--selinux", "selinux", multiple=True, metavar="KEY=VALUE",
              help="Container seLinuxOptions: type=, level=, user=, role= (repeatable), e.g. type=spc_t.")
@click.option("--host-pid/--no-host-pid", default=True, show_default=True,
              help="Share the host's PID namespace (with CAP_SYS_PTRACE) to name the pods still on an old library.")
@click.option("--rbac/--no-rbac", default=False, show_default=True,
              help="Add a ServiceAccount and a ClusterRole (nodes patch, pods list, events create) so the agent "
                   "annotates its node for `vgpu-patch restart-plan` and posts an Event when it refuses.")
@click.option("--allowed-signers-configmap", "signers_configmap", default=None, metavar="NAME",
              help="A ConfigMap in the namespace holding an OpenSSH allowed-signers file: mounted read-only, and the "
                   "agent installs the image's library only with a valid libvgpu.so.sig by one of its keys "
                   "(docs/signing.md) [default: no signature check].")
@click.option("--allowed-signers-key", "signers_key", default="allowed_signers", show_default=True, metavar="KEY",
              help="The ConfigMap's key that holds the file.")
@click.option("--write-chart", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="Write the Helm chart's generated files (Chart.yaml, values.yaml, values.schema.json) into DIR "
                   "and exit.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path), default=Path("-"),
              show_default=True, help="Write the manifest here ('-' = stdout).")
@json_option
def cli(image: str | None, image_pull_policy: str, namespace: str, name: str,
        node_selector: tuple[str, ...], host_dir: str, sha256: str | None,
        interval: float, metrics_port: int, max_unavailable: str, cpu_limit: str, memory_limit: str,
        priority_class: str, tolerations: tuple[str, ...], pull_secrets: tuple[str, ...], selinux: tuple[str, ...],
        host_pid: bool, rbac: bool, signers_configmap: str | None, signers_key: str, write_chart: Path | None,
        output: Path, as_json: bool) -> None:
    """Render a DaemonSet that runs `vgpu-patch agent` on every GPU node.

    hostPath mount of the library directory only, hostPID (to name the pods still on an old library),
    node selector for GPU nodes, RollingUpdate with maxUnavailable, resource requests and limits, probes
    that start no interpreter (httpGet /readyz and /livez on the metrics port, else `test -e` of the ready
    marker), and a narrow security context (root without privilege, capabilities dropped but CHOWN and
    SYS_PTRACE, read-only root filesystem). The Helm chart charts/vgpu-patch-agent renders the same objects.
    With --json the manifests are printed as one JSON document (a v1 List when there are several).
    """
    from ..k8s.daemonset import (
        AllowedSigners,
        DaemonSetOptions,
        ImageRef,
        chart_files,
        parse_node_selector,
        parse_selinux,
        parse_toleration,
        render_all,
        render_yaml,
    )
    from ..report.errors import UsageError

    if write_chart is not None:
        write_chart.mkdir(parents=True, exist_ok=True)
        for rel, text in chart_files().items():
            (write_chart / rel).write_text(text)
            click.echo(f"wrote {write_chart / rel}", err=True)
        return

    if sha256 and not re.match(r"^[0-9a-fA-F]{64}$", sha256):
        raise UsageError(f"--sha256 {sha256!r}: expected 64 hex digits from the build manifest")
    opts = DaemonSetOptions(
        namespace=namespace, name=name, host_dir=host_dir, sha256=sha256.lower() if sha256 else None,
        interval=interval, metrics_port=metrics_port or None, max_unavailable=max_unavailable,
        cpu_limit=cpu_limit, memory_limit=memory_limit, priority_class=priority_class or None,
        tolerations=[parse_toleration(t) for t in tolerations], image_pull_secrets=list(pull_secrets),
        selinux=parse_selinux(selinux), host_pid=host_pid, rbac=rbac,
        allowed_signers=AllowedSigners(signers_configmap or None, signers_key),
    )
    opts.image = ImageRef.parse(image, image_pull_policy) if image else ImageRef(pull_policy=image_pull_policy)
    if node_selector:
        opts.node_selector = parse_node_selector(node_selector)
    verbosity.log.debug("daemonset: image %s, namespace %s, rbac %s, node selector %s", opts.image.reference(),
                        namespace, "yes" if rbac else "no", node_selector or "-")
    if as_json:
        docs = render_all(opts)
        doc = docs[0] if len(docs) == 1 else {"apiVersion": "v1", "kind": "List", "items": docs}
        if str(output) == "-":
            emit_json(doc)
            return
        import json

        output.write_text(json.dumps(doc, indent=2) + "\n")
    else:
        text = render_yaml(opts)
        if str(output) == "-":
            sys.stdout.write(text)
            return
        output.write_text(text)
    click.echo(f"wrote {output}", err=True)
