"""The options of the commands that run a scenario (simulate, plan, conformance) and the
parser every command uses: here without Spark, pandas or the engine, so that
``spark-submit.sh`` can check a job's arguments before a JVM starts (cli/precheck.py) with
the very parser the job uses.

A mistake on the command line is one ``retrysim: error:`` line, exit code 2, as bad
scenario input is: a misspelt option or command is named as typed, with the nearest one,
under the program name the user ran (``./spark-submit.sh jobs/simulate.py``).
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from retrysim.planning.metrics import METRICS
from retrysim.scenario.limits import DEFAULT_CONFIDENCE, MAX_REPLICATIONS, TAIL_ROWS

EXIT_BAD_INPUT = 2
_INVALID_CHOICE = re.compile(r"^argument (\S+): invalid choice: '(.*)' \(choose from (.*)\)$")


class Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line (no usage block): ``retrysim: error: ...``."""

    def error(self, message: str) -> NoReturn:
        found = _INVALID_CHOICE.match(message)
        if found:
            name, value, listed = found.groups()
            choices = [choice.strip().strip("'") for choice in listed.split(",")]
            if name.startswith("-"):
                message = f"{name}: value {value!r}: must be one of {', '.join(choices)}"
                message += _guess(value, choices, quote=True)
            else:
                message = f"unknown command {value!r}{_guess(value, choices, quote=True)}"
                message += f" (commands: {', '.join(choices)})"
        elif message.startswith("argument "):  # "argument --a/-b: ..." -> "--a or -b: ..."
            name, _, rest = message.removeprefix("argument ").partition(": ")
            message = f"{name.replace('/', ' or ')}: {rest}"
        elif message.startswith("the following arguments are required: "):
            missing = message.removeprefix("the following arguments are required: ")
            message = f"{missing}: {'are' if ', ' in missing else 'is'} required"
            for action in self._actions:
                if isinstance(action, argparse._SubParsersAction) and action.dest == missing:
                    message = f"a command is required: {', '.join(action.choices)}"
        stop(message)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """As argparse's, but an argument no option takes is named with its nearest option
        (among the options of the command it was given to)."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self._command_parser(parsed)
            first = extras[0]
            if not first.startswith("-"):
                command.error(f"unexpected argument {first!r} (options: {command.prog} --help)")
            typed = first.split("=", 1)[0]
            options = [o for a in command._actions for o in a.option_strings if o.startswith("--")]
            guess = _guess(typed, options, quote=False)
            command.error(f"unknown option {typed}{guess} (options: {command.prog} --help)")
        return parsed

    def _command_parser(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The (sub)command's own parser: the one whose options were given."""
        parser: argparse.ArgumentParser = self
        while True:
            subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            if not subparsers or getattr(parsed, subparsers[0].dest, None) is None:
                return parser
            parser = subparsers[0].choices[getattr(parsed, subparsers[0].dest)]


def _guess(typed: str, choices: Sequence[str], quote: bool) -> str:
    """``; did you mean X?`` for the nearest of ``choices`` (difflib), or nothing."""
    found = difflib.get_close_matches(typed, choices, n=1, cutoff=0.6)
    if not found:
        return ""
    return f"; did you mean {found[0]!r}?" if quote else f"; did you mean {found[0]}?"


def stop(message: str) -> NoReturn:
    """Print one ``retrysim: error:`` line and end with the bad-input exit code."""
    print(f"retrysim: error: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_BAD_INPUT)


# --------------------------------------------------------------------------- options


def add_scenario_options(command: argparse.ArgumentParser, set_help: str) -> None:
    """The options of the commands that run a scenario: --scenario, --output, --master,
    --set, --unset."""
    command.add_argument("--scenario", help="scenario YAML (default: conf/default.yaml)")
    command.add_argument(
        "--output", default="out", help="folder of the Delta tables (default: out)"
    )
    command.add_argument("--master", help="Spark master, e.g. local[2] (default: spark-submit's)")
    command.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=set_help
    )
    command.add_argument(
        "--unset",
        dest="overrides",
        action="append",
        type=_unset,
        metavar="KEY",
        help="return a scenario key to its default (the flavor's), as --set KEY=null does: "
        "e.g. groups.0.consume_timeout before --set groups.0.flavor=rocketmq5.simple",
    )


