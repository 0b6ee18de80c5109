"""Every example in README.md and docs/*.md runs, so that a stale command or a broken snippet
fails here and not for a user.

What runs, as written:

* each command of a ``bash`` block: ``./spark-submit.sh`` and ``retrysim`` (or
  ``.venv/bin/retrysim``) commands, in a folder of the document's own that holds one small
  run of the default scenario at first (a reader has run the README's first command), with
  each scenario made small (:data:`SMALL`: the same keys, fewer messages); the commands that
  write runs (simulate, plan) go first, in the document's order, then the ones that read
  them, then the deletions; optional arguments written ``[--flag value]`` are left out;
* each ``$ command`` transcript, with its scenario as written: an error must be that line
  on stderr exactly, any other output must have every line shown (``...`` skips);
* each ``python`` block, in the docs' order, one namespace a document, with ``spark`` the
  tests' session, in the document's folder after its commands.

What does not run is listed in :data:`NOT_RUN`, each with the reason.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from support import PROJECT, QUICK_JVM

from retrysim import load_scenario, simulate
from retrysim.cli.main import main
from retrysim.session import full_jit

pytestmark = pytest.mark.spark  # spark-submit runs and the session

DOCS = [PROJECT / "README.md", *sorted((PROJECT / "docs").glob("*.md"))]
# A fenced block, possibly indented (inside a list): its language and body.
FENCE = re.compile(r"^[ \t]*```(\w*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)
# Every scenario a command runs, made small: same keys, same shape, fewer messages.
SMALL = ("--set", "groups.0.workload.messages=500")
# Commands (matched by a piece of their text) that do not run here, and why.
NOT_RUN = {
    "./run-tests.sh": "the suite itself: .ci/run runs it",
    "scripts/local-cluster.sh": "starts a standalone cluster: tests/test_cluster.py does, and "
    "runs the cluster commands of docs/cluster.md there",
    "spark://": "a cluster: tests/test_cluster.py runs these on its standalone cluster",
    "digest --output out --run-id on-cluster": "compares a cluster's run: tests/test_cluster.py",
    "diff cluster.txt local.txt": "compares a cluster's run: tests/test_cluster.py",
    "--packages io.delta": "a cluster with shared storage at the user's site",
    "conf/metastable-storm.yaml --sweep": "plans of three runs of up to 586,019 deliveries "
    "(minutes on 2 cores); tests/engine/test_metastable.py runs the storm and its recoveries",
    "--plan-id flash-plan ...": "a plan id run again: tests/planning/test_plans.py checks the "
    "refusal (this one needs the plan above in the folder)",
    "retrysim-env": "packs a Python environment for a cluster's executors (minutes, and venv-pack)",
    "promtool tsdb create-blocks-from": "backfills an export into a Prometheus TSDB: "
    "tests/metrics/test_export.py does, and queries it",
    "--storage.tsdb.path": "a Prometheus server: tests/metrics/test_export.py starts one",
}


def blocks(language: str) -> list[tuple[str, str]]:
    """Each fenced block of ``language`` in the docs: (where, body), in reading order."""
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            if match.group(1) == language:
                line = text.count("\n", 0, match.start()) + 1
                where = f"{path.relative_to(PROJECT)}:{line}"
                found.append((where, _dedent(match.group(2))))
    return found


def _dedent(body: str) -> str:
    lines = body.splitlines()
    indent = min((len(x) - len(x.lstrip()) for x in lines if x.strip()), default=0)
    return "\n".join(x[indent:] for x in lines) + "\n"


def commands(body: str) -> list[str]:
    """A shell block's commands: continuation lines joined, comments and blanks dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    found = []
    for line in joined.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#"):
            found.append(line)
    return found


def not_run(command: str) -> str | None:
    return next((why for piece, why in NOT_RUN.items() if piece in command), None)


