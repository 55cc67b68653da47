"""Helpers shared by the readers: file bytes, vectorized tokenizing and number parsing, canonical CSR.

Nothing here loops in Python over lines or entries. A text file is classified byte by byte with NumPy
(whitespace or not), its tokens located by their start/end offsets, and numbers parsed from
fixed-width byte windows (a decimal fast path exact to the last bit; for the rest, a strict grammar
check, then NumPy's own string parser). Line numbers are computed only when something is wrong.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..errors import FormatError
# read_bytes is the text readers' (and graphchallenge's) way to a file
from ._files import read_bytes, require_memory  # noqa: F401

WIDE = 64  # spaces padding the text: position lookups up to WIDE before a token stay in bounds
CHUNK = 1 << 16  # tokens per parsing step: keeps its temporary arrays in cache
_P10_FLT = 10.0 ** np.arange(23)  # every power here is exact in float64, so one multiply/divide rounds once
INT32_MAX = np.iinfo(np.int32).max


def value_dtype(dtype) -> np.dtype:
    """The values' dtype option: a floating dtype (float32 by default everywhere)."""
    dt = np.dtype(dtype)
    if dt.kind != "f":
        raise ValueError(f"dtype must be a floating dtype (float16, float32, float64), not {dt}")
    return dt


# ------------------------------------------------------------------------------------------ tokens

def _shorten(b: bytes, n: int = 40) -> str:
    s = b.decode("utf-8", "replace")
    return repr(s if len(s) <= n else s[:n] + "...")