def _unset(text: str) -> str:
    """An argparse type: ``--unset KEY`` is ``--set KEY=null`` (scenario/loading.py)."""
    if "=" in text or not text.strip():
        raise argparse.ArgumentTypeError(f"value {text!r}: give a key alone, e.g. groups.0.topic")
    return f"{text}=null"


def add_replications_option(command: argparse.ArgumentParser) -> None:
    """``--replications N``: the scenario (each plan point) under N seeds."""
    command.add_argument(
        "--replications",
        type=_replications,
        default=1,
        metavar="N",
        help=f"run each scenario under N seeds derived from its seed (1-{MAX_REPLICATIONS}; "
        "default 1): runs <id>-r1..rN, and each metric's mean and 95%% interval",
    )


def _replications(text: str) -> int:
    """An argparse type: argparse reports the option and exits with code 2."""
    if not text.strip().isdigit() or not 1 <= int(text) <= MAX_REPLICATIONS:
        raise argparse.ArgumentTypeError(
            f"value {text!r}: must be a whole number within 1..{MAX_REPLICATIONS}"
        )
    return int(text)


def _non_negative(text: str) -> int:
    """An argparse type: argparse reports the option and exits with code 2."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"value {text!r}: must be an integer >= 0")
    return int(text)


def _share(text: str) -> float:
    """An argparse type: 0.95 or 95%%; argparse reports the option and exits with code 2."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"value {text!r}: must be within (0, 1] or (0%, 100%]")
    return value


def _delta_sink(command: argparse.ArgumentParser, text: str) -> None:
    command.add_argument(
        "--delta-sink", choices=("auto", "delta-rs", "delta-spark"), default="auto", help=text
    )


def add_simulate_options(sim: argparse.ArgumentParser) -> None:
    """``retrysim simulate [--scenario FILE] [--set key=value] ...`` (also jobs/simulate.py)."""
    add_scenario_options(
        sim, "override a scenario key, e.g. groups.0.behavior.fail_probability=0.05"
    )
    sim.add_argument("--run-id", help="run id (default: <name>-<UTC time>-<random>)")
    _delta_sink(sim, "auto: delta-spark when its JARs are on the classpath, else delta-rs commits")
    sim.add_argument(
        "--tables",
        choices=("full", "lean"),
        default="full",
        help="lean: skip the transitions and messages tables, derived when read (large runs)",
    )
    sim.add_argument("--quiet", action="store_true", help="no per-round progress")
    sim.add_argument(
        "--tail-rows",
        type=_non_negative,
        default=TAIL_ROWS,
        metavar="N",
        help=f"finish a retry frontier of at most N messages event by event in one stage "
        f"(default {TAIL_ROWS:,}; 0: one Spark stage per round)",
    )
    sim.add_argument(
        "--force", action="store_true", help="run even when the size estimate says it cannot fit"
    )
    sim.add_argument(
        "--no-validate",
        dest="validate",
        action="store_false",
        help="publish without checking the invariants first (`retrysim validate` can check "
        "later); for benchmarks and very large trusted runs",
    )
    sim.add_argument("--no-report", action="store_true", help="do not write the HTML report")
    sim.add_argument(
        "--json",
        action="store_true",
        help="print each run's figures and verdict as JSON on stdout (progress goes to stderr)",
    )
    sim.add_argument(
        "--dry-run",
        action="store_true",
        help="print each group's engine, the size and a time estimate; run nothing",
    )
    add_replications_option(sim)


