"""The contract of a kernel family: what its module must define, the hooks it may define, and the
registration that checks one against the other.

A family is a module under `sparsegen/families/`. It must define what `FamilyModule` lists: its
name, the ops it serves, its `Spec`, its format module, how to encode a matrix and emulate the
kernel, its operands and their alignment, and its launch geometry: `steps(spec, plan)` when a call is
several launches, else `KERNEL`, `arguments(spec)` and `launch(spec, plan)` for its one kernel.

Everything else is an optional hook with a default (the methods of `Family`): its options
(`Options`, a `FamilyOptions` dataclass; none by default), its selection rules (`RULES`; none when
`select/policy.py` decides for it), the network driver it runs in (`DRIVER`),
the operands its emulator takes (`emulate_operands`), an encoding shared by requests
(`encoding`, `encode_format` and `specialize`, which come together), constants only the encoded plan
knows (`finalize`), its tuning variants (`tune_variants`) and why it cannot run here
(`unavailable`). `register(module)` checks the module and returns a `Family` whose hooks are the
module's where it defines them and the defaults elsewhere, so callers call every hook unconditionally.
"""
from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any, Callable, Protocol, runtime_checkable

from .base import KernelSpec, Rule, Step
from .options import FamilyOptions

OPS = ("spmm", "sddmm", "spdnn_layer")


@runtime_checkable
class FamilyModule(Protocol):
    """What every family module defines."""

    FAMILY: str  # the family's name: spec names start with it, its template is templates/<FAMILY>.cu.j2
    OPS: tuple  # the ops it serves, of OPS
    Spec: type  # its frozen KernelSpec: every template parameter
    FORMAT: ModuleType  # the sparsegen/formats module that encodes and emulates its data layout

    def encode(self, csr, spec, bias=None) -> Any:
        """The matrix (and per-row bias) as the kernel reads it: a formats.Plan."""

    def operands(self, spec, plan) -> tuple:
        """((input Operand, ...), output Operand) of one call."""

    def alignment(self, spec) -> int:
        """Bytes every operand pointer must be aligned to."""

    def emulate(self, spec, plan, inputs: dict) -> Any:
        """The kernel's result computed in NumPy from the plan, exactly as the kernel reads it."""


# Launch geometry: `steps`, or all of these for a family of one kernel.
SINGLE_KERNEL = ("KERNEL", "arguments", "launch")


class Family:
    """A registered family: the module's members, and a default for each optional hook it leaves out.

    Members beyond the contract (a family's constants, a driver's own helpers such as
    spdnn_sliced_ell's `launch(spec, plan, sms)`) are read from the module through this object.
    """

    def __init__(self, module: ModuleType):
        check_module(module)
        own = vars(module)
        self.module = module
        self.name: str = module.FAMILY
        self.ops: tuple = tuple(module.OPS)
        self.Spec: type = module.Spec
        self.format: ModuleType = module.FORMAT
        self.Options: type[FamilyOptions] = own.get("Options", FamilyOptions)  # the options it takes
        self.rules: tuple = tuple(own.get("RULES", ()))  # none: select/policy.py decides for it
        self.driver: str | None = own.get("DRIVER")  # the network driver its kernels run inside, if any
        for name in REQUIRED_CALLS + HOOKS:
            if name in own:
                setattr(self, name, own[name])

    def __getattr__(self, name: str):
        module = self.__dict__.get("module")
        if module is None:
            raise AttributeError(name)
        return getattr(module, name)

    def __repr__(self) -> str:
        return f"<kernel family {self.name}>"

    # ---- the hooks' defaults ------------------------------------------------------------------

    def steps(self, spec, plan) -> tuple:
        """The launches one call makes, in stream order: by default the family's one kernel."""
        m = self.module
        return (Step(m.KERNEL, tuple(m.arguments(spec)), m.launch(spec, plan)),)

    def emulate_operands(self, spec, plan) -> tuple:
        """The operands the NumPy emulator takes: by default the kernel's."""
        return self.operands(spec, plan)

    def encoding(self, spec) -> tuple | None:
        """The spec fields the encoding reads, when fewer than the whole request, so that one cached
        encoding serves every request that shares them; None: the encoding is the request's own."""
        return None

    def encode_format(self, csr, spec, bias=None):
        """The encoding alone (what `encoding(spec)` names): by default the whole plan."""
        return self.encode(csr, spec, bias)

    def specialize(self, plan, spec):
        """What a request adds to a shared encoding: by default nothing."""
        return plan

    def finalize(self, spec, plan, request) -> KernelSpec:
        """The spec with what only the encoded plan knows (trip counts, buffer sizes): by default as chosen."""
        return spec

    def tune_variants(self, request) -> list[dict]:
        """The options of each variant `tune=True` times: by default the family's own choice alone."""
        return [{}]

    def unavailable(self, request) -> str | None:
        """Why the family cannot run here (a missing library), or None: by default it always can."""
        return None


