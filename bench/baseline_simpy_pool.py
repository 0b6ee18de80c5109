"""A hand-built SimPy model of a saturated consumer pool, the yardstick of bench/saturated.yaml.

What a SimPy user would write for "one RocketMQ 4.x instance with K threads": Poisson
arrivals spread over the topic's queues, K worker processes that take the head of the
client's FIFO (a worker with nothing to do waits on an event the next arrival fires), a
lognormal processing time given by its mean and p99, a failure sends the message back at
delay level ``3 + reconsumeTimes`` of the 18-level table onto ``%RETRY%``, one more queue,
and after 16 retries to the DLQ. The client pulls a queue only while it caches no more than
``pullThresholdForQueue`` (1000) of its messages, consumed or not yet, up to 32 a pull: the
rest wait on the broker and enter the FIFO as the queue's cached ones are consumed.
``simpy.Resource`` is not used: its list-based queue slows quadratically past ~1e5 waiting
requests, which would flatter retrysim. Draws come from NumPy's generator, not retrysim's
hashes, so its figures agree with retrysim's statistically (p99 time to commit within a few
seconds), not row by row.

    .venv/bin/python bench/baseline_simpy_pool.py --messages 300000 --over 10m --json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import deque

import numpy as np
import simpy

DELAY_LEVELS_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800,
                  3600, 7200)  # fmt: skip
MAX_RECONSUME = 16
Z99 = 2.3263478740408408  # the standard normal's 0.99 quantile


def lognormal_ms(rng: np.random.Generator, mean: float, p99: float, n: int) -> np.ndarray:
    """Lognormal draws with the given mean and p99: ``sigma`` solves
    ``ln p99 - ln mean = z99 sigma - sigma^2 / 2`` (the smaller root)."""
    gap = math.log(p99) - math.log(mean)
    sigma = Z99 - math.sqrt(Z99 * Z99 - 2 * gap)
    mu = math.log(mean) - sigma * sigma / 2
    return rng.lognormal(mu, sigma, n)


def simulate(messages: int, over_s: float, threads: int, fail: float, mean_ms: float,
             p99_ms: float, horizon_s: float, seed: int, queues: int = 8,
             threshold: int = 1000) -> dict:  # fmt: skip
    rng = np.random.default_rng(seed)
    born = np.sort(rng.uniform(0, over_s, messages))  # Poisson arrivals: sorted uniforms
    env = simpy.Environment()
    ready: deque = deque()  # the client's FIFO of pulled messages
    retry_queue = queues  # %RETRY%<group>: one queue more
    cached = [0] * (queues + 1)
    on_broker: list[deque] = [deque() for _ in range(queues + 1)]
    idle: list[simpy.Event] = []
    committed: list[float] = []
    counts = {"deliveries": 0, "dlq": 0}
    block = 1 << 16
    draws = {"i": block, "t": None, "u": None}

    def draw() -> tuple[float, float]:
        if draws["i"] == block:
            draws["t"] = lognormal_ms(rng, mean_ms, p99_ms, block) / 1000
            draws["u"] = rng.random(block)
            draws["i"] = 0
        i = draws["i"]
        draws["i"] += 1
        return draws["t"][i], draws["u"][i]

    def pull(message: tuple[int, int, int]) -> None:
        cached[message[2]] += 1
        ready.append(message)
        if idle:
            idle.pop().succeed()

    def make_ready(message: tuple[int, int, int]) -> None:
        if cached[message[2]] <= threshold:
            pull(message)
        else:
            on_broker[message[2]].append(message)

    def consumed(queue: int) -> None:
        cached[queue] -= 1
        while on_broker[queue] and cached[queue] <= threshold:
            for _ in range(min(32, len(on_broker[queue]))):
                pull(on_broker[queue].popleft())

    def publish():
        for msg_id, at in enumerate(born):
            yield env.timeout(at - env.now)
            make_ready((msg_id, 0, msg_id % queues))

    def retry_later(message: tuple[int, int, int], delay: float):
        yield env.timeout(delay)
        make_ready(message)

    def worker():
        while True:
            if not ready:
                wake = env.event()
                idle.append(wake)
                yield wake
                continue
            msg_id, reconsume, queue = ready.popleft()
            processing, u = draw()
            counts["deliveries"] += 1
            yield env.timeout(processing)
            consumed(queue)
            if u >= fail:
                committed.append(env.now - born[msg_id])
            elif reconsume >= MAX_RECONSUME:
                counts["dlq"] += 1
            else:
                level = min(3 + reconsume, len(DELAY_LEVELS_S))
                retry = (msg_id, reconsume + 1, retry_queue)
                env.process(retry_later(retry, DELAY_LEVELS_S[level - 1]))

    env.process(publish())
    for _ in range(threads):
        env.process(worker())
    began = time.perf_counter()
    env.run(until=horizon_s)
    seconds = time.perf_counter() - began
    times = np.sort(np.array(committed))
    return {
        "model": "simpy-finite-pool",
        "messages": messages,
        "threads": threads,
        "queues": queues,
        "pull_threshold_for_queue": threshold,
        "deliveries": counts["deliveries"],
        "commits": len(committed),
        "dlq": counts["dlq"],
        "p50_time_to_commit_s": round(float(np.quantile(times, 0.5)), 3),
        "p99_time_to_commit_s": round(float(np.quantile(times, 0.99)), 3),
        "simulate_s": round(seconds, 2),
        "deliveries_per_s": round(counts["deliveries"] / seconds),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--over", default="10m", help="arrival span: 10m, 100m, 600s")
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--pull-threshold", type=int, default=1000, help="per queue")
    parser.add_argument("--horizon", default="6h", help="the clock's stop: 6h, 120000s")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    over, horizon = (float(text[:-1]) * {"s": 1, "m": 60, "h": 3600}[text[-1]]
                     for text in (args.over, args.horizon))  # fmt: skip
    result = simulate(args.messages, over, args.threads, fail=0.05, mean_ms=100, p99_ms=400,
                      horizon_s=horizon, seed=args.seed, queues=args.queues,
                      threshold=args.pull_threshold)  # fmt: skip
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
