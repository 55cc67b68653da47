"""The family contract (sparsegen/families/contract.py): every registered family keeps it, a module
that breaks it is refused at registration with an error naming what is wrong, and the optional hooks
have defaults that callers can call unconditionally."""
from __future__ import annotations

import types

import pytest
import scipy.sparse as sp

from sparsegen.families import FAMILIES, ORDER, contract, csr_rowsplit, dense_gemm, spdnn_sliced_ell
from sparsegen.families.base import Request, Step
from sparsegen.families.options import FamilyOptions
from sparsegen.select import RULES


@pytest.mark.parametrize("fam", ORDER, ids=lambda f: f.name)
def test_every_registered_family_keeps_the_contract(fam):
    assert isinstance(fam.module, contract.FamilyModule)
    assert isinstance(fam, contract.Family) and FAMILIES[fam.name] is fam
    assert fam.name == fam.module.FAMILY == fam.Spec.family and set(fam.ops) <= set(contract.OPS)
    assert issubclass(fam.Options, FamilyOptions) and fam.Options is vars(fam.module).get("Options", FamilyOptions)
    contract.check_module(fam.module)  # raises on any breach
    for hook in contract.REQUIRED_CALLS + contract.HOOKS:
        assert callable(getattr(fam, hook)), hook
    assert [r.family for r in RULES].count(fam.name) >= 1, "no rule of the selection table serves it"


def test_the_families_serve_every_op():
    assert {op for fam in ORDER for op in fam.ops} == set(contract.OPS)


def _module_like(source, drop=(), **replace) -> types.ModuleType:
    """A copy of a family module's namespace without `drop`, with `replace` set."""
    mod = types.ModuleType(f"fake_{source.__name__.rsplit('.', 1)[1]}")
    mod.__dict__.update({k: v for k, v in vars(source).items() if k not in drop and not k.startswith("__")})
    mod.__dict__.update(replace)
    return mod


def test_a_module_without_a_required_member_is_refused_naming_it():
    with pytest.raises(TypeError, match=r"kernel family 'csr_rowsplit' \(fake_csr_rowsplit\) lacks "
                                        r"emulate\(spec, plan, inputs: 'dict'\): The kernel's result"):
        contract.register(_module_like(csr_rowsplit, drop=("emulate",)))
    with pytest.raises(TypeError, match=r"lacks OPS \(the ops it serves\); FORMAT \(its format module\)"):
        contract.register(_module_like(csr_rowsplit, drop=("OPS", "FORMAT")))


def test_a_module_without_launch_geometry_is_refused():
    with pytest.raises(TypeError, match=r"no launch geometry: define steps\(spec, plan\), or KERNEL, "
                                        r"arguments\(spec\) and launch\(spec, plan\) \(it lacks launch\)"):
        contract.register(_module_like(csr_rowsplit, drop=("launch",)))


@pytest.mark.parametrize("replace, match", [
    ({"OPS": ("spmv",)}, r"OPS must be a tuple of spmm, sddmm, spdnn_layer, got \('spmv',\)"),
    ({"FAMILY": "other"}, r"Spec.family is 'csr_rowsplit', not FAMILY 'other'"),
    ({"Spec": dict}, r"Spec must be a KernelSpec subclass"),
    ({"finalize": lambda spec, plan: spec}, r"finalize\(spec, plan\) cannot be called with 3 arguments"),
    ({"alignment": 4}, r"alignment must be callable, got 4"),
    ({"Options": dict}, r"Options must be a FamilyOptions dataclass, got <class 'dict'>"),
    ({"encoding": lambda spec: ()}, r"defines encoding but not all of encoding, encode_format and specialize"),
    ({"RULES": spdnn_sliced_ell.RULES}, r"rule Rule\(name='spdnn_sliced_ell'.* is not the family's own"),
])
def test_a_module_breaking_the_contract_is_refused_saying_how(replace, match):
    with pytest.raises(TypeError, match=match):
        contract.register(_module_like(csr_rowsplit, **replace))


def test_hooks_a_family_leaves_out_have_defaults():
    fam = FAMILIES["csr_rowsplit"]
    request = Request("spmm", n=8)
    spec = fam.Spec("f32", 8, 4, 2, 1, 128)
    plan = fam.encode(sp.identity(4, format="csr", dtype="float32"), spec)
    (step,) = fam.steps(spec, plan)
    assert step == Step(csr_rowsplit.KERNEL, csr_rowsplit.arguments(spec), csr_rowsplit.launch(spec, plan))
    assert fam.emulate_operands(spec, plan) == fam.operands(spec, plan)
    assert fam.encoding(spec) is None and fam.specialize(plan, spec) is plan
    assert fam.finalize(spec, plan, request) is spec
    assert fam.tune_variants(request) == [{}] and fam.unavailable(request) is None
    assert fam.driver is None and fam.rules == csr_rowsplit.RULES
    assert FAMILIES["ell_coo_spmm"].Options is FamilyOptions and FamilyOptions.names() == ()


def test_hooks_a_family_defines_are_its_own():
    assert FAMILIES["spdnn_sliced_ell"].finalize is spdnn_sliced_ell.finalize
    assert FAMILIES["spdnn_sliced_ell"].driver == "sparsegen.SparseDNN"
    assert FAMILIES["dense_gemm"].steps is dense_gemm.steps and FAMILIES["dense_gemm"].rules == ()
    assert FAMILIES["dense_gemm"].EPILOGUE_KERNEL == dense_gemm.EPILOGUE_KERNEL  # other members: the module's