# The members FamilyModule lists, and for an error what each is.
REQUIRED_DATA = {"FAMILY": "its name", "OPS": "the ops it serves", "Spec": "its KernelSpec",
                 "FORMAT": "its format module"}
REQUIRED_CALLS = tuple(n for n, v in vars(FamilyModule).items() if inspect.isfunction(v) and not n.startswith("_"))
HOOKS = ("steps", "emulate_operands", "encoding", "encode_format", "specialize", "finalize", "tune_variants",
         "unavailable")
# How each callable member is called: its positional arguments.
ARITY = {"encode": 3, "operands": 2, "alignment": 1, "emulate": 3, "steps": 2, "arguments": 1, "launch": 2,
         "emulate_operands": 2, "encoding": 1, "encode_format": 3, "specialize": 2, "finalize": 3,
         "tune_variants": 1, "unavailable": 1}


def _describe(name: str) -> str:
    if name in REQUIRED_DATA:
        return f"{name} ({REQUIRED_DATA[name]})"
    fn = vars(FamilyModule)[name]
    params = list(inspect.signature(fn).parameters.values())[1:]  # without the protocol's self
    return f"{name}({', '.join(map(str, params))}): {inspect.getdoc(fn)}"


def check_module(module: ModuleType) -> None:
    """Raise TypeError naming every way `module` breaks the contract (see the module docstring)."""
    own = vars(module)
    where = f"kernel family {own.get('FAMILY', module.__name__)!r} ({module.__name__})"
    if not isinstance(module, FamilyModule):
        missing = [n for n in (*REQUIRED_DATA, *REQUIRED_CALLS) if n not in own]
        raise TypeError(f"{where} lacks " + "; ".join(_describe(n) for n in missing))
    problems = _kind_problems(module)
    if "steps" not in own and not all(n in own for n in SINGLE_KERNEL):
        problems.append("no launch geometry: define steps(spec, plan), or KERNEL, arguments(spec) and "
                        f"launch(spec, plan) (it lacks {', '.join(n for n in SINGLE_KERNEL if n not in own)})")
    shared = [n for n in ("encoding", "encode_format", "specialize") if n in own]
    if shared and len(shared) < 3:
        problems.append(f"defines {', '.join(shared)} but not all of encoding, encode_format and specialize "
                        "(a shared encoding needs the three)")
    problems += [p for p in (_call_problem(n, own[n]) for n in ARITY if n in own) if p]
    if problems:
        raise TypeError(f"{where}: " + "; ".join(problems))


def _kind_problems(module) -> list[str]:
    out = []
    if not isinstance(module.FAMILY, str) or not module.FAMILY:
        out.append(f"FAMILY must be a name, got {module.FAMILY!r}")
    if not (isinstance(module.OPS, tuple) and module.OPS and set(module.OPS) <= set(OPS)):
        out.append(f"OPS must be a tuple of {', '.join(OPS)}, got {module.OPS!r}")
    if not (isinstance(module.Spec, type) and issubclass(module.Spec, KernelSpec)):
        out.append(f"Spec must be a KernelSpec subclass, got {module.Spec!r}")
    elif module.Spec.family != module.FAMILY:
        out.append(f"Spec.family is {module.Spec.family!r}, not FAMILY {module.FAMILY!r}")
    if not isinstance(module.FORMAT, ModuleType):
        out.append(f"FORMAT must be a module of sparsegen/formats, got {module.FORMAT!r}")
    options = vars(module).get("Options", FamilyOptions)
    if not (isinstance(options, type) and issubclass(options, FamilyOptions)):
        out.append(f"Options must be a FamilyOptions dataclass, got {options!r}")
    for rule in vars(module).get("RULES", ()):
        if not isinstance(rule, Rule) or rule.family != module.FAMILY:
            out.append(f"rule {rule!r} is not the family's own")
    return out


def _call_problem(name: str, fn: Callable) -> str | None:
    if not callable(fn):
        return f"{name} must be callable, got {fn!r}"
    try:
        inspect.signature(fn).bind(*range(ARITY[name]))
    except TypeError as exc:
        return f"{name}{inspect.signature(fn)} cannot be called with {ARITY[name]} arguments ({exc})"
    except ValueError:  # a builtin without a signature: trusted
        return None
    return None


def register(module: ModuleType) -> Family:
    """The module as a registered family (`Family`), or TypeError naming what it lacks."""
    return Family(module)