class Tokens:
    """The whitespace-separated tokens of data[start:stop], located without a Python loop.

    `first_line` is the 1-based line number of byte `start`; line numbers of tokens are derived from it
    on the error path only. Whitespace is what bytes.split() splits on (space, \\t, \\n, \\r, \\v, \\f).
    """

    def __init__(self, data: bytes, path, first_line: int = 1, start: int = 0, stop: int | None = None):
        stop = len(data) if stop is None else stop
        self.data, self.path, self.first_line, self.start = data, path, first_line, start
        n = stop - start
        # the byte buffer, its whitespace mask and two offsets per token: about 11 bytes a byte
        require_memory(11 * n, f"tokenizing {n} bytes of text", path)
        # WIDE spaces on both sides: every window of <= WIDE bytes around a token stays in bounds,
        # and a token can neither begin at index 0 nor run off the end.
        buf = np.full(n + 2 * WIDE, 32, np.uint8)
        buf[WIDE:WIDE + n] = np.frombuffer(data, np.uint8, count=n, offset=start)
        self.buf = buf
        ws = (buf == 32) | ((buf - 9) < 5)  # uint8 wraps: 9..13 are \t \n \v \f \r
        edges = np.flatnonzero(ws[1:] != ws[:-1]) + 1
        self.starts = edges[0::2]  # offsets in buf
        self.ends = edges[1::2]
        self.count = len(self.starts)

    # -- error-path helpers --------------------------------------------------------------------
    def offset(self, t: int) -> int:
        """Offset of token t in `data`."""
        return int(self.starts[t]) - WIDE + self.start

    def line_of(self, t: int) -> int:
        return self.first_line + self.data.count(b"\n", self.start, self.offset(t))

    def text(self, t: int) -> str:
        return _shorten(self.buf[self.starts[t]:self.ends[t]].tobytes())

    def line_text(self, t: int) -> str:
        o = self.offset(t)
        a = self.data.rfind(b"\n", 0, o) + 1
        b = self.data.find(b"\n", o)
        return _shorten(self.data[a:len(self.data) if b < 0 else b].strip(), 60)

    def fail(self, t: int, expected: str, found: str):
        raise FormatError(self.path, self.line_of(t), expected, found)

    def end_line(self) -> int:
        """Line number just past the last token (where a missing entry was expected)."""
        if self.count == 0:
            return self.first_line
        return self.line_of(self.count - 1) + 1

    # -- structure ------------------------------------------------------------------------------
    def newline_after(self) -> np.ndarray:
        """Per token: does a newline follow it before the next token (True for the last token)?"""
        s, e = self.starts, self.ends
        flag = self.buf[e] == 10
        # a gap of one byte is that byte; longer gaps (\r\n, runs of spaces, blank lines) are
        # settled by counting newlines before each end of those gaps only
        long = np.flatnonzero(s[1:] - e[:-1] > 1)
        if len(long):
            nl = np.flatnonzero(self.buf == 10)
            flag[long] = np.searchsorted(nl, s[long + 1]) > np.searchsorted(nl, e[long])
        if self.count:
            flag[-1] = True
        return flag

    def check_rows(self, width: int, layout: str) -> int:
        """Every non-blank line holds exactly `width` tokens; returns the number of such lines."""
        flag = self.newline_after()
        ok = self.count % width == 0 and bool(flag[width - 1::width].all())
        for j in range(width - 1):  # over the fields of a line, not over lines
            ok = ok and not flag[j::width].any()
        if not ok:
            self._bad_row(width, layout)
        return self.count // width

    def _bad_row(self, width: int, layout: str):
        # error path: number every token's line, count tokens per line, name the first bad line
        line = np.searchsorted(np.flatnonzero(self.buf == 10), self.starts)
        per_line = np.bincount(line)
        bad = int(np.flatnonzero((per_line != 0) & (per_line != width))[0])
        t = int(np.searchsorted(line, bad))
        n = int(per_line[bad])
        self.fail(t, f"{width} whitespace-separated fields ({layout})",
                  f"{n} field{'s' if n != 1 else ''}: {self.line_text(t)}")

    # -- numbers --------------------------------------------------------------------------------
    # Numbers are parsed a character position at a time: a Python loop over the (few) positions of
    # the longest token, each step a NumPy operation over all tokens of a chunk. Position k counts
    # from the token's end (right-aligned), so the digits of integers line up.

    def _chunks(self, idx):
        idx = np.arange(self.count)[idx] if isinstance(idx, slice) else np.asarray(idx)
        for c in range(0, len(idx), CHUNK):
            part = idx[c:c + CHUNK]
            s, e = self.starts[part], self.ends[part]
            yield c, part, s, e, e - s

    def ints(self, idx, what: str) -> np.ndarray:
        """int64 values of the tokens idx (index array or slice): [+-]digits, at most 18 digits."""
        n = len(np.arange(self.count)[idx]) if isinstance(idx, slice) else len(idx)
        out = np.empty(n, np.int64)
        for c, part, s, e, lens in self._chunks(idx):
            width = int(lens.max(initial=0))
            first = self.buf[s]
            signed = (first == 43) | (first == 45)
            digits = lens - signed
            ok = (digits >= 1) & (digits <= 18)
            v = np.zeros(len(part), np.int64)
            for k in range(min(width, 19), 0, -1):
                ch = self.buf[e - k]
                d = ch - np.uint8(48)
                inside = lens >= k
                isd = d < 10
                ok &= isd | ~inside | ((lens == k) & signed)
                v = v * 10 + np.where(inside & isd, d, 0)
            if not ok.all():
                self._bad_int(part[~ok], what)
            out[c:c + len(part)] = np.where(first == 45, -v, v)
        return out

    def _bad_int(self, part, what):
        t = int(part[0])  # error path: the first token that failed
        b = self.buf[self.starts[t]:self.ends[t]].tobytes()
        try:
            int(b.decode("ascii"), 10)
        except (ValueError, UnicodeDecodeError):
            self.fail(t, f"an integer {what}", self.text(t))
        self.fail(t, f"an integer {what} of at most 18 digits", self.text(t))

    def floats(self, idx, what: str) -> np.ndarray:
        """float64 values of the tokens idx; exact decimal fast path, NumPy's parser for the rest."""
        n = len(np.arange(self.count)[idx]) if isinstance(idx, slice) else len(idx)
        out = np.empty(n, np.float64)
        for c, part, s, e, lens in self._chunks(idx):
            v = np.empty(len(part))
            todo = np.arange(len(part))
            for _ in range(8):  # a file mixes a few layouts (say %g's "0.5", "1e-05", "3"): one pass each
                vals, fast = self._floats_fast(s[todo], e[todo], lens[todo])
                v[todo[fast]] = vals[fast]
                todo = todo[~fast]
                if not len(todo) or not fast[0]:  # the layout's own token failed: not a plain decimal
                    break
            if len(todo):
                v[todo] = self._floats_slow(part[todo], what)
            out[c:c + len(part)] = v
        return out

    def _floats_fast(self, s, e, lens):
        """Tokens laid out like the first one (same digits, dot and exponent positions, an
        optional sign) are parsed as integer mantissa M (<= 15 digits, so exact) and decimal
        exponent k: M * 10**k or M / 10**-k with |k| <= 22 is one IEEE operation on exact operands,
        so correctly rounded, as strtod would. Other tokens are flagged not fast."""
        n = len(s)
        first = self.buf[s]
        neg = first == 45
        signed = neg | (first == 43)
        t0 = self.buf[s[0] + signed[0]:e[0]].tobytes() if n else b""
        layout = _layout(t0)
        if layout is None:
            return np.zeros(n), np.zeros(n, bool)
        kinds, frac = layout
        size = len(kinds)
        fast = lens - signed == size
        m = np.zeros(n)
        x = np.zeros(n, np.int64)
        xneg = np.zeros(n, bool)
        for j, kind in enumerate(kinds):
            ch = self.buf[e - (size - j)]
            if kind == "m" or kind == "x":
                d = ch - np.uint8(48)
                fast &= d < 10
                if kind == "m":
                    m = m * 10 + d
                else:
                    x = x * 10 + d
            elif kind == ".":
                fast &= ch == 46
            elif kind == "e":
                fast &= (ch | np.uint8(32)) == 101
            else:  # exponent sign
                xneg = ch == 45
                fast &= xneg | (ch == 43)
        k = np.where(xneg, -x, x) - frac
        fast &= np.abs(k) <= 22
        p = _P10_FLT[np.minimum(np.abs(k), 22)]
        v = np.where(k >= 0, m * p, m / p)
        return np.where(neg, -v, v), fast

    def _floats_slow(self, part, what):
        """Tokens checked against the strict grammar of a decimal number (`_float_grammar`), then
        parsed by NumPy's correctly rounded string-to-float; anything else is a FormatError."""
        s, e = self.starts[part], self.ends[part]
        lens = e - s
        long = np.flatnonzero(lens > MAX_NUMBER)
        if len(long):
            t = int(part[long[0]])
            self.fail(t, f"a number ({what}) of at most {MAX_NUMBER} characters", self.text(t))
        width = int(lens.max(initial=1))
        pos = np.arange(width)
        inside = pos < lens[:, None]
        chars = np.where(inside, self.buf[np.minimum(s[:, None] + pos, len(self.buf) - 1)], 0).astype(np.uint8)
        ok = _float_grammar(chars, inside, lens)
        if not ok.all():
            t = int(part[np.argmin(ok)])
            self.fail(t, f"a number ({what})", self.text(t))
        return np.ascontiguousarray(chars).view(f"S{width}").ravel().astype(np.float64)


