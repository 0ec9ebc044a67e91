"""The one memory-limit grammar, mirrored from c_src/limits/parse.c.

`<number>[k|m|g|t][i][b]`, case-insensitive, ASCII decimal digits only (no sign, fraction, space,
octal or hex), binary multiples (k = KiB ... t = TiB, as HAMi's plugin writes `<MiB>m`), a bare
number is bytes, and `0` with any unit means "no limit". Values that do not fit in 64 bits are
rejected, never wrapped. A property test proves this and the C parser agree.
"""
from __future__ import annotations

import re

from ..report.errors import LimitParseError

UINT64_MAX = (1 << 64) - 1
_SHIFT = {"k": 10, "m": 20, "g": 30, "t": 40}
# [0-9] and explicit ASCII letters: `\d` and re.IGNORECASE would accept non-ASCII digits and the Kelvin sign
_GRAMMAR = re.compile(r"([0-9]+)([kmgtKMGT]?)([iI]?)([bB]?)")
_SM_GRAMMAR = re.compile(r"[0-9]+")


def _number(digits: str) -> int | None:
    """The value of an ASCII digit string, None when it does not fit in 64 bits. Never calls int() on
    more than 20 digits (Python refuses 4301+ digit strings; C accepts any run of leading zeros)."""
    digits = digits.lstrip("0") or "0"
    if len(digits) > 20:
        return None
    value = int(digits)
    return value if value <= UINT64_MAX else None


def parse_limit(text: str, *, name: str = "limit") -> int:
    """Bytes for a limit string (0 = no limit); LimitParseError naming `name` when malformed."""
    m = _GRAMMAR.fullmatch(text)
    if not m:
        raise LimitParseError(
            f"invalid {name}={text!r}: expected <number>[k|m|g|t][i][b], e.g. 4g or 4096m; fix the value")
    value = _number(m.group(1))
    shift = _SHIFT.get(m.group(2).lower(), 0)
    if value is None or value > UINT64_MAX >> shift:
        raise LimitParseError(f"invalid {name}={text!r}: number too large for 64 bits; fix the value")
    return value << shift


def parse_sm_limit(text: str, *, name: str = "CUDA_DEVICE_SM_LIMIT") -> int:
    """The percent as written (decimal digits only: no sign, space, `%` or unit); the shim maps 0 and
    >= 100 to "no SM limit". LimitParseError naming `name` when malformed (the shim then fails closed)."""
    value = _number(text) if _SM_GRAMMAR.fullmatch(text) else None
    if value is None:
        why = "number too large for 64 bits" if _SM_GRAMMAR.fullmatch(text) else \
            "expected a whole percent in decimal digits (no sign, space or %), e.g. 50"
        raise LimitParseError(f"invalid {name}={text!r}: {why}; fix the value")
    return value


def sm_limits_from_env(env: dict[str, str], max_devices: int = 16) -> dict[int, int]:
    """Per-device SM percent as the shim applies it: CUDA_DEVICE_SM_LIMIT_<i>, else CUDA_DEVICE_SM_LIMIT;
    0 = no SM limit (unset, 0 or >= 100)."""
    raw = env.get("CUDA_DEVICE_SM_LIMIT")
    fallback = parse_sm_limit(raw) if raw is not None else 0
    out = {}
    for i in range(max_devices):
        var = f"CUDA_DEVICE_SM_LIMIT_{i}"
        v = parse_sm_limit(env[var], name=var) if var in env else fallback
        out[i] = 0 if v >= 100 else v
    return out


def format_limit(nbytes: int) -> str:
    """The shortest exact spelling of nbytes in the grammar (`4g`, `1536m`, `100`)."""
    if nbytes < 0 or nbytes > UINT64_MAX:
        raise LimitParseError(f"limit {nbytes} out of range 0..2^64-1; use a non-negative 64-bit byte count")
    for unit, shift in sorted(_SHIFT.items(), key=lambda kv: -kv[1]):
        if nbytes and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)


def limits_from_env(env: dict[str, str], max_devices: int = 16) -> dict[int, int]:
    """Per-device limits as the shim reads them: CUDA_DEVICE_MEMORY_LIMIT_<i>, else CUDA_DEVICE_MEMORY_LIMIT."""
    fallback_raw = env.get("CUDA_DEVICE_MEMORY_LIMIT")
    fallback = parse_limit(fallback_raw, name="CUDA_DEVICE_MEMORY_LIMIT") if fallback_raw is not None else 0
    out = {}
    for i in range(max_devices):
        var = f"CUDA_DEVICE_MEMORY_LIMIT_{i}"
        out[i] = parse_limit(env[var], name=var) if var in env else fallback
    return out
