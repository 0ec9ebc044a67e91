"""The chart test's minimal Go-template renderer follows text/template and sprig on the constructs the chart uses."""
from __future__ import annotations

import gotemplate
import pytest


def r(src: str, values: dict | None = None, ns: str = "kube-system") -> str:
    return gotemplate.render(src, values or {}, namespace=ns, app_version="1.2.3")


@pytest.mark.parametrize(("src", "values", "want"), [
    ("a {{- \" b \" -}} c", {}, "a b c"),  # trim markers eat all adjacent whitespace
    ("x\n  {{- if .Values.on }}\n  on\n  {{- end }}\ny", {"on": True}, "x\n  on\ny"),
    ("x\n  {{- if .Values.on }}\n  on\n  {{- end }}\ny", {"on": False}, "x\ny"),
    ("{{ if eq .Values.v \"a\" }}A{{ else if .Values.v }}B{{ else }}C{{ end }}", {"v": "z"}, "B"),
    ("{{ if eq .Values.v \"a\" }}A{{ else if .Values.v }}B{{ else }}C{{ end }}", {"v": ""}, "C"),
    ("{{ with .Values.m }}{{ .k }}{{ else }}none{{ end }}", {"m": {"k": "v"}}, "v"),
    ("{{ with .Values.m }}{{ .k }}{{ else }}none{{ end }}", {"m": {}}, "none"),  # empty map is false
    ("{{ range .Values.l }}[{{ . }}]{{ end }}", {"l": ["a", "b"]}, "[a][b]"),
    ("{{ .Values.n }} {{ .Values.f }} {{ .Values.b }}", {"n": 9400, "f": 10.0, "b": True}, "9400 10 true"),
    ("{{ .Values.f | toString | quote }}", {"f": 2.5}, '"2.5"'),
    ("{{ toString .Values.missing }}", {}, "<nil>"),  # sprig's strval of nil
    ("{{ trimSuffix \"/\" .Values.d }}", {"d": "/srv/x/"}, "/srv/x"),
    ("{{ printf \"/host%s\" .Values.d | quote }}", {"d": "/a"}, '"/host/a"'),
    ("{{ int (maxf 120 (addf 60 (mulf 3 .Values.i))) }}", {"i": 45.5}, "196"),
    ("{{ $x := .Values.a }}{{ $x }}-{{ .Release.Namespace }}-{{ .Chart.AppVersion }}", {"a": "v"},
     "v-kube-system-1.2.3"),
    ("k:\n  {{- toYaml .Values.m | nindent 2 }}", {"m": {"b": 1, "a": "on"}}, "k:\n  a: 'on'\n  b: 1"),
    ("{{ and .Values.a .Values.b }}|{{ or .Values.a .Values.b }}|{{ not .Values.a }}", {"a": 0, "b": "x"}, "0|x|true"),
])
def test_semantics(src: str, values: dict, want: str) -> None:
    assert r(src, values) == want


def test_fail_and_unknown_functions() -> None:
    with pytest.raises(gotemplate.TemplateFail, match="boom"):
        r('{{ fail "boom" }}')
    with pytest.raises(SyntaxError, match="unknown function"):
        r("{{ lookup \"v1\" }}")
