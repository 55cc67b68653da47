"""Family options: each family's are a frozen dataclass of typed fields with defaults.

A field's type says what the option takes: `Literal[...]` (one of those values, compared by
equality, so True is 1), `int`, `float`, `bool` or `str`, with `| None` where None (then the default)
lets the family choose. `option(default, expected=..., valid=...)` gives a field its default, what it
expects in words for the error, and a test of the value beyond its type; `check()` says what is wrong
across fields. Values are conformed as they are set (NumPy scalars become Python ones, a Literal's
value becomes the Literal's own), so equal options build equal objects and `items()`, the options
that differ from their defaults, is a normalized form for cache keys.

Building one refuses an unknown key (`from_dict`, naming the family's valid options) and a value its
option does not take (`OptionsError`). Checks that need the request (n, dtype, the device) stay in
the family's rules, which decline.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from dataclasses import dataclass
from typing import Callable, Literal, Union

import numpy as np

from ..errors import OptionsError


def option(default=None, expected: str = "", valid: Callable | None = None):
    """A field of a family's options: its default, what it expects (for the error) and a test of
    the value beyond its type."""
    return dataclasses.field(default=default, metadata={"expected": expected, "valid": valid})


@dataclass(frozen=True)
class FamilyOptions:
    """Options of a family that takes none; each family's subclass declares its own. `from_dict` and
    `of` take a value of None as an option not given."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _conform(f, getattr(self, f.name), _hints(type(self))[f.name]))
        problem = self.check()
        if problem:
            raise OptionsError(f"options {problem}")

    def check(self) -> str | None:
        """What is wrong across fields, or None (the types and `valid` have passed)."""
        return None

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, options: dict, family: str) -> FamilyOptions:
        """The options of `family`, or OptionsError naming a key it does not take and those it does."""
        unknown = sorted(set(options) - set(cls.names()))
        if unknown:
            raise OptionsError(f"options {', '.join(unknown)}: {family} takes no such option "
                               f"({describe_names(cls.names())})")
        return cls(**{k: v for k, v in options.items() if v is not None})

    @classmethod
    def of(cls, request) -> FamilyOptions:
        """The request's options that this family takes (the rest are other families')."""
        names = cls.names()
        return cls(**{k: v for k, v in dict(request.options).items() if k in names and v is not None})

    @classmethod
    def problem(cls, request) -> str | None:
        """Why the request's options for this family are wrong (its rules decline with it), or None."""
        try:
            cls.of(request)
        except OptionsError as exc:
            return str(exc)
        return None

    @classmethod
    def conform(cls, name: str, value):
        """`value` as option `name` holds it, or OptionsError saying what it expects."""
        f = next(f for f in dataclasses.fields(cls) if f.name == name)
        return _conform(f, value, _hints(cls)[name])

    @classmethod
    def default(cls, name: str):
        return next(f.default for f in dataclasses.fields(cls) if f.name == name)

    def items(self) -> tuple:
        """(name, value) of every option that differs from its default, by name."""
        return tuple(sorted((f.name, getattr(self, f.name)) for f in dataclasses.fields(self)
                            if getattr(self, f.name) != f.default))


def describe_names(names) -> str:
    return f"its options: {', '.join(names)}" if names else "it takes none"


@functools.cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _alternatives(hint) -> tuple:
    if typing.get_origin(hint) in (Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _conform(f: dataclasses.Field, value, hint):
    """`value` as the field holds it, or OptionsError saying what the field expects."""
    if isinstance(value, np.generic):
        value = value.item()
    kinds = _alternatives(hint)
    if value is None and type(None) in kinds:
        return None
    for kind in kinds:
        if kind is type(None):
            continue
        ok, conformed = _as(kind, value)
        valid = f.metadata.get("valid")
        if ok and (valid is None or valid(conformed)):
            return conformed
    expected = f.metadata.get("expected") or " or ".join(_expected(k) for k in kinds if k is not type(None))
    raise OptionsError(f"options {f.name}={value!r}: expected {expected}")


def _as(kind, value) -> tuple[bool, object]:
    if typing.get_origin(kind) is Literal:
        for allowed in typing.get_args(kind):
            if isinstance(value, str) == isinstance(allowed, str) and value == allowed:
                return True, allowed
        return False, None
    if kind is bool:
        return (True, bool(value)) if isinstance(value, (bool, int)) and value in (0, 1) else (False, None)
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return False, None
        if kind is int:
            return (True, int(value)) if isinstance(value, numbers.Integral) else (False, None)
        return (True, float(value)) if math.isfinite(value) else (False, None)
    if kind is str:
        return (True, value) if isinstance(value, str) else (False, None)
    raise TypeError(f"an option of type {kind!r}: expected a Literal, int, float, bool or str")


def _expected(kind) -> str:
    if typing.get_origin(kind) is Literal:  # sorted: typing may hand back an equal Literal in another order
        values = [repr(v) for v in sorted(typing.get_args(kind), key=lambda v: (type(v).__name__, v))]
        return values[0] if len(values) == 1 else f"one of {', '.join(values)}"
    return {bool: "True or False", int: "an integer", float: "a finite number", str: "a string"}[kind]
