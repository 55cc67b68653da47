"""Single-point mutants of one Python module, made with `ast` and applied as text edits.

Each mutant changes one node: the edit replaces that node's source segment (so comments, layout
and every other line stay as written), and is checked by re-parsing: the edited text must parse to
the original tree with exactly that one node changed, or the mutant is dropped.

Operators (`Mutant.op`):

    cmp     ordering relaxed or tightened (< <=, > >=); equality, identity, membership negated
    num     an integer constant +1 and -1 (a float constant +1.0)
    bool    True <-> False
    logic   and <-> or
    not     `not x` -> `x`; unary minus and ~ removed
    arith   + <-> -, * <-> //, / -> *, % -> //, << <-> >>, & <-> |, ^ -> |, ** -> * (also in +=, ...)
    minmax  max <-> min (builtins, NumPy functions and methods: maximum <-> minimum, argmax, ...)
    return  `return X` -> `return None`
    delete  a raise, an assert or a call statement -> `pass`

Two more operators run only where a module asks for them (`find(source, extra=...)`; modules.toml's
`operators`), for modules whose strings and loop jumps are behaviour rather than messages:

    string  a str or bytes constant -> the same with "XX" in front (a file name, a flag's spelling)
    jump    `continue` or `break` -> `pass`

Not mutated: docstrings, annotations, `__all__`, f-strings, `del` statements, the value of a `copy=`
keyword (it decides whether NumPy copies, never what the result holds), and other strings unless
`string` is asked for.
"""
from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
       ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
ARITH = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult,
         ast.Div: ast.Mult, ast.Mod: ast.FloorDiv, ast.LShift: ast.RShift, ast.RShift: ast.LShift,
         ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.BitXor: ast.BitOr, ast.Pow: ast.Mult}
MINMAX = {"max": "min", "min": "max", "maximum": "minimum", "minimum": "maximum", "amax": "amin",
          "amin": "amax", "argmax": "argmin", "argmin": "argmax", "fmax": "fmin", "fmin": "fmax",
          "nanmax": "nanmin", "nanmin": "nanmax"}


@dataclass(frozen=True)
class Mutant:
    """One mutant: where (1-based line, 0-based column), in which function, and the text edit."""

    index: int
    op: str
    function: str
    line: int
    col: int
    original: str  # the node's source, as written (first line when it spans several)
    mutated: str  # what replaces it
    start: int  # character offsets of the replaced segment in the module's source
    end: int
    nth: int = 0  # earlier mutants of the same function with the same original and mutated text

    @property
    def key(self) -> tuple[str, str, str, int]:
        """What identifies the mutant across edits elsewhere in the file (lines move, this does not)."""
        return (self.function, self.original, self.mutated, self.nth)

    def apply(self, source: str) -> str:
        return source[:self.start] + self.mutated + source[self.end:]

    def describe(self) -> str:
        return f"{self.line}:{self.col} {self.function} [{self.op}] {self.original!r} -> {self.mutated!r}"


def _offsets(source: str) -> list[int]:
    """Character offset of the start of each line (1-based lines: index 0 is unused)."""
    starts, pos = [0, 0], 0
    for line in source.splitlines(keepends=True):
        pos += len(line)
        starts.append(pos)
    return starts


def _segment_bounds(node, starts, encoded_lines) -> tuple[int, int]:
    # ast columns are UTF-8 byte offsets; convert to character offsets within the line.
    def char(lineno, byte_col):
        return starts[lineno] + len(encoded_lines[lineno - 1][:byte_col].decode("utf-8"))
    return char(node.lineno, node.col_offset), char(node.end_lineno, node.end_col_offset)


