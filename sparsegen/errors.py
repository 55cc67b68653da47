"""The exceptions sparsegen raises. The CLI turns each into exit status 2 and one line."""
from __future__ import annotations


class SparsegenError(Exception):
    """Base of every error sparsegen raises on purpose."""


class FormatError(SparsegenError, ValueError):
    """A file (or in-memory matrix) does not hold what its format promises."""

    def __init__(self, path, line, expected: str, found: str):
        self.path = str(path) if path is not None else "<matrix>"
        self.line = line
        self.expected = expected
        self.found = found
        where = self.path if line is None else f"{self.path}:{line}"
        super().__init__(f"{where}: expected {expected}, found {found}")


class CompileError(SparsegenError):
    """nvcc rejected generated source. Carries the numbered source and nvcc's output."""

    def __init__(self, message: str, source: str = "", log: str = "", command=()):
        self.source = source
        self.log = log
        self.command = list(command)
        super().__init__(message)

    @property
    def numbered_source(self) -> str:
        return "\n".join(f"{i:5d}  {line}" for i, line in enumerate(self.source.splitlines(), 1))

    def details(self) -> str:
        return f"{self}\n--- nvcc output ---\n{self.log}\n--- source ---\n{self.numbered_source}"


class UnsupportedError(SparsegenError):
    """No kernel family accepts the request; `declines` lists (rule, reason) for each rule."""

    def __init__(self, message: str, declines=()):
        self.declines = list(declines)
        if self.declines:
            message += "; " + "; ".join(f"{rule}: {why}" for rule, why in self.declines)
        super().__init__(message)


class OptionsError(UnsupportedError, ValueError):
    """A request's options are wrong: a key no family (or not the family asked for) takes, a value
    its option does not take, or options the family that serves the request does not take."""


class LaunchError(SparsegenError):
    """The GPU runtime is missing or a launch failed."""


class ShapeError(SparsegenError, ValueError):
    """An operand's shape, dtype, layout or device is not what the kernel was compiled for."""
