"""A minimal renderer for the subset of Go text/template + Helm/sprig functions the chart uses.

Used only by the chart test when no `helm` binary is on PATH (none can be installed from the registries this
project reaches); with helm present the test renders with `helm template` instead. Supported: actions with
`{{-`/`-}}` trimming and comments; `if`/`else if`/`else`, `with`/`else`, `range`, `end`; `$var :=` and `=`;
pipelines with parentheses; `.Values…`, `.Release.Namespace`, `.Chart.AppVersion`, `.`, `$`; functions quote,
toString, toYaml, nindent, indent, trimSuffix, hasPrefix, printf (%s %d %v), default, eq, ne, and, or, not,
int, maxf, addf, mulf, fail. Truthiness and printing follow Go's rules for these types.
"""
from __future__ import annotations

import json
import re
from typing import Any

import yaml

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)
_TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<num>-?\d+(?:\.\d+)?)|(?P<lp>\()|(?P<rp>\))|(?P<pipe>\|)'
                    r"|(?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)|(?P<field>\.(?:[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*)?)"
                    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_]*))")


class TemplateFail(Exception):
    """The template called `fail`."""


def truthy(v: Any) -> bool:
    return not (v is None or v is False or (v == 0 and not isinstance(v, bool)) or v in ("", [], {}))


def gostr(v: Any) -> str:
    if v is None:
        return "<nil>"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return str(v)


def _to_yaml(v: Any) -> str:
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=True).rstrip("\n").removesuffix("\n...")


def _printf(fmt: str, *args: Any) -> str:
    it = iter(args)
    return re.sub(r"%[sdv%]", lambda m: "%" if m.group() == "%%" else gostr(next(it)), fmt)


def _fail(msg: str) -> str:
    raise TemplateFail(msg)


FUNCS: dict[str, Any] = {
    "quote": lambda v: json.dumps(gostr(v) if v is not None else ""),
    "toString": gostr, "toYaml": _to_yaml,
    "nindent": lambda n, s: "\n" + "\n".join(" " * int(n) + ln for ln in s.split("\n")),
    "indent": lambda n, s: "\n".join(" " * int(n) + ln for ln in s.split("\n")),
    "trimSuffix": lambda suf, s: s[: -len(suf)] if suf and s.endswith(suf) else s,
    "hasPrefix": lambda pre, s: str(s).startswith(pre),
    "printf": _printf, "default": lambda d, v=None: v if truthy(v) else d,
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
    "and": lambda *a: next((x for x in a if not truthy(x)), a[-1]),
    "or": lambda *a: next((x for x in a if truthy(x)), a[-1]),
    "not": lambda v: not truthy(v), "int": lambda v: int(float(v or 0)),
    "maxf": lambda *a: float(max(float(x) for x in a)), "addf": lambda *a: float(sum(float(x) for x in a)),
    "mulf": lambda a, b: float(a) * float(b), "fail": _fail,
}


