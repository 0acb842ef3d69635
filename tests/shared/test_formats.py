"""The quantization-format axis lives in one registry (pipeline/formats.py): every module asks a format's record
and none compares a format name or keeps a table keyed by one (that drift made a format the CLI offered crash)."""

import ast
from pathlib import Path

from pipeline import formats

ROOT = Path(formats.__file__).parent
NAMES = set(formats.WEIGHT_FORMATS) | set(formats.KV_FORMATS) | set(formats.ROW_PRECISIONS)


def _names_in(node) -> list[str]:
    """Format names a node spells as string constants, itself or as the elements of a tuple, list or set."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [i.value for i in items if isinstance(i, ast.Constant) and i.value in NAMES]


def format_name_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """Comparisons with a format name, tables keyed by one, and lookups by one."""
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                hits += [(node.lineno, f"compares with {n!r}") for n in _names_in(side)]
        elif isinstance(node, ast.Dict):       # keyed by a name, or by a tuple holding one
            hits += [(node.lineno, f"a table keyed by {n!r}") for k in node.keys if k is not None
                     for n in _names_in(k)]
        elif isinstance(node, ast.Subscript):
            hits += [(node.lineno, f"looks up {n!r}") for n in _names_in(node.slice)]
    return hits


def test_no_module_outside_the_registry_branches_on_a_format_name():
    hits = [f"{p.relative_to(ROOT)}:{line}: {what}" for p in sorted(ROOT.rglob("*.py")) if p != Path(formats.__file__)
            for line, what in format_name_uses(ast.parse(p.read_text()))]
    assert hits == []


def test_the_check_finds_what_it_looks_for():
    """The scan catches each way a format name drifts back in (so an empty result above means something)."""
    code = ('if w == "int4_awq": pass\nif kv != "fp16": pass\nif w in ("int4_awq", "w4a8_awq"): pass\n'
            'T = {"int8_wo": 1}\nx = T["nvfp4"]\nok = w.name == weights\nP = {("int4_awq", "fp8"): "why"}\n'
            'y = P[("fp8", "x")]\n')
    assert [line for line, _ in format_name_uses(ast.parse(code))] == [1, 2, 3, 3, 4, 5, 7, 7, 8]


def test_every_record_answers_what_its_callers_ask():
    for f in formats.WEIGHT_FORMATS.values():
        assert f.unquantized == (f.bits == 16) and f.needs_calibration == (f.modelopt_config is not None)
        assert f.takes_group_size == (f.default_group_size is not None and f.fixed_group_size is None)
        assert f.decode_class in formats.ROW_PRECISIONS and (f.min_sm < 8.9 or f.hardware)
        assert f.calibration_config is not None or f.unquantized or f.checkpoint_only
    for r in formats.ROW_PRECISIONS.values():
        assert r.weight_format in formats.WEIGHT_FORMATS and "tensorrt" in r.bits
    assert formats.DEFAULT_KV.unquantized and formats.UNQUANTIZED.unquantized and formats.SMALLEST.bits == 4
    assert formats.quantized_formats_for(8.7) == ["int4_awq", "int8_sq", "int8_wo"]
    assert formats.kv_formats_for(8.7) == ["fp16", "int8"] and formats.kv_formats_for(11.0)[-1] == "fp8"
    assert formats.row_precision("W4A16 (AWQ)").name == "int4" and formats.row_precision("bf16") is None