# The number grammar, as a table-driven automaton run over all tokens at once, one character
# position per step:  [+-]? ( digits [. digits?] | . digits ) ( [eE] [+-]? digits )?
# Character classes: 0 other, 1 digit, 2 sign, 3 dot, 4 e/E, 5 past the token's end (keeps the
# state). States: 0 start, 1 sign, 2 integer digits, 3 dot after digits, 4 dot without digits,
# 5 fraction digits, 6 e, 7 exponent sign, 8 exponent digits, 9 rejected. `nan`, `inf` and
# `infinity` (any case, signed) are accepted too, so that the finite check names them.
_CLASS = np.zeros(256, np.uint8)
_CLASS[48:58] = 1
_CLASS[[43, 45]] = 2
_CLASS[46] = 3
_CLASS[[69, 101]] = 4


def _transitions() -> np.ndarray:
    """next state = table[state, class]; every move not listed rejects."""
    table = np.full((10, 6), 9, np.uint8)
    table[:, 5] = np.arange(10)
    moves = {0: {1: 2, 2: 1, 3: 4}, 1: {1: 2, 3: 4}, 2: {1: 2, 3: 3, 4: 6}, 3: {1: 5, 4: 6}, 4: {1: 5},
             5: {1: 5, 4: 6}, 6: {1: 8, 2: 7}, 7: {1: 8}, 8: {1: 8}}
    for state, row in moves.items():
        for cls, to in row.items():
            table[state, cls] = to
    return table


_NEXT = _transitions()
_ACCEPT = np.zeros(10, bool)
_ACCEPT[[2, 3, 5, 8]] = True
_WORDS = np.array([sign + w for sign in (b"", b"+", b"-") for w in (b"nan", b"inf", b"infinity")])
MAX_NUMBER = 256  # characters in a number token: beyond any decimal a program writes


