"""The C parser (c_src/limits/parse.c) and vgpu_patch.shim.limits agree on every input."""
from __future__ import annotations

import subprocess
from pathlib import Path

import cffi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vgpu_patch.report.errors import LimitParseError
from vgpu_patch.shim.limits import parse_limit, parse_sm_limit

C_SRC = Path(__file__).resolve().parents[2] / "c_src"

# test-only export of the hidden parser, built from the very same parse.c
WRAPPER = """
#include "limits/parse.c"
__attribute__((visibility("default"))) int test_parse(const char *s, unsigned long long *out)
{
    uint64_t v = 0;
    const char *why = 0;
    int rc = vgpu_limit_parse(s, &v, &why);
    *out = v;
    return rc;
}
__attribute__((visibility("default"))) int test_sm_parse(const char *s, unsigned long long *out)
{
    uint64_t v = 0;
    const char *why = 0;
    int rc = vgpu_sm_parse(s, &v, &why);
    *out = v;
    return rc;
}
"""


@pytest.fixture(scope="module")
def c_parse(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("parse")
    (d / "wrap.c").write_text(WRAPPER)
    so = d / "libparse.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-fvisibility=hidden", "-O2", "-Wall", "-Wextra", "-Werror",
                    f"-I{C_SRC}", str(d / "wrap.c"), "-o", str(so)], check=True, capture_output=True, text=True)
    ffi = cffi.FFI()
    ffi.cdef("int test_parse(const char *s, unsigned long long *out);"
             "int test_sm_parse(const char *s, unsigned long long *out);")
    lib = ffi.dlopen(str(so))

    def parse(text: str) -> int | None:
        out = ffi.new("unsigned long long *")
        return out[0] if lib.test_parse(text.encode(), out) == 0 else None

    def sm(text: str) -> int | None:
        out = ffi.new("unsigned long long *")
        return out[0] if lib.test_sm_parse(text.encode(), out) == 0 else None

    parse.sm = sm
    return parse


def py_parse(text: str) -> int | None:
    try:
        return parse_limit(text)
    except LimitParseError:
        return None


def py_sm(text: str) -> int | None:
    try:
        return parse_sm_limit(text)
    except LimitParseError:
        return None


KNOWN = {
    "0": 0, "0m": 0, "0g": 0, "0MiB": 0, "100": 100, "100b": 100, "1k": 1024, "4096m": 4096 << 20, "4g": 4 << 30,
    "4G": 4 << 30, "4GiB": 4 << 30, "4gb": 4 << 30, "10Gi": 10 << 30, "1t": 1 << 40, "010m": 10 << 20,
    "18446744073709551615": 2**64 - 1, "16777215t": 16777215 << 40,
    "": None, "1.5g": None, "-1": None, "+1": None, " 1m": None, "1m ": None, "0x10": None, "10x": None, "m": None,
    "1gg": None, "1bi": None, "18446744073709551616": None, "16777216t": None, "1e3": None, "1\u0660": None,
    "1\u212a": None,  # Kelvin sign lower-cases to 'k' in Python: must still be rejected
    "0" * 5000 + "1m": 1 << 20,  # Python's int() refuses 4301+ digits; leading zeros are fine in C
    "9" * 5000: None, "1" + "0" * 4400 + "g": None,
}

SM_KNOWN = {
    "50": 50, "050": 50, "0": 0, "100": 100, "150": 150, "0" * 5000 + "7": 7, "18446744073709551615": 2**64 - 1,
    "50%": None, "+50": None, "50 ": None, " 50": None, "": None, "-1": None, "5e1": None, "50m": None,
    "0x32": None, "50.0": None, "18446744073709551616": None, "\u0665\u0660": None, "9" * 5000: None,
}


@pytest.mark.parametrize("text,expected", sorted(SM_KNOWN.items()))
def test_known_sm_values(c_parse, text: str, expected: int | None) -> None:
    assert py_sm(text) == expected
    assert c_parse.sm(text) == expected


@pytest.mark.parametrize("text,expected", sorted(KNOWN.items()))
def test_known_values(c_parse, text: str, expected: int | None) -> None:
    assert py_parse(text) == expected
    assert c_parse(text) == expected


ALPHABET = "0123456789kmgtKMGTiIbBx.-+ e\u212a"
near_grammar = st.builds(
    lambda n, unit, i, b: f"{n}{unit}{i}{b}",
    st.integers(min_value=0, max_value=2**66).map(str) | st.text("0123456789", min_size=1, max_size=25),
    st.sampled_from(["", "k", "m", "g", "t", "K", "M", "G", "T", "x", "p"]),
    st.sampled_from(["", "i", "I"]),
    st.sampled_from(["", "b", "B", "bb"]),
)


@settings(max_examples=800, deadline=None)
@given(st.text(ALPHABET, max_size=24) | near_grammar
       | st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=8))
def test_c_and_python_agree(c_parse, text: str) -> None:
    assert c_parse(text) == py_parse(text)


@settings(max_examples=500, deadline=None)
@given(st.text("0123456789%+- .xe\u0660", max_size=24) | st.integers(min_value=0, max_value=2**66).map(str)
       | st.text("0", min_size=4290, max_size=4310).map(lambda z: z + "5"))
def test_c_and_python_agree_on_sm_limits(c_parse, text: str) -> None:
    assert c_parse.sm(text) == py_sm(text)


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=4200, max_value=4400), st.sampled_from(["", "m", "g", "1", "9"]))
def test_long_digit_strings_agree(c_parse, zeros: int, tail: str) -> None:
    text = "0" * zeros + tail
    assert c_parse(text) == py_parse(text)


def test_sm_limits_from_env_maps_none_like_the_shim() -> None:
    from vgpu_patch.shim.limits import sm_limits_from_env

    got = sm_limits_from_env({"CUDA_DEVICE_SM_LIMIT": "100", "CUDA_DEVICE_SM_LIMIT_1": "30",
                              "CUDA_DEVICE_SM_LIMIT_2": "0", "CUDA_DEVICE_SM_LIMIT_3": "150"})
    assert (got[0], got[1], got[2], got[3], got[15]) == (0, 30, 0, 0, 0)
    with pytest.raises(LimitParseError, match="CUDA_DEVICE_SM_LIMIT_4='50%'"):
        sm_limits_from_env({"CUDA_DEVICE_SM_LIMIT_4": "50%"})
