"""The docs name every column of every table, and every column carries its comment.

docs/model.md §9 ("Rows") has a section per table of a run, planning.md §2 the load table's
columns (its column table) and the summary's planning figures, §3 the plan table's columns.
The columns a section quotes in backticks must be the table's columns: a column added to a
schema without docs, or a documented column that is gone, fails here. The comments on the
schema constants are what ``DESCRIBE TABLE`` shows (retrysim.tables.schemas).
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from retrysim.store.sinks import arrow_schema
from retrysim.tables.schemas import (
    ALL_SCHEMAS,
    LOAD,
    PLAN,
    PLAN_METRICS,
    SCHEMAS,
    STAGE,
    SUMMARY,
    comment,
    data_schema,
)

DOCS = Path(__file__).resolve().parents[2] / "docs"
# §9's first paragraph says it once for every table: partitioned by run_id, a group column
# in every table but runs
STATED_ONCE = {"run_id", "group"}
# Words a section quotes that are not its columns: values, and the names of other tables.
NOT_COLUMNS: dict[str, set[str]] = {
    "runs": {"publishing", "complete", "full", "lean", "transitions", "messages"},
    "instance_load": {"load", "threads"},
    "summary": {"rounds", "sequential"},
    "plan": {"plan"},
}
MAX_COMMENT = 200

_QUOTED = re.compile(r"`([^`]+)`")
_NAME = re.compile(r"[a-z][a-z0-9_]*")
# `p50/p95/p99_time_to_commit_ms` names three columns
_ALTERNATIVES = re.compile(r"((?:[a-z0-9]+/)+)([a-z0-9]+)(_[a-z0-9_]+)")
_TEMPLATE = "<metric>"


def _names(text: str) -> set[str]:
    """The column names quoted in ``text``, alternatives spelled out; templates kept."""
    found: set[str] = set()
    for quoted in _QUOTED.findall(text):
        if _NAME.fullmatch(quoted) or quoted.startswith(_TEMPLATE):
            found.add(quoted)
        elif match := _ALTERNATIVES.fullmatch(quoted):
            heads = [*match[1].split("/")[:-1], match[2]]
            found.update(head + match[3] for head in heads)
    return found


def quoted_columns(markdown: str) -> set[str]:
    """The names ``markdown`` quotes; in a markdown table, every cell of its header row and
    only the first cell of its other rows (the rest say what the column means)."""
    lines = markdown.splitlines()
    found: set[str] = set()
    for number, line in enumerate(lines):
        if not line.startswith("|"):
            found |= _names(line)
            continue
        cells = line.strip().strip("|").split("|")
        if set(line) <= set("|-: "):
            continue  # the separator row
        following = lines[number + 1] if number + 1 < len(lines) else ""
        header = following.startswith("|") and set(following.strip()) <= set("|-: ")
        found |= _names(line if header else cells[0])
    return found


def between(text: str, start: str, end: str) -> str:
    """``text`` from the line ``start`` begins up to the next line ``end`` begins."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(start))
    last = next(
        (i for i, line in enumerate(lines[first + 1 :], first + 1) if line.startswith(end)),
        len(lines),
    )
    return "\n".join(lines[first:last])


def markdown_table(text: str, header: str) -> str:
    """The markdown table of ``text`` whose header row begins with ``header``."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(header))
    return "\n".join(itertools.takewhile(lambda line: line.startswith("|"), lines[first:]))


def paragraph(text: str, start: str) -> str:
    """The paragraph of ``text`` that begins with ``start``."""
    found = [block for block in re.split(r"\n\s*\n", text) if block.startswith(start)]
    assert len(found) == 1, f"one paragraph should begin with {start!r}"
    return found[0]


def columns(schema, without: set[str] = frozenset()) -> set[str]:
    return set(schema.fieldNames()) - without


ROWS = between((DOCS / "model.md").read_text(encoding="utf-8"), "## 9. Rows", "## ")
PLANNING = (DOCS / "planning.md").read_text(encoding="utf-8")
LOAD_SECTION = between(PLANNING, "## 2. The load table", "## ")
PLANS_SECTION = between(PLANNING, "## 3. Plans", "## ")
# model.md §9 documents every table of a run but load, whose columns planning.md §2 has
IN_ROWS = [name for name in SCHEMAS if name != "load"]


def rows_section(table: str) -> str:
    return between(ROWS, f"### {table} (", "#")


def test_the_rows_section_states_run_id_and_group_once():
    intro = between(ROWS, "## 9. Rows", "### ")
    assert quoted_columns(intro) >= STATED_ONCE


@pytest.mark.parametrize("table", IN_ROWS)
def test_model_md_names_every_column_of_the_table(table):
    quoted = quoted_columns(rows_section(table))
    not_columns = NOT_COLUMNS.get(table, set())
    assert not_columns <= quoted and not not_columns & columns(SCHEMAS[table])
    assert quoted - not_columns == columns(SCHEMAS[table], STATED_ONCE)


def test_planning_md_names_every_column_of_the_load_table():
    table = markdown_table(LOAD_SECTION, "| column |")
    assert quoted_columns(table) == columns(LOAD, STATED_ONCE)


def test_the_summary_figures_planning_md_names_are_summary_columns():
    figures = quoted_columns(paragraph(LOAD_SECTION, "The `summary` table adds")) - {"summary"}
    assert figures and figures <= columns(SUMMARY, STATED_ONCE)


def test_planning_md_names_every_column_of_the_plan_table():
    quoted = quoted_columns(paragraph(PLANS_SECTION, "The `plan` table")) - NOT_COLUMNS["plan"]
    metrics = quoted & columns(SUMMARY, STATED_ONCE)
    assert metrics == set(PLAN_METRICS)
    templates = {name for name in quoted if name.startswith(_TEMPLATE)}
    expanded = {t.replace(_TEMPLATE, metric) for t in templates for metric in metrics}
    assert (quoted - templates) | expanded == columns(PLAN)


def test_the_docs_parser_reads_tables_and_alternatives():
    markdown = (
        "`a_b` and `x.y`, `p1/p2_c` (`v`)\n\n"
        "| `h` | `i`, `j` |\n|---|---|\n| `k`, `l` | `not_this` |\n"
    )
    assert quoted_columns(markdown) == {"a_b", "p1_c", "p2_c", "v", "h", "i", "j", "k", "l"}


@pytest.mark.parametrize("table", list(ALL_SCHEMAS))
def test_every_column_has_a_short_comment_that_travels(table):
    schema = ALL_SCHEMAS[table]
    texts = [comment(field) for field in schema.fields]
    assert all(isinstance(text, str) and text.strip() for text in texts), schema.fieldNames()
    assert max(len(text) for text in texts) < MAX_COMMENT
    # the partition's files and delta-rs' Delta schema carry them too
    assert [comment(f) for f in data_schema(schema).fields] == texts[1:]
    assert [f.metadata for f in arrow_schema(schema)] == [
        {b"comment": text.encode()} for text in texts
    ]


def test_the_staged_attempts_shape_has_no_comments():
    """Spark writes the round files in STAGE's shape; they are the attempts table's files,
    the same with or without comments."""
    assert not any(field.metadata for field in STAGE.fields)
