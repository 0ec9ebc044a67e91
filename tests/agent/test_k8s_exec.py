"""kubeconfig users with an `exec` credential plugin (client-go's ExecCredential protocol, v1 and v1beta1), run
against the fake API server with a fake plugin: a real program that logs what it was given and prints a
credential, as `aws eks get-token` or `kubelogin` would."""
from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fake_kube import FakeKube

from vgpu_patch.commands.restart_plan import cli as restart_plan
from vgpu_patch.k8s import api
from vgpu_patch.k8s.exec_credential import ExecCredentialError
from vgpu_patch.report.errors import UsageError

PLUGIN = '''#!{python}
"""A fake credential plugin: logs its argv, env and request; answers from the files beside it."""
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "calls.jsonl"), "a") as log:
    log.write(json.dumps({{"argv": sys.argv[1:], "info": json.loads(os.environ["KUBERNETES_EXEC_INFO"]),
                          "env": os.environ.get("PLUGIN_REGION")}}) + "\\n")
tokens = os.path.join(here, "tokens")
lines = open(tokens).read().split()
token = lines.pop(0) if len(lines) > 1 else (lines[0] if lines else "")
open(tokens, "w").write(" ".join(lines))
if token == "FAIL":
    sys.stderr.write("error: you are not logged in\\nrun: cloud login\\n")
    sys.exit(3)
answer = json.load(open(os.path.join(here, "answer.json")))
if "clientCertificateData" not in answer["status"]:
    answer["status"].setdefault("token", token)
print(json.dumps(answer))
'''


def make_plugin(where: Path, tokens: list[str], api_version: str = "client.authentication.k8s.io/v1",
                **status: Any) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    plugin = where / "fake-get-token"
    plugin.write_text(PLUGIN.format(python=sys.executable))
    plugin.chmod(0o755)
    (where / "tokens").write_text(" ".join(tokens))
    (where / "answer.json").write_text(json.dumps({"apiVersion": api_version, "kind": "ExecCredential",
                                                   "status": status}))
    return plugin


def calls(where: Path) -> list[dict]:
    log = where / "calls.jsonl"
    return [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []


def kubeconfig(path: Path, server: str, exec_spec: dict, **cluster: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "eks-admin", "user": {"exec": exec_spec}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "eks-admin"}}]}))
    return path


@pytest.mark.parametrize("version", ["client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"])
def test_the_plugins_token_authenticates_and_is_kept(version: str, tmp_path: Path) -> None:
    plugin = make_plugin(tmp_path / "bin", ["kc-token"], version)
    spec = {"apiVersion": version, "command": str(plugin), "args": ["token", "--cluster", "prod"],
            "env": [{"name": "PLUGIN_REGION", "value": "eu-west-1"}], "interactiveMode": "Never",
            "provideClusterInfo": True}
    with FakeKube(token="kc-token") as kube:
        kube.add_node("n1")
        client = api.from_kubeconfig(kubeconfig(tmp_path / "config", kube.url, spec,
                                                extensions=[{"name": "client.authentication.k8s.io/exec",
                                                             "extension": {"audience": "prod"}}]))
        assert client.list_nodes()[0]["metadata"]["name"] == "n1"
        assert client.get_node("n1")["metadata"]["name"] == "n1"
    (call,) = calls(tmp_path / "bin")  # two requests, one run: the credential has no expiry
    assert call["argv"] == ["token", "--cluster", "prod"] and call["env"] == "eu-west-1"
    assert call["info"] == {"apiVersion": version, "kind": "ExecCredential",
                            "spec": {"interactive": False, "cluster": {"server": kube.url,
                                                                       "config": {"audience": "prod"}}}}


def test_an_expired_token_is_asked_for_again_and_a_401_renews_it_once(tmp_path: Path) -> None:
    soon = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=5)).strftime(
        "%Y-%m-%dT%H:%M:%SZ")
    plugin = make_plugin(tmp_path / "bin", ["old-token", "kc-token", "kc-token"], expirationTimestamp=soon)
    spec = {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin), "interactiveMode": "Never"}
    with FakeKube(token="kc-token") as kube:
        kube.add_node("n1")
        client = api.from_kubeconfig(kubeconfig(tmp_path / "config", kube.url, spec))
        # expires within 10 s: asked for on each request; the first answer is refused (401), then renewed
        assert client.list_nodes()[0]["metadata"]["name"] == "n1"
        auths = [r.headers.get("Authorization") for r in kube.calls()]
        assert auths == ["Bearer old-token", "Bearer kc-token"]
        assert len(calls(tmp_path / "bin")) == 2
        (tmp_path / "bin" / "tokens").write_text("wrong-token")
        with pytest.raises(api.ApiError, match="HTTP 401"):  # renewed once, refused again: the server's answer
            client.list_nodes()
    assert len(calls(tmp_path / "bin")) == 4


def test_a_relative_command_is_found_beside_the_kubeconfig(tmp_path: Path) -> None:
    make_plugin(tmp_path / "kube" / "bin", ["kc-token"], "client.authentication.k8s.io/v1beta1")
    spec = {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "./bin/fake-get-token"}
    with FakeKube(token="kc-token") as kube:
        kube.add_node("n1")
        cfg = kubeconfig(tmp_path / "kube" / "config", kube.url, spec)
        assert api.from_kubeconfig(cfg).list_nodes()[0]["metadata"]["name"] == "n1"


