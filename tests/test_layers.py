"""The package's folders are its layers: each imports only the layers below it, and no module imports itself back
(docs/layout.md, "The package's layout"). Read from the source, lazy imports included: an upward arrow fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import af1

SRC = Path(af1.__file__).parent
# top to bottom; a module imports only modules of its own layer or of a layer with a larger rank
RANK = {
    "cli": 0,
    "api": 0,
    "study": 1,
    "experiments": 2,
    "report": 3,  # reads the methods' parts
    "methods": 4,
    "executors": 5,
    "interventions": 6,
    "tasks": 7,
    "models": 8,
}
LEAF = 9  # stats, claims, results, progress, errors, shapes, config_files


def module_name(path: Path) -> str:
    return ".".join(("af1", *path.relative_to(SRC).with_suffix("").parts)).removesuffix(".__init__")


def rank(module: str) -> int | None:
    parts = module.split(".")
    return None if parts[0] != "af1" or len(parts) == 1 else RANK.get(parts[1], LEAF)


def is_module(name: str) -> bool:
    where = SRC.joinpath(*name.split(".")[1:])
    return where.with_suffix(".py").exists() or (where / "__init__.py").exists()


def imports(path: Path) -> set[str]:
    """Every af1 module `path` imports, at the top or inside a function (`from af1 import x` names af1.x)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("af1"):
            for a in node.names:  # `from af1.experiments import base` imports the submodule, not the package
                sub = f"{node.module}.{a.name}"
                out.add(sub if is_module(sub) else node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("af1.")}
    return out


GRAPH = {module_name(p): imports(p) for p in sorted(SRC.rglob("*.py"))}


def test_every_module_imports_only_its_own_layer_or_those_below():
    upward = [
        f"{m} -> {n}"
        for m, targets in GRAPH.items()
        for n in targets
        if rank(m) is not None and rank(n) is not None and rank(n) < rank(m)  # type: ignore[operator]
    ]
    assert upward == []


def test_no_module_imports_from_the_package_root():
    """The root only re-exports: a module that reads a name from `af1` itself runs back up every layer."""
    assert sorted(m for m, targets in GRAPH.items() if m != "af1" and "af1" in targets) == []


def test_no_module_imports_itself_back():
    """No circle of imports between af1's modules (the package root, which only re-exports, left out)."""
    modules = {m: {n for n in targets if n in GRAPH and n != "af1"} for m, targets in GRAPH.items() if m != "af1"}
    circles = []
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(modules.get(m, ())):
            if state.get(n) == 1:
                circles.append(" -> ".join([*path[path.index(n) :], n]))
            elif n not in state:
                visit(n, [*path, n])
        state[m] = 2

    for m in sorted(modules):
        if m not in state:
            visit(m, [m])
    assert circles == []


def test_the_layers_are_the_folders():
    """Every module sits in a layer folder, except the faces and a few small leaves every layer may use."""
    loose = sorted(p.stem for p in SRC.glob("*.py") if p.stem != "__init__")
    assert loose == [
        "api",
        "claims",
        "cli",
        "config_files",
        "errors",
        "progress",
        "results",
        "shapes",
        "stats",
        "threads",
    ]
    assert sorted(p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()) == sorted(
        k for k, v in RANK.items() if k not in ("cli", "api")
    )


def test_family_quirks_are_read_only_by_the_model_layer():
    """A family's quirk columns (how its layers behave, `Family` fields after the module paths) are read in
    `models/` only: the methods and executors ask the adapter, so a new quirk is a column, its rows' values and
    the adapter's question (docs/layout.md, "Adding a family quirk")."""
    import dataclasses
    import re

    from af1.models.families import Family

    paths = {"name", "model_types", "layers", "final_norm", "lm_head", "attention", "o_proj", "mlp"}
    quirks = [f.name for f in dataclasses.fields(Family) if f.name not in paths] + ["rope"]
    pattern = re.compile(r"family\.(" + "|".join(quirks) + r")\b")
    readers = sorted(
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if p.relative_to(SRC).parts[0] != "models" and pattern.search(p.read_text())
    )
    assert readers == []
    assert len(quirks) >= 8  # the columns this test guards exist


def test_a_family_fact_is_applied_in_one_place():
    """Final-logit soft-capping (Gemma-2) is read from the config in the model adapter alone, and the CAMA mean is
    worked out by the position means alone: every other module asks them."""
    for fact, home in (
        ("final_logit_softcapping", "af1.models.adapter"),
        ("counts_TS.clamp", "af1.interventions.means"),
    ):
        readers = sorted(module_name(p) for p in SRC.rglob("*.py") if fact in p.read_text())
        assert readers == [home], (fact, readers)


LAYOUT = SRC.parents[1] / "docs" / "layout.md"
LOOSE = "af1/*.py"  # the faces and the leaves, the modules outside the folders


def budgets() -> dict[str, int]:
    """The lines each folder may hold, as docs/layout.md's budget table states them (declared there once)."""
    rows = re.findall(r"^\| `([^`]+)` \| ([\d,]+) \|$", LAYOUT.read_text(), re.M)
    return {name.rstrip("/"): int(lines.replace(",", "")) for name, lines in rows}


def test_each_folder_stays_within_its_budget():
    """Every folder of the package (and the loose modules together) holds at most the lines its budget allows,
    and every folder has one."""
    allowed = budgets()
    held = {LOOSE: sum(len(p.read_text().splitlines()) for p in SRC.glob("*.py"))}
    for folder in (p for p in SRC.iterdir() if (p / "__init__.py").exists()):
        held[folder.name] = sum(len(p.read_text().splitlines()) for p in folder.rglob("*.py"))
    assert set(allowed) == set(held), (sorted(allowed), sorted(held))
    over = {name: (lines, allowed[name]) for name, lines in held.items() if lines > allowed[name]}
    assert not over, over


def is_command(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A typer command, whose options are its parameters (typer reads them from the signature)."""
    return any(isinstance(d, ast.Call) and ast.unparse(d.func) == "app.command" for d in node.decorator_list)


def test_every_function_is_small():
    """Every function of the package under 80 lines and 8 parameters (a command's options excepted: they are its
    parameters), so that each reads at a glance and a long signature becomes a value."""
    too_big = []
    for path in sorted(SRC.rglob("*.py")):
        name = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                n_params = len(a.posonlyargs + a.args + a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
                n_lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if n_lines > 80 or (n_params > 8 and not is_command(node)):
                    too_big.append(f"{name}::{node.name}: {n_lines} lines, {n_params} parameters")
    assert not too_big, too_big


def test_every_docstring_says_what_and_why_in_two_lines():
    """No docstring of the package runs past two lines (a module's usage example, indented, aside): what and why, the
    rest is docs/methods.md's and the code's."""
    long = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
                first = node.body[0]
                if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)):
                    continue
                text = first.value.value
                if not isinstance(text, str) or first.end_lineno is None:
                    continue
                example = isinstance(node, ast.Module) and "\n    " in text
                if first.end_lineno - first.lineno > 1 and not example:
                    long.append(f"{path.relative_to(SRC).as_posix()}:{first.lineno}")
    assert not long, long