def argv(command: str, tmp: Path, small: bool = True) -> list[str]:
    """A documented command as it runs here (see the module text); ``small=False`` keeps
    its scenario as written (a transcript shows that one's output)."""
    words = shlex.split(re.sub(r"\s\[[^\]]*\]|\s>\s*\S+$", "", command))
    if words[0] in ("retrysim", ".venv/bin/retrysim"):
        words = [sys.executable, "-m", "retrysim", *words[1:]]
    elif words[0] == "./spark-submit.sh":
        words[0] = str(PROJECT / "spark-submit.sh")
    if "--output" in words:
        at = words.index("--output") + 1
        words[at] = str(tmp / words[at])
    elif _writes(words):
        words += ["--output", str(tmp / "out")]
    made = False  # a scenario the document's commands wrote (calibrate's), in its folder
    if "--scenario" in words and not (PROJECT / words[words.index("--scenario") + 1]).exists():
        at = words.index("--scenario") + 1
        words[at], made = str(tmp / words[at]), True
    if _writes(words) and small and not made:
        words += list(SMALL)
    return words


def _order(words: list[str]) -> int:
    """Scenario writers (calibrate) first, then the runs' writers, readers, deletions."""
    if "calibrate" in words:
        return -1
    return 0 if _writes(words) else 2 if _deletes(words) else 1


def _writes(words: list[str]) -> bool:
    return any(
        w in ("jobs/simulate.py", "jobs/capacity_plan.py", "simulate", "plan") for w in words
    )


def run(words: list[str]) -> tuple[int, str, str]:
    """Run a documented command: exit code, stdout, stderr. A ``retrysim`` command runs its
    command line (``retrysim.cli.main``) in this process, on the tests' session, which it
    may not stop (:func:`session_kept`): its own JVM's start is what every spark-submit
    command here pays; those run as processes, their JVMs compiling with C1 only."""
    if words[:3] == [sys.executable, "-m", "retrysim"]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(words[3:])
            except SystemExit as exit_:  # argparse
                code = exit_.code
        return code, out.getvalue(), err.getvalue()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "JAVA_TOOL_OPTIONS": QUICK_JVM}
    done = subprocess.run(words, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=900)
    return done.returncode, done.stdout, done.stderr


@pytest.fixture
def session_kept(spark, monkeypatch):
    """The tests' session, which the commands run here build on and may not stop, left as
    they found it; relative paths (``conf/...``) are the project's, as for a command run
    from its folder."""
    monkeypatch.setattr(SparkSession, "stop", lambda _self: None)
    monkeypatch.chdir(PROJECT)
    yield spark
    full_jit(spark)  # a simulating command left the driver JVM on C1 alone: C2 back


def _deletes(words: list[str]) -> bool:
    return "delete" in words


@pytest.fixture(scope="module")
def site(spark, tmp_path_factory) -> Path:
    """The docs' folders: one a document (``site/<name>``), each holding at first one small
    run of the default scenario, what the README's first command writes, in ``out``."""
    root = tmp_path_factory.mktemp("docs")
    scenario = load_scenario(None, [SMALL[1]])
    simulate(spark, scenario, output=str(root / "seed"), run_id="default-run", validate=False)
    for path in DOCS:
        shutil.copytree(root / "seed", root / path.stem / "out")
        (root / path.stem / "conf").symlink_to(PROJECT / "conf")
        (root / path.stem / "examples").symlink_to(PROJECT / "examples")
    return root


def test_the_docs_have_examples_and_each_unrun_one_is_listed():
    shell = [c for _where, body in blocks("bash") for c in commands(body)]
    assert len(shell) >= 20 and len(blocks("python")) >= 6
    shell += [command for _where, command, _shown in transcripts()]
    # each reason still names a documented command (a stale entry would hide nothing)
    for piece in NOT_RUN:
        assert any(piece in c for c in shell), piece