def add_plan_options(command: argparse.ArgumentParser) -> None:
    """``retrysim plan`` (also jobs/capacity_plan.py)."""
    add_scenario_options(command, "override a scenario key for every point")
    command.add_argument(
        "--sweep",
        dest="sweeps",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="sweep a scenario key over values (repeat for a cartesian grid), e.g. "
        "groups.order-service.consumers.instances=2,4,8; a group key without 'groups.<name>.' "
        "(consumers.instances=2,4,8) is accepted when the scenario has exactly one group",
    )
    command.add_argument(
        "--search",
        metavar="KEY=LO..HI",
        help="find the smallest value of a group's consumers.instances or consumers.threads "
        "in LO..HI that meets the targets, by bisection (about 2 + log2(HI-LO) points); "
        "other --sweep keys make cases, each searched",
    )
    command.add_argument(
        "--target",
        dest="targets",
        action="append",
        default=[],
        metavar="[GROUP.]METRIC=LIMIT",
        help=f"an upper bound every group (or GROUP) must meet; metrics: {', '.join(METRICS)} "
        "(durations like 5m, counts, peak_utilization as 0.8 or 80%%)",
    )
    command.add_argument("--plan-id", help="plan id (default: <name>-plan-<UTC time>-<random>)")
    command.add_argument(
        "--replace",
        action="store_true",
        help="run a plan id the folder already holds again, in its place: the new runs are "
        "published, then the earlier ones removed (without it such a plan id is refused)",
    )
    _delta_sink(command, "as for simulate")
    command.add_argument(
        "--force", action="store_true", help="run even when a point's size estimate cannot fit"
    )
    command.add_argument("--quiet", action="store_true", help="one progress line per point only")
    command.add_argument("--no-report", action="store_true", help="do not write the HTML report")
    command.add_argument(
        "--dry-run",
        action="store_true",
        help="print each point's engines, deliveries and a time estimate; run nothing",
    )
    add_replications_option(command)
    command.add_argument(
        "--confidence",
        type=_share,
        default=DEFAULT_CONFIDENCE,
        metavar="C",
        help="recommend the smallest pool whose share of replications meeting every target "
        "is at least C (0 < C <= 1, or a percentage; default 0.95)",
    )


def add_conformance_options(command: argparse.ArgumentParser) -> None:
    """``retrysim conformance --scenario FILE --output DIR`` (also jobs/conformance.py)."""
    add_scenario_options(command, "override a scenario key, as for simulate")
    command.add_argument("--run-id", help="run id (default: <name>-<UTC time>-<random>)")


# The commands that run a scenario: (help, description, options), for retrysim's subcommands
# and for a job's parser alike.
SCENARIO_COMMANDS = {
    "simulate": ("run a scenario and write the Delta tables", None, add_simulate_options),
    "plan": (
        "sweep scenario keys and recommend the smallest consumer pool meeting targets",
        "Run the scenario once per point of a sweep grid, write the plan table, and recommend "
        "per group the smallest consumer pool (instances x threads) that meets every "
        "--target, naming the binding target.",
        add_plan_options,
    ),
    "conformance": (
        "run a scenario on a real RocketMQ broker and in retrysim, figure by figure",
        "Run each group of the scenario on a real RocketMQ 4.9.7 namesrv, broker and push "
        "consumer, with the outcomes retrysim draws, and compare every figure "
        "(docs/conformance.md). Prints one line per figure and writes the Delta tables "
        "conformance and broker_deliveries; exits 0 only when every figure agrees.",
        add_conformance_options,
    ),
}


def add_scenario_command(commands: argparse._SubParsersAction, name: str) -> None:
    """One of :data:`SCENARIO_COMMANDS` as a subcommand of ``retrysim``."""
    text, description, add = SCENARIO_COMMANDS[name]
    add(commands.add_parser(name, help=text, description=description))


def job_parser(name: str, prog: str) -> Parser:
    """The parser of a job (``jobs/simulate.py``: the command ``simulate`` alone), under the
    program name the user ran."""
    text, description, add = SCENARIO_COMMANDS[name]
    parser = Parser(prog=prog, description=description or text[:1].upper() + text[1:] + ".")
    add(parser)
    parser.set_defaults(command=name)
    return parser