def _tokens(src: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    src = src.strip()
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if not m or m.end() == pos:
            raise SyntaxError(f"cannot parse {src[pos:]!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
        while pos < len(src) and src[pos].isspace():
            pos += 1
    return out


class _Eval:
    def __init__(self, root: dict, scope: dict[str, Any]) -> None:
        self.root, self.vars = root, scope

    def lookup(self, base: Any, path: str) -> Any:
        for part in [p for p in path.split(".") if p]:
            base = base.get(part) if isinstance(base, dict) else None
        return base

    def pipeline(self, toks: list[tuple[str, str]], dot: Any) -> Any:
        cmds: list[list[tuple[str, str]]] = [[]]
        depth = 0
        for t in toks:
            if t[0] == "pipe" and depth == 0:
                cmds.append([])
                continue
            depth += t[0] == "lp"
            depth -= t[0] == "rp"
            cmds[-1].append(t)
        value: Any = _NOTHING
        for cmd in cmds:
            value = self.command(cmd, dot, value)
        return value

    def command(self, toks: list[tuple[str, str]], dot: Any, piped: Any) -> Any:
        args: list[Any] = []
        i = 0
        while i < len(toks):
            kind, text = toks[i]
            if kind == "lp":
                depth, j = 1, i + 1
                while depth:
                    depth += toks[j][0] == "lp"
                    depth -= toks[j][0] == "rp"
                    j += 1
                args.append(self.pipeline(toks[i + 1 : j - 1], dot))
                i = j
                continue
            args.append(self.atom(kind, text, dot))
            i += 1
        if piped is not _NOTHING:
            args.append(piped)
        head = args[0]
        if isinstance(head, _Func):
            return FUNCS[head.name](*args[1:])
        if len(args) != 1:
            raise SyntaxError(f"not a function: {toks}")
        return head

    def atom(self, kind: str, text: str, dot: Any) -> Any:
        if kind == "str":
            return json.loads(text)
        if kind == "num":
            return float(text) if "." in text else int(text)
        if kind == "field":
            return dot if text == "." else self.lookup(dot, text)
        if kind == "var":
            name, _, rest = text.partition(".")
            base = self.root if name == "$" else self.vars[name]
            return self.lookup(base, rest)
        if kind == "ident":
            if text in ("true", "false"):
                return text == "true"
            if text == "nil":
                return None
            if text not in FUNCS:
                raise SyntaxError(f"unknown function {text}")
            return _Func(text)
        raise SyntaxError(f"unexpected {text!r}")


class _Func:
    def __init__(self, name: str) -> None:
        self.name = name


_NOTHING = object()


def _parse(src: str) -> list:
    """Text and actions, trimmed, into a tree: ("text", s) | ("expr", src) | ("if"/"with"/"range", ...)."""
    items: list[tuple[str, str]] = []
    pos = 0
    for m in _ACTION.finditer(src):
        text = src[pos : m.start()]
        if m.group(1):
            text = text.rstrip()
        items.append(("text", text))
        items.append(("act", m.group(2).strip()))
        pos = m.end()
        if m.group(3):
            while pos < len(src) and src[pos].isspace():
                pos += 1
    items.append(("text", src[pos:]))
    # trimming of the following text was done by advancing pos; fix texts trimmed by a later `{{-`
    tree, stack = [], []
    cur: list = tree
    for kind, body in items:
        if kind == "text":
            cur.append(("text", body))
            continue
        if body.startswith("/*"):
            continue
        word = body.split(None, 1)[0] if body else ""
        if word in ("if", "with", "range"):
            node = [word, [(body[len(word):].strip(), [])]]
            cur.append(node)
            stack.append((cur, node))
            cur = node[1][-1][1]
        elif word == "else":
            _, node = stack[-1]
            rest = body[4:].strip()
            cond = rest[2:].strip() if rest.startswith("if") else None
            node[1].append((cond, []))
            cur = node[1][-1][1]
        elif word == "end":
            cur, _ = stack.pop()
        else:
            cur.append(("expr", body))
    return tree


def _run(tree: list, ev: _Eval, dot: Any, out: list[str]) -> None:
    for node in tree:
        if isinstance(node, tuple):
            kind, body = node
            if kind == "text":
                out.append(body)
                continue
            m = re.match(r"^(\$[A-Za-z0-9_]+)\s*(:?=)\s*(.*)$", body, re.S)
            if m:
                ev.vars[m.group(1)] = ev.pipeline(_tokens(m.group(3)), dot)
                continue
            out.append(gostr(ev.pipeline(_tokens(body), dot)))
            continue
        word, branches = node
        for i, (cond, body) in enumerate(branches):
            if cond is None:  # plain else
                _run(body, ev, dot, out)
                break
            value = ev.pipeline(_tokens(cond), dot)
            if word == "range" and i == 0:
                seq = list(value.values()) if isinstance(value, dict) else list(value or [])
                if seq:
                    for item in seq:
                        _run(body, ev, item, out)
                    break
                continue
            if truthy(value):
                _run(body, ev, value if word == "with" and i == 0 else dot, out)
                break


def render(src: str, values: dict, *, namespace: str, app_version: str) -> str:
    root = {"Values": values, "Release": {"Namespace": namespace, "Name": "release"},
            "Chart": {"AppVersion": app_version}}
    out: list[str] = []
    _run(_parse(src), _Eval(root, {}), root, out)
    return "".join(out)
