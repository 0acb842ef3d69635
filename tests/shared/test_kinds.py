"""A model kind lives in its part (pipeline/plan/parts/): every other module iterates a shape's parts or asks the
family's record, and none branches on which kinds a model has or compares an architecture or tower-design name
(test_formats.py keeps format names out the same way)."""

import ast
from pathlib import Path

import pipeline
from pipeline.families import known
from pipeline.families.visual import INTERNVL3_TOWER, QWEN2_5_VL_TOWER, QWEN3_VL_TOWER
from pipeline.plan.parts import PARTS

ROOT = Path(pipeline.__file__).parent
# a shape's parts by kind, and a family's kind layouts: what "which kinds has this model" is asked through
SHAPE_KINDS = {"hybrid", "experts", "tower", "geometry", "per_layer_inputs", "moe"}
FAMILY_KINDS = {"visual", "layers", "hybrid", "moe"}
FAMILY_NAMES = {"fam", "family"}        # what the code calls a Family record (families/__init__.py family())
PART_CLASSES = {k.__name__ for k in PARTS}
NAMES = set(known()) | {d.name for d in (QWEN2_5_VL_TOWER, QWEN3_VL_TOWER, INTERNVL3_TOWER)}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)


# the kinds' own modules: the parts' package, the family records, and what each part names as its own elsewhere
KIND_MODULES = {module_name(p) for p in (ROOT / "plan" / "parts").glob("*.py")} \
    | {module_name(p) for p in (ROOT / "families").glob("*.py")} \
    | {m for kind in PARTS for m in kind.modules}


def _asks_a_kind(node: ast.AST) -> str | None:
    """What in an expression asks which kinds a model has, if anything."""
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute):
            owner = n.value
            on_family = isinstance(owner, ast.Name) and owner.id in FAMILY_NAMES or \
                isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "family"
            if n.attr in SHAPE_KINDS or on_family and n.attr in FAMILY_KINDS:
                return ast.unparse(n)
            if n.attr == "part":
                return ast.unparse(n)
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "isinstance" and len(n.args) == 2:
            classes = n.args[1].elts if isinstance(n.args[1], ast.Tuple) else [n.args[1]]
            if any(getattr(c, "id", getattr(c, "attr", None)) in PART_CLASSES for c in classes):
                return ast.unparse(n)
    return None


def kind_branches(tree: ast.AST) -> list[tuple[int, str]]:
    """Tests of if/elif, conditional expressions, while, assert, boolean operands and comprehension filters that ask
    which kinds a model has; and comparisons with, tables keyed by and lookups by an architecture or tower-design
    name."""
    hits = []
    for node in ast.walk(tree):
        tests: list[ast.AST] = []
        if isinstance(node, (ast.If, ast.IfExp, ast.While, ast.Assert)):
            tests.append(node.test)
        elif isinstance(node, ast.BoolOp):
            tests += node.values
        elif isinstance(node, ast.comprehension):
            tests += node.ifs
        for t in tests:
            what = _asks_a_kind(t)
            if what:
                hits.append((t.lineno, f"branches on {what}"))
        hits += [(line, what) for line, what in name_uses(node)]
    return sorted(set(hits))


def _names_in(node) -> list[str]:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [i.value for i in items if isinstance(i, ast.Constant) and i.value in NAMES]


def name_uses(node: ast.AST) -> list[tuple[int, str]]:
    if isinstance(node, ast.Compare):
        return [(node.lineno, f"compares with {n!r}") for side in [node.left, *node.comparators]
                for n in _names_in(side)]
    if isinstance(node, ast.Dict):
        return [(node.lineno, f"a table keyed by {n!r}") for k in node.keys if k is not None for n in _names_in(k)]
    if isinstance(node, ast.Subscript):
        return [(node.lineno, f"looks up {n!r}") for n in _names_in(node.slice)]
    return []


def test_no_module_outside_a_kinds_part_branches_on_a_kind_or_compares_its_names():
    hits = [f"{p.relative_to(ROOT)}:{line}: {what}" for p in sorted(ROOT.rglob("*.py"))
            if module_name(p) not in KIND_MODULES for line, what in kind_branches(ast.parse(p.read_text()))]
    assert hits == []


def test_every_module_a_part_names_as_its_own_exists():
    modules = {module_name(p) for p in ROOT.rglob("*.py")}
    assert {m for kind in PARTS for m in kind.modules} <= modules


def test_the_check_finds_what_it_looks_for():
    """Each way a kind branch drifts back in is caught (so an empty result above means something)."""
    code = ("if shape.hybrid is not None: pass\n"
            "x = a if req.shape.experts else b\n"
            "assert shape.tower is not None\n"
            "if fam is not None and fam.visual is not None: pass\n"
            "ok = [p for p in ps if isinstance(p, Experts)]\n"
            "while family(a).layers: pass\n"
            "if design == 'qwen2_5_vl': pass\n"
            "T = {'Qwen2ForCausalLM': 1}\n"
            "y = DESIGNS['internvl']\n"
            "if shape.part(Hybrid): pass\n"
            "if plan.visual is not None and fam.tool_calls: pass\n"       # the plan's record, a family field: fine
            "z = shape.layers[0].rows\n")                                 # not a test: fine
    assert [line for line, _ in kind_branches(ast.parse(code))] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
