"""numba's disk cache (retrysim.numba_cache): a module's compiled code is found again under
the digest of its source and its imports' sources, and compiled anew when a module it imports
changes, where numba's own key (the file's path and time) would run stale code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
from support import PROJECT

from retrysim.numba_cache import source_digest

PACKAGE = PROJECT / "retrysim"


@pytest.mark.parametrize(
    "changed",
    ["retrysim.engine.event_rules", "retrysim.model.xxh64"],
    ids=["imported", "imported-by-an-import"],
)
def test_the_digest_covers_the_modules_a_compiled_module_imports(changed):
    """The loop imports the rules, which import the hash: a change in either is the loop's."""
    sources: dict[str, bytes] = {}

    def read(name: str) -> bytes:
        return (
            sources.get(name)
            or (PACKAGE / (name.split(".", 1)[1].replace(".", "/") + ".py")).read_bytes()
        )

    before = source_digest("retrysim.engine.event_loop", read)
    assert source_digest("retrysim.engine.event_loop", read) == before
    sources[changed] = read(changed) + b"\nX = 1\n"
    assert source_digest("retrysim.engine.event_loop", read) != before


def test_every_module_of_compiled_code_keys_its_cache_by_source_before_compiling():
    compiled = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        first = re.search(r"^@njit\(cache=True", text, re.MULTILINE)
        if first is None:
            continue
        compiled.append(path.name)
        keyed = text.find("\ncache_by_source(__name__, __loader__, __file__)")
        assert 0 <= keyed < first.start(), path
    assert {"event_rules.py", "event_heaps.py", "event_loop.py", "event_rows.py",
            "spark_hash.py"} <= set(compiled)  # fmt: skip


_RULES = "LIMIT = {limit}\n"
_LOOP = """
from numba import njit

from retrysim.numba_cache import cache_by_source

cache_by_source(__name__, __loader__, __file__)

from pkg.rules import LIMIT  # noqa: E402


@njit(cache=True)
def capped(value):
    return min(value, LIMIT)
"""


def _run(root, cache) -> tuple[int, int]:
    code = "from pkg.loop import capped; print(capped(100), capped.stats.cache_hits and 1 or 0)"
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join([str(root), str(PROJECT)])}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True, timeout=120)  # fmt: skip
    value, hit = done.stdout.split()
    return int(value), int(hit)


def test_a_changed_rule_in_an_imported_module_is_compiled_anew(tmp_path):
    """A compiled function reads a constant of another module: numba freezes it into the
    compiled code. Changed, the rule must give the new value, not the cached one."""
    root, cache = tmp_path / "src", tmp_path / "cache"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "loop.py").write_text(textwrap.dedent(_LOOP))
    (root / "pkg" / "rules.py").write_text(_RULES.format(limit=7))
    assert _run(root, cache) == (7, 0)  # compiled
    assert _run(root, cache) == (7, 1)  # found in the cache
    (root / "pkg" / "rules.py").write_text(_RULES.format(limit=9))
    assert _run(root, cache) == (9, 0)  # the changed rule, compiled anew
