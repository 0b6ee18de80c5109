"""The README's scenario and the scenarios' headlines hold: the ```yaml block is the
embedded default scenario, and every figure a headline of the scenario tables (README.md and
docs/planning.md §6) quotes is one the scenario's run prints in its summary and verdict
(retrysim.reporting.verdict). A variant (`` `workload.scale: 2`: ...``) is checked on its own
run, with ``--set groups.0.<key>=<value>``. tests/test_docs.py runs the README's commands and
Python blocks.
"""

from __future__ import annotations

import re

import pytest
from support import PROJECT

from retrysim import Scenario, load_scenario
from retrysim.cli.simulate import print_summary
from retrysim.runner import simulate

README = PROJECT / "README.md"
HEADLINES = (README, PROJECT / "docs" / "planning.md")
# A fenced block: ```lang at the start of a line, its body, a closing ``` line.
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
# A row of the scenario table: | [name](conf/name.yaml) | question | headline |
ROW = re.compile(
    r"^\| \[[\w-]+\]\((?:\.\./)?(conf/[\w-]+\.yaml)\) \| [^|]+ \| ([^|]+) \|$", re.MULTILINE
)
# A variant within a headline: "; `key: value`: its figures" (or after a full stop)
VARIANT = re.compile(r"[;.]\s*`([\w.]+): ([^`]+)`:")
# The figures a headline quotes: durations, percentages, counts with a thousands separator,
# and the small counts the verdict words (7 wait, 4 of 8 instances idle, 0 left); not a
# command's argument (``--target p99_time_to_commit=30s``).
FIGURE = re.compile(
    r"(?<![=\w.])(?:\d+(?:\.\d+)?(?:ms|s|m|h|%)(?:\d+(?:ms|s|m))*|\d{1,3}(?:,\d{3})+)"
    r"|\d+(?= wait| left| DLQ| of \d+ instances idle| pending| dead-lettered)"
)


def readme_blocks(language: str) -> list[str]:
    """The bodies of the README's fenced blocks of one language, in order."""
    text = README.read_text(encoding="utf-8")
    return [body for lang, body in FENCE.findall(text) if lang == language]


def test_yaml_example_is_a_scenario(tmp_path):
    (block,) = readme_blocks("yaml")
    path = tmp_path / "scenario.yaml"
    path.write_text(block, encoding="utf-8")
    scenario = load_scenario(path)
    assert isinstance(scenario, Scenario)
    # the README says this is the embedded default, conf/default.yaml
    assert scenario == load_scenario()


def headline_runs() -> list[tuple[str, list[str], list[str]]]:
    """Each run the headlines quote: (scenario file, --set overrides, the figures quoted)."""
    runs: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for doc in HEADLINES:
        for path, headline in ROW.findall(doc.read_text(encoding="utf-8")):
            cuts = list(VARIANT.finditer(headline))
            base = headline[: cuts[0].start() if cuts else None]
            runs.setdefault((path, ()), []).extend(FIGURE.findall(base))
            for at, cut in enumerate(cuts):
                end = cuts[at + 1].start() if at + 1 < len(cuts) else None
                setting = (f"groups.0.{cut.group(1)}={cut.group(2)}",)
                runs.setdefault((path, setting), []).extend(
                    FIGURE.findall(headline[cut.end() : end])
                )
    return [(path, list(setting), sorted(set(found))) for (path, setting), found in runs.items()]


def test_the_scenario_tables_have_their_headlines():
    runs = headline_runs()
    assert len(runs) >= 12, "every scenario of the tables, and its variants"
    assert all(figures for _path, _set, figures in runs), runs


# Headlines whose run takes minutes on 2 cores: checked with -m long_runs, left out of the
# suite (tests/engine/test_metastable.py runs the storm through the compiled loop there).
LONG = {"conf/metastable-storm.yaml": "586,019 deliveries through Spark: minutes on 2 cores"}


@pytest.mark.spark
@pytest.mark.parametrize(
    ("path", "overrides", "figures"),
    [
        pytest.param(p, s, f, marks=[pytest.mark.long_runs] if p in LONG else [])
        for p, s, f in headline_runs()
    ],
    ids=[f"{p[5:-5]}{'+' if s else ''}{','.join(s)}" for p, s, _f in headline_runs()],
)
def test_each_headline_is_what_its_run_says(spark, tmp_path, capsys, path, overrides, figures):
    scenario = load_scenario(PROJECT / path, overrides)
    result = simulate(spark, scenario, str(tmp_path), tables="lean", validate=False)
    capsys.readouterr()
    print_summary(result)
    said = capsys.readouterr().out
    missing = [figure for figure in figures if figure not in said]
    assert not missing, f"{path} {overrides}: {missing} not in:\n{said}"