def test_every_documented_command_runs(site, session_kept):
    """Each document's commands in its folder: the ones that write runs first, in the
    document's order, then the ones that read them, then the deletions."""
    first = blocks("bash")[0][0]  # the README's first command: the test below runs it whole
    for path in DOCS:
        folder = site / path.stem
        shell = [
            (where, command, argv(command, folder))
            for where, body in blocks("bash")
            if where.split(":")[0] == str(path.relative_to(PROJECT)) and where != first
            for command in commands(body)
            if not not_run(command)
        ]
        ordered = sorted(shell, key=lambda x: _order(x[2]))
        for where, command, words in ordered:
            code, out, err = run(words)
            assert code == 0, f"{where}: {command}\n{out[-2000:]}{err[-2000:]}"


def transcripts() -> list[tuple[str, str, list[str]]]:
    """Each ``$ command`` of a plain block and the lines shown after it: (where, command,
    lines). A command may go on over lines ending in a backslash."""
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            lines = _dedent(match.group(2)).splitlines()
            if match.group(1) or not lines or not lines[0].startswith("$ "):
                continue
            where = f"{path.relative_to(PROJECT)}:{text.count(chr(10), 0, match.start()) + 1}"
            at = 0
            while at < len(lines):
                command = lines[at][2:]
                while command.endswith("\\"):
                    at += 1
                    command = command[:-1] + " " + lines[at].strip()
                shown = []
                at += 1
                while at < len(lines) and not lines[at].startswith("$ "):
                    shown.append(lines[at])
                    at += 1
                found.append((where, command, shown))
    return found


def _pattern(line: str) -> str:
    """A shown line as a pattern: ``...`` within it skips text (a path, a machine's size)."""
    return ".*".join(re.escape(part) for part in line.split("..."))


def test_every_transcript_prints_what_the_docs_show(site, session_kept):
    """An error is its one line on stderr, exit 2; any other output has every line shown
    among its stdout lines (a ``...`` line skips lines, ``...`` within a line skips text:
    the machine's paths and sizes).
    Wall times are not shown in a transcript."""
    shown_all = transcripts()
    assert len(shown_all) >= 5, "the docs show their commands' output"
    for number, (where, command, shown) in enumerate(shown_all):
        if not_run(command):
            continue
        words = argv(command, site / f"transcript-{number}", small=False)  # a folder each
        code, out, err = run(words)
        if shown and shown[0].startswith("retrysim: error: "):
            assert code == 2, (where, command, err[-2000:])
            (line,) = shown
            assert re.fullmatch(_pattern(line), err.strip().splitlines()[-1]), (where, line)
            continue
        assert code == 0, (where, command, err[-2000:])
        printed = out.splitlines()
        for line in shown:
            if line != "...":
                assert any(re.fullmatch(_pattern(line), p) for p in printed), (where, line, printed)


def test_every_python_example_runs(spark, site, monkeypatch):
    """After the commands, in each document's folder: a snippet reads the runs they wrote."""
    by_file: dict[str, dict] = {}
    for where, code in blocks("python"):
        document = Path(where.split(":")[0]).stem
        monkeypatch.chdir(site / document)
        namespace = by_file.setdefault(document, {"__name__": "docs", "spark": spark})
        exec(compile(code, where, "exec"), namespace)


def test_the_readmes_first_command_prints_what_the_readme_shows(site):
    """The README's first command, as written (the whole default scenario), prints every
    line the README shows, but for the times, the run id and the output folder."""
    text = (PROJECT / "README.md").read_text(encoding="utf-8")
    shown = next(
        body for lang, body in FENCE.findall(text) if lang == "" and "verdict: " in body
    ).splitlines()
    out = site / "first-command"
    done = subprocess.run(
        [str(PROJECT / "spark-submit.sh"), "jobs/simulate.py", "--output", str(out)],
        cwd=PROJECT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout.splitlines()
    for line in shown:
        if line == "...":
            continue
        pattern = re.escape(line).replace(re.escape("/work/main/out"), re.escape(str(out)))
        pattern = re.sub(
            r"default\\-\d{8}T\d{6}Z\\-[0-9a-f]{6}", r"default-[0-9TZ]+-[0-9a-f]+", pattern
        )
        pattern = re.sub(r"\d+\\\.\ds", r"\\d+\\.\\ds", pattern)
        assert any(re.fullmatch(pattern, said) for said in printed), (line, printed)
