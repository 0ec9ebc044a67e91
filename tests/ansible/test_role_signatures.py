"""The role's `vgpu_patch_allowed_signers`: checked on the controller before any upload; an unsigned,
foreign-signed or changed candidate stops the run with no node touched; a signed one goes live. Real
ansible-playbook, real sshd, real ssh-keygen keys."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fleet_helpers import Libs, Node, Run, run_playbook, write_inventory
from node_fixtures import sha
from signing_keys import Key, allowed_signers, make_key, sign


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Key, Key, Path]:
    d = tmp_path_factory.mktemp("keys")
    ours, theirs = make_key(d, "release@example.com"), make_key(d, "someone@elsewhere")
    return ours, theirs, allowed_signers(d / "allowed_signers", ours)


def test_only_a_library_signed_by_an_allowed_key_goes_live(nodes: list[Node], libs: Libs, tmp_path: Path,
                                                           keys) -> None:
    ours, theirs, allowed = keys
    node = nodes[0]
    shutil.copy(libs.vendor, node.libdir / "libvgpu.so")
    inv = write_inventory([node], tmp_path / "inv.ini")
    cand = tmp_path / "out" / "libvgpu.so"
    cand.parent.mkdir()
    shutil.copy(libs.v2, cand)
    extra = {"vgpu_patch_library": str(cand), "vgpu_patch_allowed_signers": str(allowed)}

    def refused(words: str) -> None:
        run = run_playbook("deploy.yml", inv, extra)
        assert run.rc != 0 and words in run.output and "refused, no node was touched" in run.output, run.output
        assert sha(node.libdir / "libvgpu.so") == sha(libs.vendor) and not node.state.exists()

    refused(f"{cand}: unsigned (no libvgpu.so.sig beside it)")
    sign(cand, theirs)
    refused(f"libvgpu.so.sig is not a signature by a key {allowed} allows")
    sign(cand, ours)
    with open(cand, "ab") as f:
        f.write(b"\0")
    refused("libvgpu.so.sig by release@example.com does not match the file")

    shutil.copy(libs.v2, cand)
    sign(cand, ours)
    run = run_playbook("deploy.yml", inv, extra)
    assert run.rc == 0, run.output
    assert f"{cand} signed by release@example.com with key SHA256:" in run.output
    assert sha(node.libdir / "libvgpu.so") == sha(libs.v2)
    # the node keeps the .sig and its signer, as the CLI's deploy does: `vgpu-patch status` names the signer
    kept = node.state / "signatures"
    assert (kept / f"{sha(cand)}.sig").read_text().strip() == cand.with_name("libvgpu.so.sig").read_text().strip()
    signer = json.loads((kept / f"{sha(cand)}.json").read_text())["signer"]
    assert signer["principal"] == "release@example.com" and signer["key"].startswith("SHA256:")
    history = [json.loads(line) for line in (node.state / "history.jsonl").read_text().splitlines()]
    assert history[-1]["signer"] == signer and history[-1]["tool"] == "ansible"


def test_the_live_bytes_are_the_verified_bytes_whatever_task_the_candidate_is_swapped_before(
        nodes: list[Node], libs: Libs, tmp_path: Path, keys) -> None:
    """A writer of the candidate's directory renames the signed build or an unsigned one into place before each
    task of the role's candidate and swap steps (tests/ansible/callback_plugins/read_swap.py): at one task only,
    and at every task but that one. The node gets the signed bytes, with their signature, or nothing."""
    ours, _, allowed = keys
    node = nodes[0]
    shutil.copy(libs.vendor, node.libdir / "libvgpu.so")
    inv = write_inventory([node], tmp_path / "inv.ini")
    cand = tmp_path / "out" / "libvgpu.so"
    cand.parent.mkdir()
    shutil.copy(libs.v2, cand)
    sig = sign(cand, ours)
    files = {"signed": str(libs.v2), "unsigned": str(libs.v1)}
    extra = {"vgpu_patch_library": str(cand), "vgpu_patch_allowed_signers": str(allowed)}

    def run(plan: list[str], rest: str | None) -> tuple[Run, list[list]]:
        log = tmp_path / "swaps.jsonl"
        log.unlink(missing_ok=True)
        if node.state.exists():
            shutil.rmtree(node.state)
        shutil.copy(libs.vendor, node.libdir / "libvgpu.so")
        cfg = {"path": str(cand), "files": files, "plan": plan, "rest": rest, "log": str(log)}
        run = run_playbook("deploy.yml", inv, extra, env_extra={
            "ANSIBLE_CALLBACK_PLUGINS": str(Path(__file__).parent / "callback_plugins"),
            "ANSIBLE_CALLBACKS_ENABLED": "read_swap", "VGPU_TEST_READ_SWAP": json.dumps(cfg)})
        return run, [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    first, tasks = run([], None)  # no swap: count the tasks that may read the candidate
    assert first.rc == 0 and sha(node.libdir / "libvgpu.so") == sha(libs.v2), first.output
    assert len(tasks) >= 3, tasks
    for k in range(len(tasks)):
        for good, bad in (("signed", "unsigned"), ("unsigned", "signed")):
            plan = [bad] * k + [good]
            result, seen = run(plan, bad)
            live = node.libdir / "libvgpu.so"
            what = f"{good} only before task {k} ({tasks[k][1]!r}); saw {[s[2] for s in seen]}"
            if result.rc != 0:
                assert sha(live) == sha(libs.vendor), f"{what}: refused, yet the node changed"
                continue
            assert sha(live) == sha(libs.v2), f"{what}: bytes other than the verified ones went live"
            kept = node.state / "signatures" / f"{sha(live)}.sig"
            assert kept.read_text().strip() == sig.read_text().strip(), what


def _manifest(lib: Path) -> dict:
    """What `vgpu-patch build` records, for a library the test built itself."""
    return {"file": "libvgpu.so", "sha256": sha(lib), "source_sha256": "5" * 64, "hooks_def_sha256": "6" * 64,
            "compiler": {"kind": "gcc", "name": "gcc", "version": "gcc (Debian 12.2.0-14) 12.2.0", "package": ""},
            "headers": {"sha256": "7" * 64, "cuda_version": 12080, "packages": {}}, "arch": "x86_64",
            "target": "x86_64-linux-gnu", "glibc_floor": None, "profile": "release", "defines": [],
            "flags": {"cflags": [], "ldflags": []}, "tool": "vgpu-patch 0.1.0"}


# the role, then its provenance fact on one line the test can read
_SHOW_FACT = """- name: Deploy, then show the provenance fact
  hosts: gpu
  gather_facts: false
  become: "{{ vgpu_patch_become }}"
  roles:
    - role: vgpu_patch
  tasks:
    - name: Show the fact
      ansible.builtin.debug:
        msg: "@@fact {{ vgpu_patch_provenance | to_json }}"
      run_once: true
