"""A real Prometheus on loopback: a server that scrapes given targets or serves backfilled
blocks, queried through its HTTP API, and ``promtool``'s OpenMetrics backfill.

Used to record a broker's metrics over a run as a user exports them (a range query's JSON)
and to load an exported run back into Prometheus. The binaries are the ones on ``PATH``
(Debian's ``prometheus`` package, which ``scripts/prometheus.sh`` installs where it can).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

START_S = 30.0  # how long the server may take to answer its readiness endpoint
# every series retrysim reads (and the scrape's own health, which tells whether it ran)
RECORDED = '{__name__=~"rocketmq_.*"}'


class PrometheusError(RuntimeError):
    """The server or promtool failed: one line saying what."""


def binaries() -> tuple[str, str] | None:
    """The ``prometheus`` and ``promtool`` binaries on PATH, or None where either is missing."""
    server, tool = shutil.which("prometheus"), shutil.which("promtool")
    return (server, tool) if server and tool else None


def _need() -> tuple[str, str]:
    found = binaries()
    if found is None:
        raise PrometheusError("prometheus and promtool not found on PATH (Debian: prometheus)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backfill_openmetrics(file: str | Path, tsdb: str | Path) -> None:
    """Write ``file``'s OpenMetrics samples into the TSDB folder ``tsdb`` as blocks
    (``promtool tsdb create-blocks-from openmetrics``), for a server started on it."""
    _, tool = _need()
    Path(tsdb).mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [tool, "tsdb", "create-blocks-from", "openmetrics", str(file), str(tsdb)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        raise PrometheusError(f"promtool could not backfill {file}: {said[-1]}")


class Prometheus:
    """A Prometheus server on a free loopback port, its TSDB and config under ``folder``.

    ``targets`` are ``http://host:port/path`` URLs it scrapes every ``scrape_interval_s``;
    none: it only serves what is in the TSDB (backfilled blocks, kept by a 100-year
    retention). Use as a context manager: the server stops on exit."""

    def __init__(
        self, folder: str | Path, targets: list[str] = (), scrape_interval_s: float = 5.0
    ) -> None:
        self.folder = Path(folder)
        self.targets = list(targets)
        self.scrape_interval_s = scrape_interval_s
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen | None = None

    def _config(self) -> Path:
        interval = f"{int(self.scrape_interval_s * 1000)}ms"
        jobs = []
        for n, target in enumerate(self.targets):
            parsed = urllib.parse.urlparse(target)
            jobs.append({
                "job_name": f"target-{n}", "metrics_path": parsed.path or "/metrics",
                "scrape_interval": interval, "scrape_timeout": interval,
                "static_configs": [{"targets": [parsed.netloc]}],
            })  # fmt: skip
        config = {"global": {"scrape_interval": interval}, "scrape_configs": jobs}
        path = self.folder / "prometheus.yml"
        path.write_text(json.dumps(config, indent=1))  # JSON is YAML
        return path

    def __enter__(self) -> Prometheus:
        server, _ = _need()
        self.folder.mkdir(parents=True, exist_ok=True)
        command = [
            server, f"--config.file={self._config()}",
            f"--storage.tsdb.path={self.folder / 'tsdb'}",
            "--storage.tsdb.retention.time=100y",  # keep backfilled blocks from the past
            f"--web.listen-address=127.0.0.1:{self.port}",
            f"--web.console.templates={self.folder}", f"--web.console.libraries={self.folder}",
        ]  # fmt: skip
        self._log = open(self.folder / "prometheus.log", "w")
        self._process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_S
        while not self._ready():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                lines = (self.folder / "prometheus.log").read_text().strip().splitlines()
                raise PrometheusError(f"prometheus did not start: {(lines or ['no output'])[-1]}")
            time.sleep(0.1)
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def __exit__(self, *exc: object) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if getattr(self, "_log", None) is not None:
            self._log.close()

    def api(self, endpoint: str, **params: Any) -> dict:
        """The HTTP API's JSON answer to ``/api/v1/<endpoint>`` with ``params``; an error
        answer raises :class:`PrometheusError` with its message."""
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{endpoint}?{query}") as answer:
                body = json.load(answer)
        except urllib.error.HTTPError as error:
            body = json.load(error)
        if body.get("status") != "success":
            raise PrometheusError(f"{endpoint} {params}: {body.get('error', body)}")
        return body

    def query(self, query: str, at: float | None = None) -> dict:
        """An instant query at ``at`` (seconds since the epoch; None: now)."""
        return self.api("query", query=query, time=at)

    def query_range(self, query: str, start: float, end: float, step: float) -> dict:
        """A range query over ``[start, end]`` (seconds since the epoch) every ``step``
        seconds: the JSON a user exports from the HTTP API."""
        return self.api("query_range", query=query, start=start, end=end, step=step)

    def wait_for_scrapes(self, scrapes: int = 1, timeout_s: float = 60.0) -> None:
        """Wait until every target has been scraped ``scrapes`` times and is up."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ups = self.query(f"count_over_time(up[{int(timeout_s) + 60}s])")["data"]["result"]
            scraped = len(ups) == len(self.targets) and all(
                float(row["value"][1]) >= scrapes for row in ups
            )
            if scraped and all(
                float(r["value"][1]) == 1 for r in self.query("up")["data"]["result"]
            ):
                return
            time.sleep(self.scrape_interval_s / 2)
        raise PrometheusError(f"the targets were not scraped {scrapes} times in {timeout_s} s")

    def record(
        self, path: str | Path, start: float, end: float, step: float, query: str = RECORDED
    ) -> Path:
        """Write ``query``'s range ``[start, end]`` at ``step`` to ``path`` as the HTTP API
        answers it (every ``rocketmq_`` series by default, each with its ``__name__``)."""
        path = Path(path)
        path.write_text(json.dumps(self.query_range(query, start, end, step)))
        return path
