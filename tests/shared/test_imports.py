"""The package's import graph has no cycle, between modules or between subpackages, and no import goes back up the
layers below, counting every import: those inside functions (deferring an import hides a cycle from Python, not from
the design) and those under `if TYPE_CHECKING:` (an annotation that names a module above is a dependency on it)."""

import ast
from pathlib import Path

import pipeline

ROOT = Path(pipeline.__file__).parent


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports_of(name: str) -> set[str]:
    """The pipeline modules `name` imports (a package import counts as its __init__; `from pkg import mod` as mod)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return {m for m in imports_in(ast.parse(path.read_text()), package) if m != name}


def imports_in(tree: ast.AST, package: str) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                out.add(full if full in MODULES else base)
    return {m for m in out if m in MODULES}


def subpackage(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "pipeline"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None
    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


# The subpackages (and top-level modules) from the bottom up: each imports only from layers below its own. One line
# each: utilities; the records every half reads (and the builtin recordings, made with audio.py); the model
# families; the quantization formats; the engine backends' registry; the planner, the kit and the runtimes; the
# registry transport and the device half; the builders, the server and the workstation; recipes; a board's set of
# recipes; the doit graph; the entry points.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("pipeline", "errors", "tomlcompat", "resampling"),
    ("files", "texts", "settings", "progress", "images", "audio", "transcripts", "cliargs"),
    ("contract", "recordings"),
    ("families",),
    ("formats",),
    ("backends",),
    ("plan", "kit", "runtime"),
    ("oci", "device"),
    ("builders", "serve", "workstation", "fleet"),
    ("recipe",),
    ("boards",),
    ("graph",),
    ("perf", "plan_cli"),
    ("cli",),
    ("__main__",),
)
LAYER = {name: n for n, names in enumerate(LAYERS) for name in names}


def test_no_import_goes_up_the_layers():
    assert set(LAYER) == {subpackage(m) for m in MODULES}, "place every subpackage in LAYERS"
    up = [f"{m} -> {i}" for m in MODULES for i in imports_of(m)
          if subpackage(i) != subpackage(m) and LAYER[subpackage(i)] >= LAYER[subpackage(m)]]
    assert up == []


def test_type_only_imports_count():
    """An import under `if TYPE_CHECKING:` (or inside a function) is an edge of the graph: formats sat in plan/ and
    backends imported it for annotations, an arrow back up that a graph without it did not show."""
    code = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pipeline.plan.planner import PlanRequest\n"
            "def f():\n    from pipeline.graph import stages\n")
    assert imports_in(ast.parse(code), "pipeline.backends") == {"pipeline.plan.planner", "pipeline.graph.stages"}


def test_no_module_import_cycle():
    graph = {m: imports_of(m) for m in MODULES}
    assert find_cycle(graph) is None


def test_no_subpackage_import_cycle():
    graph: dict[str, set[str]] = {}
    for m in MODULES:
        graph.setdefault(subpackage(m), set()).update(subpackage(i) for i in imports_of(m) if subpackage(i) !=
                                                      subpackage(m))
    assert find_cycle(graph) is None


def test_the_stage_framework_knows_no_recipe():
    recipe = {m for m in MODULES if m == "pipeline.recipe" or m.startswith("pipeline.recipe.")}
    assert "pipeline.recipe.schema" in recipe or len(recipe) > 1      # the package this test is about exists
    assert not recipe & imports_of("pipeline.graph.framework")
    assert "pipeline.graph.framework" in MODULES


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert "pipeline.contract" in imports_of("pipeline.device.driver")        # `from pipeline import contract`
    assert "pipeline.formats" in imports_of("pipeline.plan.planner")


def test_environment_variables_are_read_in_the_settings_module_only():
    """Every variable the package reads is listed (and documented) in pipeline/settings.py; the CLI's --help and
    the README name them from there."""
    from pipeline import settings
    passed_through = {"PYTHONPATH"}       # handed on to a child process, not a setting
    hits = []
    for name, path in MODULES.items():
        if name == "pipeline.settings":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv") or \
                    isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
                arg = node.args[0] if isinstance(node, ast.Call) else node.slice
                if not (isinstance(arg, ast.Constant) and arg.value in passed_through):
                    hits.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert hits == []
    assert all(v for v in settings.ENV.values()) and "PIPELINE_ARTIFACTS" in settings.help_text()


def test_the_server_sits_below_the_build_graph():
    """serve/ (what runs on the board too) imports neither the graph nor the workstation half; the graph hands it a
    recipe's reference source (graph/reference.py)."""
    up = [f"{m} -> {i}" for m in MODULES if subpackage(m) == "serve" for i in imports_of(m)
          if subpackage(i) in ("graph", "workstation")]
    assert up == []
    assert "pipeline.serve.sources" in imports_of("pipeline.graph.reference")


def test_the_tests_import_conftest_under_the_one_name_pytest_gives_it():
    """pytest loads tests/conftest.py as `conftest`; `tests.conftest` would be a second copy of the module with its
    own globals (fixtures' caches, registries started twice)."""
    tests = Path(__file__).parents[1]
    twice = [p.name for p in sorted(tests.rglob("*.py")) if "tests.conftest" in p.read_text()
             and p.name != Path(__file__).name]
    assert twice == []