def test_restart_plan_reads_a_kubeconfig_with_an_exec_user(tmp_path: Path) -> None:
    plugin = make_plugin(tmp_path / "bin", ["kc-token"])
    spec = {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin), "interactiveMode": "Never"}
    with FakeKube(token="kc-token") as kube:
        kube.add_node("gpu-node-1")
        cfg = kubeconfig(tmp_path / "config", kube.url, spec)
        res = CliRunner().invoke(restart_plan, ["--kubeconfig", str(cfg), "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["pods"] == []
        assert kube.calls() and all(r.headers.get("Authorization") == "Bearer kc-token" for r in kube.calls())
    assert len(calls(tmp_path / "bin")) == 1


@pytest.mark.parametrize(("case", "words"), [
    ("fails", "exec plugin {plugin} exited 3: run: cloud login; run it by hand (log in again?), then retry"),
    ("missing", "exec plugin {missing} not found (install the fake cloud CLI: apt install fake-cli); install "
                "it, or fix the kubeconfig's exec.command"),
    ("other-version", "exec plugin {plugin} answered in 'client.authentication.k8s.io/v1beta1', but the "
                      "kubeconfig asks for 'client.authentication.k8s.io/v1'; make exec.apiVersion the plugin's"),
    ("no-credential", "exec plugin {plugin} gave neither a token nor a client certificate and key; check the "
                      "plugin"),
    ("interactive", "exec plugin {plugin} wants a terminal (interactiveMode Always), and none is offered; log in "
                    "with kubectl once, or run kubectl proxy and pass --api-server http://127.0.0.1:8001"),
])
def test_a_plugin_that_gives_no_credential_is_one_line(case: str, words: str, tmp_path: Path) -> None:
    answer_version = "client.authentication.k8s.io/v1beta1" if case == "other-version" else \
        "client.authentication.k8s.io/v1"
    plugin = make_plugin(tmp_path / "bin", ["FAIL" if case == "fails" else ("" if case == "no-credential" else "t")],
                         answer_version)
    if case == "no-credential":
        (tmp_path / "bin" / "answer.json").write_text(json.dumps({
            "apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": {"token": ""}}))
        (tmp_path / "bin" / "tokens").write_text("")
    missing = tmp_path / "nowhere" / "fake-cli"
    spec = {"apiVersion": "client.authentication.k8s.io/v1", "command": str(missing if case == "missing" else plugin),
            "interactiveMode": "Always" if case == "interactive" else "Never",
            "installHint": "install the fake cloud CLI:\n  apt install fake-cli\n"}
    with FakeKube(token="kc-token") as kube:
        client = api.from_kubeconfig(kubeconfig(tmp_path / "config", kube.url, spec))
        with pytest.raises(ExecCredentialError) as e:
            client.list_nodes()
        assert not kube.calls()  # nothing was sent without a credential
    assert str(e.value) == "kubeconfig user 'eks-admin': " + words.format(plugin=plugin, missing=missing)


@pytest.mark.parametrize(("spec", "words"), [
    ({"apiVersion": "client.authentication.k8s.io/v1alpha1", "command": "x"}, "apiVersion"),
    ({"apiVersion": "client.authentication.k8s.io/v1"}, "has no command"),
    ({"apiVersion": "client.authentication.k8s.io/v1", "command": "x", "interactiveMode": "Sometimes"},
     "interactiveMode 'Sometimes'"),
])
def test_a_malformed_exec_section_is_a_usage_error(spec: dict, words: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=words):
        api.from_kubeconfig(kubeconfig(tmp_path / "config", "http://127.0.0.1:9", spec))


def test_legacy_auth_provider_is_refused_with_the_way_out(tmp_path: Path) -> None:
    cfg = tmp_path / "config"
    cfg.write_text(json.dumps({
        "current-context": "g", "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "gke", "user": {"auth-provider": {"name": "gcp"}}}],
        "contexts": [{"name": "g", "context": {"cluster": "k", "user": "gke"}}]}))
    with pytest.raises(UsageError, match=r"legacy auth-provider 'gcp'.*gke-gcloud-auth-plugin.*kubectl proxy"):
        api.from_kubeconfig(cfg)


def test_a_client_certificate_from_the_plugin_is_used_for_tls(tmp_path: Path) -> None:
    """clientCertificateData/clientKeyData (PEM) go into 0600 files the TLS context loads."""
    if not shutil.which("openssl"):
        pytest.skip("no openssl to make a certificate")
    key, crt = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(crt), "-days", "1", "-subj", "/CN=eks-admin"], check=True, capture_output=True)
    plugin = make_plugin(tmp_path / "bin", ["unused"], clientCertificateData=crt.read_text(),
                         clientKeyData=key.read_text())
    (tmp_path / "bin" / "answer.json").write_text(json.dumps({
        "apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
        "status": {"clientCertificateData": crt.read_text(), "clientKeyData": key.read_text()}}))
    spec = {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin), "interactiveMode": "Never"}
    client = api.from_kubeconfig(kubeconfig(tmp_path / "config", "https://127.0.0.1:9", spec))
    assert client._token() is None and client._context() is not None  # load_cert_chain took the pair
    assert client.exec_plugin is not None
    cred = client.exec_plugin.credential()
    assert cred.cert_file and Path(cred.cert_file).read_text() == crt.read_text()
    assert os.stat(cred.key_file or "").st_mode & 0o777 == 0o600