"""


def test_the_builds_provenance_is_checked_shown_and_kept_as_a_fact(nodes: list[Node], libs: Libs, tmp_path: Path,
                                                                   keys) -> None:
    """The signed provenance beside the candidate (`build --sign`): checked with the same key set and from the same
    private copy as the library, by the CLI's own rule; what it states is shown and kept in
    `vgpu_patch_provenance`; a statement changed after signing, naming other bytes, signed by a key not allowed
    or not signed stops the run with the node untouched."""
    from vgpu_patch.release import provenance

    ours, theirs, allowed = keys
    node = nodes[0]
    live = node.libdir / "libvgpu.so"
    shutil.copy(libs.vendor, live)
    inv = write_inventory([node], tmp_path / "inv.ini")
    cand = tmp_path / "out" / "libvgpu.so"
    cand.parent.mkdir()
    shutil.copy(libs.v2, cand)
    sign(cand, ours)
    extra = {"vgpu_patch_library": str(cand), "vgpu_patch_allowed_signers": str(allowed)}
    statement = provenance.write(cand, _manifest(cand), "0123456789ab")

    def refused(words: str) -> str:
        run = run_playbook("deploy.yml", inv, extra)
        line = next((x for x in run.output.splitlines() if words in x), "")
        assert run.rc != 0 and line and "refused" in line, run.output
        assert sha(live) == sha(libs.vendor) and not node.state.exists()
        return line

    refused(f"{statement}: unsigned (no libvgpu.so.intoto.json.sig beside it)")
    sign(statement, theirs)
    assert "does not allow" in refused(f"{statement}: signed by key SHA256:")
    sign(statement, ours)
    statement.write_text(statement.read_text().replace("0123456789ab", "ba9876543210"))  # forged after signing
    refused(f"{statement}: libvgpu.so.intoto.json.sig by release@example.com does not match the file")
    provenance.write(cand, {**_manifest(cand), "sha256": "8" * 64})  # another build's statement, signed
    sign(statement, ours)
    assert "remove the stale statement" in refused(f"{statement}: states the build of sha256 888888888888, not of")

    provenance.write(cand, _manifest(cand), "0123456789ab")
    sign(statement, ours)
    play = tmp_path / "show.yml"
    play.write_text(_SHOW_FACT)
    run = run_playbook(str(play), inv, {**extra, "vgpu_patch_action": "deploy"})
    assert run.rc == 0 and sha(live) == sha(libs.v2), run.output
    out = " ".join(run.output.split())
    assert (f"{cand} signed by release@example.com with key SHA256:" in out
            and "; built by urn:vgpu-patch:builder:vgpu-patch:0.1.0 from c_src 555555555555 (commit 0123456789ab) "
                "with gcc (Debian 12.2.0-14) 12.2.0, as signed by release@example.com" in out), run.output
    fact = json.loads(out.split('"@@fact ')[1].rsplit('"', 1)[0].replace('\\"', '"'))
    assert fact == {"signer": "release@example.com", "source_sha256": "5" * 64, "commit": "0123456789ab",
                    "compiler": "gcc (Debian 12.2.0-14) 12.2.0", "builder": "urn:vgpu-patch:builder:vgpu-patch:0.1.0",
                    "text": "built by urn:vgpu-patch:builder:vgpu-patch:0.1.0 from c_src 555555555555 (commit "
                            "0123456789ab) with gcc (Debian 12.2.0-14) 12.2.0"}
