"""The docs a newcomer meets stay honest: every command documented, every relative link alive,
and the README opening with the two fresh-machine commands."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

from vgpu_patch.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CLI_REF = ROOT / "docs" / "cli-reference.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
VENV_LINE = "python3 -m venv .venv && . .venv/bin/activate"
FRESH_MACHINE = [VENV_LINE, "pip install -e '.[build]' && vgpu-patch demo", "bash .ci/run"]

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
_LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(text: str) -> str:
    """Markdown without fenced code blocks and inline code (links there are examples, not links)."""
    return re.sub(r"`[^`\n]*`", "", _FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    heads = re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", _FENCE.sub("", path.read_text()), re.M)
    return {_slug(h) for h in heads}


def _command_mentioned(text: str, name: str) -> bool:
    return re.search(rf"vgpu-patch {re.escape(name)}\b", text) is not None


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_in_cli_reference(name: str) -> None:
    text = CLI_REF.read_text()
    assert f"## vgpu-patch {name}\n" in text, (
        f"docs/cli-reference.md has no section for `vgpu-patch {name}`: run python3 docs/gen_cli_reference.py"
    )


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_in_readme(name: str) -> None:
    assert _command_mentioned(README.read_text(), name), f"README.md never mentions `vgpu-patch {name}`"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in _LINK.findall(_prose(doc.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (doc.parent / unquote(path_part)).resolve() if path_part else doc
        if not dest.exists():
            broken.append(f"{target} (no {dest.relative_to(ROOT) if ROOT in dest.parents else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    assert not broken, f"{doc.relative_to(ROOT)}: broken links: {', '.join(broken)}"


def test_readme_opens_with_the_fresh_machine_commands() -> None:
    """Title, the three sentences, then a code block holding exactly the two commands."""
    text = README.read_text()
    lines = text.splitlines()
    assert lines[0].startswith("# "), "README.md must start with its title"
    body = "\n".join(lines[1:]).lstrip("\n")
    intro, sep, rest = body.partition("\n\n")
    assert sep and not intro.startswith(("```", "#")), "README.md: the intro paragraph must follow the title"
    sentences = re.findall(r"[^.!?]+[.!?](?=\s|$)", " ".join(intro.split()))
    assert len(sentences) == 3, f"README.md: the intro must be three sentences, found {len(sentences)}"
    assert _fresh_machine_commands(rest) == FRESH_MACHINE


def _fresh_machine_commands(after_intro: str) -> list[str]:
    m = re.match(r"\s*```[a-z]*\n(.*?)\n```", after_intro, re.S)
    assert m, "README.md: the block of fresh-machine commands must come right after the intro"
    commands = [ln.split("#", 1)[0].strip() for ln in m.group(1).splitlines()]
    return [c for c in commands if c]


def test_readme_first_line_gives_a_venv_where_pip_installs(tmp_path: Path) -> None:
    """The block's first line, run by sh as written in a fresh directory: the shell is then in a new virtual
    environment, so the next line's `pip install` works even where python3 is externally managed (PEP 668).
    The install itself needs the package index: CI's run of `.ci/run` in such a venv covers it."""
    text = README.read_text()
    first = _fresh_machine_commands(text[text.index("```"):])[0]
    assert first == VENV_LINE
    probe = "python3 -c 'import sys; print(sys.prefix)'; command -v pip; echo \"VIRTUAL_ENV=$VIRTUAL_ENV\""
    p = subprocess.run(["sh", "-c", f"{first} && {probe}"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    venv = (tmp_path / ".venv").resolve()
    prefix, pip, virtual_env = p.stdout.split("\n")[:3]
    assert Path(prefix).resolve() == venv and Path(pip).resolve().parent == venv / "bin", p.stdout
    assert Path(virtual_env.removeprefix("VIRTUAL_ENV=")).resolve() == venv


def test_cli_reference_generator_covers_every_command() -> None:
    """The generator itself renders a section per command (the checked-in file may lag; this may not)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_cli_reference", ROOT / "docs" / "gen_cli_reference.py")
    assert spec and spec.loader
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    text = gen.render()
    for name in COMMANDS:
        assert f"## vgpu-patch {name}\n" in text
    assert "## Exit codes" in text


def _invocations(text: str) -> list[str]:
    """Every `vgpu-patch ...` command written in code (fenced blocks and inline), one per string."""
    code = [m.group(0) for m in _FENCE.finditer(text)] + re.findall(r"`([^`\n]+)`", _FENCE.sub("", text))
    joined = "\n".join(code).replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = re.sub(r"\$\([^)]*\)", "VALUE", line)  # command substitutions are values, not options
        for m in re.finditer(r"(?:^|[\s$(])vgpu-patch((?:\s+[^\s|;&#)`]+)*)", line):
            out.append(m.group(1).strip())
    return out


def _options_of(words: list[str]):  # type: ignore[no-untyped-def]
    """(command path, its option names) for the words after `vgpu-patch`, or None when not a command."""
    import click

    from vgpu_patch.cli import cli

    cmd: click.Command = cli
    path = ["vgpu-patch"]
    ctx = click.Context(cli)
    for w in words:
        if w.startswith("-") or not isinstance(cmd, click.Group):
            break
        sub = cmd.get_command(ctx, w)
        if sub is None:
            return None
        cmd, path = sub, path + [w]
    names = {"--help", "-h"}
    for p in cmd.params:
        names.update(getattr(p, "opts", []))
        names.update(getattr(p, "secondary_opts", []))
    return " ".join(path), names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_options_exist(doc: Path) -> None:
    """Every option written after a `vgpu-patch <command>` in the docs is one that command has."""
    wrong = []
    for inv in _invocations(doc.read_text()):
        words = [w.strip("[]") for w in inv.split()]
        found = _options_of(words)
        if found is None:
            continue  # prose such as "vgpu-patch's", or a placeholder
        path, names = found
        for w in words:
            opt = w.split("=", 1)[0]
            if re.match(r"^--?[A-Za-z]", opt) and opt not in names:
                wrong.append(f"{path} {opt}")
    assert not wrong, f"{doc.relative_to(ROOT)} documents options that do not exist: {', '.join(sorted(set(wrong)))}"


def test_cli_reference_is_current() -> None:
    """docs/cli-reference.md is what the generator makes from today's --help: regenerate it when help changes."""
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_cli_reference.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, f"docs/cli-reference.md is stale: run python3 docs/gen_cli_reference.py\n{proc.stderr}"


def test_readme_local_session_runs_as_shown(tmp_path: Path) -> None:
    """README's build, check and local deploy/status/rollback sessions, run in order as printed there, on the
    demo's node root (its vendor stand-in live): each exits as documented and prints what README shows first.
    The SSH sessions are run by tests/deploy (real sshd) and docs/first-node.md by tests/test_first_node.py."""
    import shlex

    demo = subprocess.run([sys.executable, "-m", "vgpu_patch.cli", "demo", "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=900)
    assert demo.returncode == 0, demo.stderr[-2000:]
    text = README.read_text()
    sessions = [m.group(0) for m in _FENCE.finditer(text) if m.group(0).startswith("```console")]
    ran = 0
    for block in sessions:
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("$ vgpu-patch "):
                continue
            words = shlex.split(line[2:].split("  #")[0])
            local = "--local" in words and "node" in words
            if not (local or words[1:3] in (["build", "-o"], ["check", "out/libvgpu.so"])):
                continue
            out = subprocess.run([sys.executable, "-m", "vgpu_patch.cli", *words[1:]], capture_output=True,
                                 text=True, cwd=tmp_path, timeout=900)
            want = 1 if "--dry-run" in words else 0
            assert out.returncode == want, f"{line}: exit {out.returncode}\n{out.stdout[-1500:]}{out.stderr[-1500:]}"
            shown = lines[i + 1]
            if shown != "..." and not shown.startswith(("building", "check ")):  # build's, check's: on stderr
                assert out.stdout.splitlines()[0].split("(")[0] == shown.split("(")[0], line
            ran += 1
    assert ran == 7  # build, check, deploy --dry-run, deploy, deploy again, status, rollback


def _fenced_commands(text: str) -> list[str]:
    """`vgpu-patch …` command lines of fenced blocks: `$ ` lines of console blocks, lines of sh blocks; not
    synopses (`[--opt]`, `...`)."""
    out = []
    for m in _FENCE.finditer(text):
        block = m.group(0).replace("\\\n", " ")
        console = block.startswith("```console")
        for line in block.splitlines()[1:]:
            line = line.strip()
            if console and not line.startswith("$ "):
                continue
            line = line.removeprefix("$ ")
            if line.startswith("vgpu-patch ") and " [" not in line and "..." not in line:
                line = re.sub(r"\$\([^)]*\)", "VALUE", line)
                out.append(re.split(r"\s+(?:#|\||>|&&|;)\s*", line)[0])
    return out


@pytest.mark.parametrize("doc", [d for d in DOCS if d.name != "cli-reference.md"], ids=lambda p: p.name)
def test_documented_commands_parse(doc: Path) -> None:
    """Every command line in a code block parses as written: arguments, option values, choices, ranges."""
    import shlex

    import click

    from vgpu_patch.cli import cli

    wrong = []
    for line in _fenced_commands(doc.read_text()):
        ctx = click.Context(cli)
        cmd: click.Command = cli
        rest = shlex.split(line)[1:]
        while rest and not rest[0].startswith("-") and isinstance(cmd, click.Group):
            sub = cmd.get_command(ctx, rest[0])
            if sub is None:
                break
            cmd, rest = sub, rest[1:]
        try:
            cmd.make_context(str(cmd.name), rest)
        except click.exceptions.Exit:
            pass
        except click.ClickException as e:
            wrong.append(f"{line}: {e.format_message()}")
    assert not wrong, "\n".join(wrong)


def test_one_way_to_give_the_ansible_role_its_sha256(tmp_path: Path) -> None:
    """Every doc computes vgpu_patch_library_sha256 the same way, and that way, run by sh from ansible/ as
    shown, prints the sha256 the build recorded in out/libvgpu.so.json."""
    pages = [*DOCS, ROOT / "ansible" / "README.md", ROOT / "charts" / "vgpu-patch-agent" / "README.md"]
    ways = {m.group(1) for page in pages for m in re.finditer(r'vgpu_patch_library_sha256="(\$\(.*\))"',
                                                              page.read_text())}
    assert len(ways) == 1, f"the docs compute vgpu_patch_library_sha256 in {len(ways)} ways: {sorted(ways)}"
    (tmp_path / "ansible").mkdir()
    (tmp_path / "out").mkdir()
    want = "ab" * 32
    (tmp_path / "out" / "libvgpu.so.json").write_text(json.dumps({"sha256": want, "source_sha256": "cd" * 32}))
    p = subprocess.run(["sh", "-c", f'echo "{ways.pop()}"'], cwd=tmp_path / "ansible", capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == want + "\n", p.stderr


def test_the_docs_say_where_ansible_playbook_comes_from() -> None:
    """ansible-playbook is ansible-core's, which the [inventory] extra installs: the pages that run it say so."""
    tomllib = pytest.importorskip("tomllib")

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("ansible-core") for dep in extras["inventory"])
    for page in (ROOT / "ansible" / "README.md", ROOT / "docs" / "fleet.md"):
        text = " ".join(page.read_text().split())
        assert re.search(r"`ansible-playbook` comes with .{0,40}`\[inventory\]`", text), page


def test_architecture_counts_are_hooks_defs() -> None:
    """docs/architecture.md's counts of wrapped, passed-through and stub names are hooks.def's own."""
    from vgpu_patch.shim_build.surface import parse_hooks

    kinds = [h.kind for h in parse_hooks()]
    variants = sum(line.startswith("VARIANT(") for line in
                   (ROOT / "c_src" / "driver" / "hooks.def").read_text().splitlines())
    text = (ROOT / "docs" / "architecture.md").read_text()
    want = (kinds.count("OWN"), kinds.count("PASS"), kinds.count("STUB"), variants)
    m = re.search(r"\((\d+) OWN, (\d+) PASS, (\d+) STUB; plus (\d+) VARIANT", text)
    assert m and tuple(map(int, m.groups())) == want, want
    box = re.search(r"(\d+) OWN wrappers and (\d+) VARIANT spellings", text)
    assert box and (int(box[1]), int(box[2])) == (want[0], want[3]), want
