"""The README's examples run, as chispa tests its README: an example that rots fails here.

The ```python blocks are read from README.md itself and executed in order in one namespace
(a later block uses the ``spark`` and ``result`` of an earlier one), in a temporary working
directory so their ``out`` folder lands there. The ```yaml block must load as a scenario
through the public API. The README's shell commands are run by the end-to-end tests.
"""

from __future__ import annotations

import re

import pytest
from support import PROJECT

from retrysim import Scenario, load_scenario, read_table

pytestmark = pytest.mark.spark

README = PROJECT / "README.md"
# A fenced block: ```lang at the start of a line, its body, a closing ``` line.
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def readme_blocks(language: str) -> list[str]:
    """The bodies of the README's fenced blocks of one language, in order."""
    text = README.read_text(encoding="utf-8")
    return [body for lang, body in FENCE.findall(text) if lang == language]


def test_the_readme_has_its_examples():
    # guards the extraction itself: a changed fence style must not make the tests vacuous
    assert len(readme_blocks("python")) >= 2
    assert len(readme_blocks("yaml")) == 1
    assert readme_blocks("bash"), "the two commands"


def test_python_examples_run(spark, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "readme"}
    for number, code in enumerate(readme_blocks("python"), start=1):
        for line in code.splitlines():
            # only the public names (`from retrysim import x`, never a module) and PySpark
            imported = re.match(r"\s*(?:from|import)\s+([\w.]+)", line)
            name = imported.group(1) if imported else "retrysim"
            assert name == "retrysim" or name.split(".")[0] == "pyspark", line
        exec(compile(code, f"README.md python block {number}", "exec"), namespace)
    # the examples wrote into the working directory's out/, one complete run
    assert read_table(spark, str(tmp_path / "out"), "runs").count() == 1


def test_yaml_example_is_a_scenario(tmp_path):
    (block,) = readme_blocks("yaml")
    path = tmp_path / "scenario.yaml"
    path.write_text(block, encoding="utf-8")
    scenario = load_scenario(path)
    assert isinstance(scenario, Scenario)
    # the README says this is the embedded default, conf/default.yaml
    assert scenario == load_scenario()