def _float_grammar(chars: np.ndarray, inside: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Per row of chars (tokens x width, zero-padded where not `inside` the token): is it a number?"""
    state = np.zeros(len(chars), np.uint8)
    cls = np.where(inside, _CLASS[chars], np.uint8(5)).T.copy()  # position-major: each step reads one row
    table = _NEXT.ravel()
    for j in range(chars.shape[1]):  # over character positions, not over tokens
        state = table.take(state * np.uint8(6) + cls[j])  # uint8: 9 * 6 + 5 fits
    ok = _ACCEPT[state]
    other = np.flatnonzero(~ok)
    if len(other):  # the few tokens that are not decimals may be nan or inf
        c = chars[other]
        lower = np.where((c >= 65) & (c <= 90), c | 32, c).astype(np.uint8)
        words = np.ascontiguousarray(lower).view(f"S{chars.shape[1]}").ravel()
        # a zero byte inside a token would end the string early: the length check keeps it out
        ok[other] = np.isin(words, _WORDS) & (np.char.str_len(words) == lens[other])
    return ok


def _layout(token: bytes):
    """Per-character kinds of a plain decimal token without sign ('m' mantissa digit, '.', 'e',
    's' exponent sign, 'x' exponent digit) and its count of fraction digits; None if the token is
    not [digits][.digits][(e|E)[+-]digits] with 1..15 mantissa digits and 1..3 exponent digits."""
    if not token or len(token) > WIDE - 2:
        return None
    kinds, frac, part = [], 0, "int"
    for ch in token.lower():  # one token of at most WIDE characters
        if 48 <= ch <= 57:
            kinds.append("x" if part == "exp" else "m")
            frac += part == "frac"
        elif ch == 46 and part == "int":
            kinds.append(".")
            part = "frac"
        elif ch == 101 and part in ("int", "frac") and "m" in kinds:
            kinds.append("e")
            part = "exp"
        elif ch in (43, 45) and kinds and kinds[-1] == "e":
            kinds.append("s")
        else:
            return None
    mant, exp = kinds.count("m"), kinds.count("x")
    if not 1 <= mant <= 15 or (part == "exp" and not 1 <= exp <= 3):
        return None
    return kinds, frac


# --------------------------------------------------------------------------------------- matrices

def indptr_of_rows(rows, m: int, path=None) -> np.ndarray:
    """int64 row pointers (length m + 1) of entries whose sorted 0-based row indices are `rows`."""
    require_memory(16 * (m + 1), f"building the row pointers of {m} rows", path)
    indptr = np.zeros(m + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=m), out=indptr[1:])
    return indptr


def strict_int(word: bytes) -> int | None:
    """The integer [+-]?digits spells, else None: no '_', no whitespace or NUL inside, ASCII only
    (int() itself accepts '1_000' and surrounding whitespace)."""
    body = word[1:] if word[:1] in (b"+", b"-") else word
    if not body or not body.isdigit():  # bytes.isdigit is ASCII 0-9 only
        return None
    return int(word)


def index_dtype(shape, nnz) -> np.dtype:
    return np.dtype(np.int32 if max(max(shape, default=0), nnz) <= INT32_MAX else np.int64)


def make_csr(data, indices, indptr, shape) -> sp.csr_matrix:
    """A csr_matrix from arrays already canonical (sorted, no duplicates), with the flags set."""
    it = index_dtype(shape, len(indices))
    m = sp.csr_matrix((data, indices.astype(it, copy=False), indptr.astype(it, copy=False)),
                      shape=shape, copy=False)
    m.has_sorted_indices = True
    m.has_canonical_format = True
    return m


def coo_to_csr(rows, cols, vals, shape, *, duplicate, path=None):
    """Canonical CSR from 0-based, in-range COO. `duplicate(i, j)` is called with the positions of
    two equal (row, col) entries, i before j in the input, and must raise."""
    m, n = shape
    if m * n < 2**62:
        key = rows * n + cols
        if not np.all(key[1:] > key[:-1]):  # already sorted and distinct: nothing to do
            order = np.argsort(key)
            ks = key[order]
            if np.any(ks[1:] == ks[:-1]):
                _report_duplicate(key, duplicate)
            rows, cols, vals = rows[order], cols[order], vals[order]
    else:
        order = np.lexsort((cols, rows))
        r, c = rows[order], cols[order]
        same = (r[1:] == r[:-1]) & (c[1:] == c[:-1])
        if same.any():
            _report_duplicate(np.unique(np.stack([rows, cols], 1), axis=0, return_inverse=True)[1], duplicate)
        rows, cols, vals = r, c, vals[order]
    return make_csr(vals, cols, indptr_of_rows(rows, m, path), (m, n))


def _report_duplicate(key, duplicate):
    # error path: stable order keeps equal keys in input order; report the pair whose later
    # member comes first in the input
    order = np.argsort(key, kind="stable")
    ks = key[order]
    dup = np.flatnonzero(ks[1:] == ks[:-1])
    j = int(np.argmin(order[dup + 1]))
    later = int(order[dup[j] + 1])
    earlier = int(order[np.searchsorted(ks, ks[dup[j]])])
    duplicate(earlier, later)


def cast_values(values, dt, path, where=None):
    """values as dt, refusing finite values that overflow it (1e300 as float32 would become inf)."""
    with np.errstate(over="ignore"):  # overflow is checked right below
        cast = values.astype(dt, copy=False)
    if cast.dtype != values.dtype and cast.dtype.itemsize <= values.dtype.itemsize:
        bad = ~np.isfinite(cast)
        if bad.any():
            i = int(np.argmax(bad))
            line = where(i) if where is not None else None
            raise FormatError(path, line, f"values representable in {dt}", f"{float(values[i])!r}, which overflows it")
    return cast


def check_value_dtype(dt, path, what: str | None = None):
    """Values must be real numbers: bool, integer or float."""
    if dt.kind not in "biuf":
        kind = "complex" if dt.kind == "c" else "non-numeric"
        expected = "real numeric values (bool, integer or float)"
        raise FormatError(path, None, f"{what}: {expected}" if what else expected, f"{kind} dtype {dt}")


def check_finite(values, path, position):
    """NaN/inf values are a FormatError naming how many and where the first is (position(i) -> (row, col))."""
    if values.dtype.kind != "f":
        return
    bad = ~np.isfinite(values)
    if bad.any():
        flat = bad.ravel()
        first = int(np.argmax(flat))
        r, c = position(first)
        raise FormatError(path, None, "finite values",
                          f"{int(flat.sum())} non-finite value(s) (NaN or inf), the first "
                          f"{values.ravel()[first]} at (row {r}, col {c}) (0-based)")


# ----------------------------------------------------------------------- coordinate text entries

def check_indices(tok: Tokens, idx, field: int, width: int, base: int, size: int | None, axis: str, why: str = ""):
    """Indices idx (entry k is token k*width+field) must lie in base..size-1+base; returns them 0-based.

    size None: only the lower bound is checked (the shape is inferred from the indices).
    """
    bad = idx < base if size is None else (idx < base) | (idx >= size + base)
    if bad.any():
        k = int(np.argmax(bad))
        v = int(idx[k])
        expected = f"a {axis} index >= {base}" if size is None else f"a {axis} index in {base}..{size - 1 + base}"
        if v < 0:
            found = f"{v} (negative)"
        elif v < base:
            found = f"{v} (indices are {base}-based)"
        else:
            found = f"{v}, past the {why}"
        tok.fail(k * width + field, expected, found)
    return idx - base if base else idx


def check_finite_entries(tok: Tokens, vals, field: int, width: int):
    bad = ~np.isfinite(vals)
    if bad.any():
        k = int(np.argmax(bad))
        tok.fail(k * width + field, "a finite value",
                 f"{tok.text(k * width + field)} ({int(bad.sum())} non-finite value(s) in the file)")


def duplicate_reporter(tok: Tokens, width: int, rows, cols, base: int, entry_of=None):
    """A `duplicate` callback for coo_to_csr naming the lines of both entries (1-based or 0-based
    coordinates as in the file). entry_of maps an expanded entry back to its line's entry."""
    def duplicate(i, j):
        ei, ej = (i, j) if entry_of is None else sorted((int(entry_of[i]), int(entry_of[j])))
        r, c = int(rows[ej]) + base, int(cols[ej]) + base  # entries come first, mirrors after them
        first = tok.line_of(ei * width)
        tok.fail(ej * width, "at most one entry per (row, col) (duplicates are not allowed)",
                 f"a second entry for (row {r}, col {c}); the first is on line {first}"
                 + (" (after symmetric expansion)" if entry_of is not None else ""))
    return duplicate
