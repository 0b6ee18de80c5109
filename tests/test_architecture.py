"""The package layout as rules: the import graph has no cycle (type-only imports counted),
imports inside functions are few and each says why, the command line sits on top, a
flavor's name is known to one module, and the compiled loop's workers load no pandas.
Pure Python: reads the sources, and imports the workers' modules in a subprocess."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from support import PROJECT

PACKAGE = PROJECT / "retrysim"
# Deferred imports allowed inside functions: heavy dependencies only (Plotly; numba,
# which only executors that run the compiled loop and a check from staged files need;
# pyarrow's Parquet reader, which reading a scenario needs only for a Parquet traffic file,
# kept out of spark-submit.sh's check of a job's input before the JVM starts), at
# most DEFERRED_AT_MOST import lines, each with its reason in a comment on the line.
DEFERRED = {"retrysim.reporting.plots", "retrysim.engine.event_rows", "retrysim.engine.event_rules",
            "retrysim.checks.file_passes",
            "retrysim.checks.spark_hash",
            "pyarrow.parquet"}  # fmt: skip
DEFERRED_AT_MOST = 8
FLAVOR_NAMES = (
    "rocketmq4.concurrently",
    "rocketmq4.orderly",
    "rocketmq4.broadcasting",
    "http.unordered",
    "http.ordered",
    "rocketmq5.push",
    "rocketmq5.simple",
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(child) for child in ast.walk(node)}
    return skipped


def imports(module: str, type_only: bool = True) -> list[tuple[str, bool]]:
    """(imported retrysim module, inside a function?) for every import of the module, those
    under ``if TYPE_CHECKING`` too unless ``type_only`` is false: a cycle through a type
    is a cycle of the design, though Python never runs it."""
    tree = ast.parse(MODULES[module].read_text())
    skipped = set() if type_only else _type_checking_nodes(tree)
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if id(child) in skipped:
                continue
            if isinstance(child, ast.ImportFrom) and (child.module or "").startswith("retrysim"):
                for alias in child.names:
                    full = f"{child.module}.{alias.name}"
                    found.append((full if full in MODULES else child.module, inner))
            elif isinstance(child, ast.Import):
                found.extend((a.name, inner) for a in child.names if a.name.startswith("retrysim"))
            visit(child, inner)

    visit(tree, False)
    return found


def graph() -> dict[str, set[str]]:
    return {module: {target for target, _ in imports(module)} for module in MODULES}


def test_every_import_names_a_module_that_exists():
    missing = {(m, t) for m, targets in graph().items() for t in targets if t not in MODULES}
    assert not missing


def test_the_import_graph_has_no_cycle():
    edges = graph()
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                cycle = [*path[path.index(target) :], target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module)


def _deferred_lines() -> list[tuple[str, int, str]]:
    """(module, line number, line) of each import of a retrysim module inside a function."""
    found = []
    for module, path in MODULES.items():
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                if any(name.startswith("retrysim") for name in names):
                    found.append((module, node.lineno, lines[node.lineno - 1]))
    return sorted(set(found))


def test_imports_inside_functions_only_defer_heavy_dependencies_and_say_why():
    deferred = {
        (module, target)
        for module in MODULES
        for target, inner in imports(module, type_only=False)
        if inner and target not in DEFERRED
    }
    assert not deferred
    lines = _deferred_lines()
    assert 0 < len(lines) <= DEFERRED_AT_MOST, lines
    assert [line for line in lines if "#" not in line[2]] == []


@pytest.mark.parametrize(
    "module", sorted(m for m in MODULES if not m.startswith(("retrysim.cli", "retrysim.__main__")))
)
def test_the_library_never_reaches_up_into_the_command_line(module):
    source = MODULES[module].read_text()
    assert not any(t.startswith("retrysim.cli") for t, _ in imports(module))
    assert "import argparse" not in source


def test_only_the_flavor_catalogue_names_a_flavor():
    named = {
        module
        for module, path in MODULES.items()
        if any(f'"{name}"' in path.read_text() for name in FLAVOR_NAMES)
    }
    assert named == {"retrysim.model.flavors"}


def test_the_compiled_loops_workers_never_load_pandas():
    """A Python worker of the event-by-event stage unpickles the stage's function, which
    imports these modules: pandas (about 0.3 s a worker at the stage's start) stays out."""
    code = (
        "import sys, retrysim.engine.event_stage, retrysim.engine.event_rows, "
        "retrysim.tables.key_peaks, retrysim.tables.message_tables, retrysim.model.workload; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas'))"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert found.strip() == "[]"


LARGEST_FILE_LINES = 1_100
LONGEST_FUNCTION_LINES = 150
# The compiled loops' turns: numba counts a reference on every array a helper takes or
# returns, so their hot paths stay in one function (retrysim.engine.event_loop says more).
LONG_LOOPS = {
    ("retrysim.engine.event_loop", "_turns"),
    ("retrysim.engine.event_lanes", "_run_lanes"),
}


def test_no_library_file_is_larger_than_a_reader_can_hold():
    sizes = {module: len(path.read_text().splitlines()) for module, path in MODULES.items()}
    assert max(sizes.values()) <= LARGEST_FILE_LINES, max(sizes, key=sizes.get)


def test_no_function_is_longer_than_a_reader_can_hold_but_the_compiled_loops():
    long = set()
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            if function and node.end_lineno - node.lineno + 1 > LONGEST_FUNCTION_LINES:
                long.add((module, node.name))
    assert long == LONG_LOOPS


def _bound_at_top(tree: ast.Module) -> list[str]:
    """The names a module's own top-level assignments bind, once per binding."""
    names = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets if isinstance(node, (ast.Assign, ast.AnnAssign)) else []:
            elements = target.elts if isinstance(target, ast.Tuple) else [target]
            names += [element.id for element in elements if isinstance(element, ast.Name)]
    return names


def test_no_module_binds_a_constant_twice():
    """A compiled function reads a global's last binding: a second constant under one name
    (an index into a state array beside a key's span) silently changes the first's users."""
    twice = set()
    for module, path in MODULES.items():
        names = _bound_at_top(ast.parse(path.read_text()))
        twice |= {(module, name) for name in names if names.count(name) > 1}
    assert twice == set()


def test_one_event_by_event_loop_the_compiled_one():
    """No event loop in Python remains: nothing in the library keeps a heap of events (the
    level fit's heap holds the costs of merging neighbouring pieces, not events)."""
    heaps = [module for module, path in MODULES.items() if "heapq" in path.read_text()]
    assert heaps == ["retrysim.metrics.fitting"]


def test_the_architecture_docs_map_names_every_module_and_no_other():
    """docs/architecture.md's map of the package (a line per top-level module, a line or two
    per folder listing its modules) against the modules on disk."""
    text = (PROJECT / "docs" / "architecture.md").read_text()
    block = text[text.index("\nretrysim/\n") + len("\nretrysim/\n") :]
    block = block[: block.index("```")]
    listed: dict[str, set[str]] = {"": set()}
    folder = None
    for line in block.splitlines():
        start = line[:17].strip()
        if start.endswith("/"):
            folder = start[:-1]
            listed[folder] = set()
        elif start.endswith(".py"):
            folder = None
            listed[""].add(start[:-3])
            continue
        if folder is not None:
            listed[folder] |= {name.strip() for name in line[17:].split(",") if name.strip()}
    on_disk: dict[str, set[str]] = {"": {path.stem for path in PACKAGE.glob("*.py")}}
    for path in PACKAGE.glob("*/*.py"):
        on_disk.setdefault(path.parent.name, set())
        if path.stem != "__init__":
            on_disk[path.parent.name].add(path.stem)
    assert listed == on_disk


def test_the_command_line_starts_without_numba():
    """Every command's driver imports retrysim.cli.main: numba (a second of imports and the
    cache's digest) stays on the executors and in the few paths that run compiled code."""
    code = "import sys, retrysim.cli.main; print('numba' in sys.modules)"
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert found.strip() == "False"