class _Finder(ast.NodeVisitor):
    """Walks the tree, keeping the enclosing function's qualified name, and lists candidate edits
    as (node path, op, builder) where builder(node_copy) returns the replacement node."""

    def __init__(self, extra=()):
        self.extra = frozenset(extra)
        self.scope: list[str] = []
        self.found: list[tuple[tuple, str, object]] = []
        self.path: list = []

    # -- traversal with a path of (field, index) steps, so the node can be found in a copy -------
    def walk(self, node):
        self.visit(node)

    def generic_visit(self, node):
        for field, value in ast.iter_fields(node):
            if field in ("annotation", "returns", "type_comment"):
                continue
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, ast.AST):
                        self._descend(item, (field, i))
            elif isinstance(value, ast.AST):
                self._descend(value, (field, None))

    def _descend(self, node, step):
        self.path.append(step)
        self.visit(node)
        self.path.pop()

    def _add(self, op, builder):
        self.found.append((tuple(self.path), op, builder, ".".join(self.scope) or "<module>"))

    # -- scopes ---------------------------------------------------------------------------------
    def _scoped(self, node):
        self.scope.append(node.name)
        for field, value in ast.iter_fields(node):
            if field in ("returns", "type_comment"):
                continue
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if field == "body" and i == 0 and _is_docstring(item):
                        continue
                    if isinstance(item, ast.AST):
                        self._descend(item, (field, i))
            elif isinstance(value, ast.AST):
                self._descend(value, (field, None))
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Module(self, node):
        for i, item in enumerate(node.body):
            if i == 0 and _is_docstring(item):
                continue
            if isinstance(item, ast.ImportFrom) and item.module == "__future__":
                continue
            if isinstance(item, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                    for t in item.targets):
                continue
            self._descend(item, ("body", i))

    # -- leaves that are never mutated ----------------------------------------------------------
    def visit_JoinedStr(self, node):
        return

    def visit_Delete(self, node):
        return

    def visit_arg(self, node):
        return  # only its annotation lives below it

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self._descend(node.value, ("value", None))

    # -- operators ------------------------------------------------------------------------------
    def visit_Compare(self, node):
        for i, op in enumerate(node.ops):
            if type(op) in CMP:
                def build(n, i=i):
                    n.ops[i] = CMP[type(n.ops[i])]()
                    return n
                self._add("cmp", build)
        self.generic_visit(node)

    def visit_BinOp(self, node):
        if type(node.op) in ARITH:
            def build(n):
                n.op = ARITH[type(n.op)]()
                return n
            self._add("arith", build)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        if type(node.op) in ARITH:
            def build(n):
                n.op = ARITH[type(n.op)]()
                return n
            self._add("arith", build)
        self.generic_visit(node)

    def visit_BoolOp(self, node):
        def build(n):
            n.op = ast.Or() if isinstance(n.op, ast.And) else ast.And()
            return n
        self._add("logic", build)
        self.generic_visit(node)

    def visit_UnaryOp(self, node):
        if isinstance(node.op, (ast.Not, ast.USub, ast.Invert)):
            self._add("not", lambda n: n.operand)
        self.generic_visit(node)

    def visit_Constant(self, node):
        v = node.value
        if isinstance(v, bool):
            self._add("bool", lambda n: ast.Constant(not n.value))
        elif isinstance(v, int):
            for d in (1, -1):
                self._add("num", lambda n, d=d: ast.Constant(n.value + d))
        elif isinstance(v, float):
            self._add("num", lambda n: ast.Constant(n.value + 1.0))
        elif isinstance(v, (str, bytes)) and "string" in self.extra:
            self._add("string", lambda n: ast.Constant(("XX" if isinstance(n.value, str) else b"XX") + n.value))

    def visit_keyword(self, node):
        if node.arg == "copy":
            return
        self.generic_visit(node)

    def visit_Call(self, node):
        f = node.func
        if isinstance(f, ast.Name) and f.id in MINMAX:
            self._descend_edit(("func", None), "minmax", lambda n: ast.Name(MINMAX[n.id], ast.Load()))
        elif isinstance(f, ast.Attribute) and f.attr in MINMAX:
            self._descend_edit(("func", None), "minmax",
                               lambda n: ast.Attribute(n.value, MINMAX[n.attr], ast.Load()))
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) and f.value.attr in MINMAX:
            # np.maximum.at / np.maximum.accumulate / np.maximum.reduceat
            self.path.append(("func", None))
            self._descend_edit(("value", None), "minmax",
                               lambda n: ast.Attribute(n.value, MINMAX[n.attr], ast.Load()))
            self.path.pop()
        self.generic_visit(node)

    def _descend_edit(self, step, op, builder):
        self.path.append(step)
        self._add(op, builder)
        self.path.pop()

    def visit_Return(self, node):
        if node.value is not None and not (isinstance(node.value, ast.Constant) and node.value.value is None):
            def build(n):
                n.value = ast.Constant(None)
                return n
            self._add("return", build)
        self.generic_visit(node)

    def _deletable(self, node):
        self._add("delete", lambda n: ast.Pass())
        self.generic_visit(node)

    visit_Raise = visit_Assert = _deletable

    def _jump(self, node):
        if "jump" in self.extra:
            self._add("jump", lambda n: ast.Pass())

    visit_Continue = visit_Break = _jump

    def visit_Expr(self, node):
        if isinstance(node.value, ast.Call):
            self._add("delete", lambda n: ast.Pass())
        self.generic_visit(node)


def _is_docstring(node) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _get(tree, path):
    node = tree
    for field, i in path:
        node = getattr(node, field) if i is None else getattr(node, field)[i]
    return node


def _set(tree, path, new):
    parent = _get(tree, path[:-1])
    field, i = path[-1]
    if i is None:
        setattr(parent, field, new)
    else:
        getattr(parent, field)[i] = new


def _dump(tree) -> str:
    return ast.dump(tree, include_attributes=False)


def _text(node, source, starts, enc, new) -> str:
    """Source of the replacement: statements as written by `ast.unparse`, expressions in
    parentheses (so precedence is never changed by the edit)."""
    body = ast.unparse(new)
    if isinstance(new, ast.stmt) or isinstance(node, ast.stmt):
        return body
    if isinstance(new, (ast.Name, ast.Attribute)) and isinstance(node, (ast.Name, ast.Attribute)):
        return body
    return f"({body})"


EXTRA = ("string", "jump")


def find(source: str, extra=()) -> list[Mutant]:
    """Every single-point mutant of `source`, in source order; `extra` adds operators of EXTRA."""
    unknown = set(extra) - set(EXTRA)
    if unknown:
        raise ValueError(f"unknown extra operators {sorted(unknown)}; known: {EXTRA}")
    tree = ast.parse(source)
    finder = _Finder(extra)
    finder.walk(tree)
    starts = _offsets(source)
    enc = [line.encode("utf-8") for line in source.splitlines()]
    original_dump = _dump(tree)
    out, seen = [], set()
    for path, op, builder, function in finder.found:
        node = _get(tree, path)
        work = copy.deepcopy(tree)
        new = builder(copy.deepcopy(_get(work, path)))
        _set(work, path, new)
        expected = _dump(work)
        if expected == original_dump:
            continue
        start, end = _segment_bounds(node, starts, enc)
        text = _text(node, source, starts, enc, new)
        edited = source[:start] + text + source[end:]
        try:
            ok = _dump(ast.parse(edited)) == expected
        except SyntaxError:
            ok = False
        if not ok or (start, end, text) in seen:
            continue
        seen.add((start, end, text))
        original = source[start:end].splitlines()[0] if source[start:end] else ""
        line_text = original if len(original) <= 120 else original[:117] + "..."
        out.append(Mutant(len(out), op, function, node.lineno, node.col_offset, line_text, text, start, end))
    out.sort(key=lambda m: (m.start, m.end, m.op, m.mutated))
    final, count = [], {}
    for i, m in enumerate(out):
        nth = count.get((m.function, m.original, m.mutated), 0)
        count[(m.function, m.original, m.mutated)] = nth + 1
        final.append(Mutant(i, m.op, m.function, m.line, m.col, m.original, m.mutated, m.start, m.end, nth))
    return final
