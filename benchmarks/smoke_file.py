"""The whole smoke test: a pytest file of 10 smoke-training tests under the plugin against the same as plain loops.

    python -m benchmarks.smoke_file              # 5 rounds (about 2 minutes on 2 cores)
    python -m benchmarks.smoke_file --rounds 3
    python -m benchmarks.smoke_file --cold       # every module compiled from source in every process

Two files are written to a temporary folder: ``test_smoke_watched.py`` (5 MLP and 5 CNN tests, each the
``neuraldbg`` fixture + ``smoke_train`` for 50 steps + ``assert_finite``, ``assert_parameters_update`` and
``assert_healthy``) and ``test_smoke_plain.py`` (the same models, batches, optimizer, seed and steps in a plain
loop that records every loss, with the plain equivalents of the first two assertions: every loss finite, every
parameter changed). Each round runs both files in fresh pytest processes (one torch thread, the order alternating
between rounds; the plain file with the plugin disabled, ``-p no:neuraldbg``, as in a project without it) and
reads two figures: the CPU time of the test loop (every test's setup, call and teardown, from a ``conftest.py``
hook) and the CPU time of the whole process (interpreter and pytest start-up, imports and the plugin's
session-end reporting included). Printed: the median over rounds of each ratio, watched over plain; and the test
loop split in two, what the first test pays once (the watched file's first test over the plain file's, in
milliseconds) and the ratio of the nine tests after it, what a smoke test costs on its own; the first test of
either file also pays what its process does once, about a second of torch's imports, which dilutes the loop's
ratio.

Bytecode: by default both files run with Python's bytecode cache (written under the temporary folder, through
``PYTHONPYCACHEPREFIX``, by one untimed run of each file first), as an installed package runs (pip compiles its
modules at install; a checkout's are compiled by its first run). ``--cold`` turns the cache off
(``PYTHONDONTWRITEBYTECODE=1``, as some CI images set): every process then compiles each imported module of the
checkout from source, about 0.3 s for the plugin and the engine, which the plain file does not import (torch's
own modules come compiled from its wheel either way).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

COMMON = '''
import math

import torch
from torch import nn


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )


def batches(kind, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "mlp":
        return [(torch.randn(32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(8)]
    return [(torch.randn(16, 3, 16, 16, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(8)]


def plain_train(model, data, loss_fn, steps=50, seed=0):
    """What smoke_train does, without the debugger: seeded, Adam lr 1e-3, every loss recorded."""
    torch.manual_seed(seed)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    losses = []
    model.train()
    for i in range(steps):
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        losses.append(float(loss))
        loss.backward()
        opt.step()
    return losses
'''

WATCHED = """
import pytest
import torch.nn.functional as F

from pytest_neuraldbg import assert_finite, assert_healthy, assert_parameters_update
from smoke_common import batches, cnn, mlp


@pytest.mark.parametrize("seed", range(5))
def test_mlp(neuraldbg, seed):
    run = neuraldbg.smoke_train(mlp(), batches("mlp", seed), F.cross_entropy, steps=50)
    assert_finite(run)
    assert_parameters_update(run)
    assert_healthy(run)


@pytest.mark.parametrize("seed", range(5))
def test_cnn(neuraldbg, seed):
    run = neuraldbg.smoke_train(cnn(), batches("cnn", seed), F.cross_entropy, steps=50)
    assert_finite(run)
    assert_parameters_update(run)
    assert_healthy(run)
"""

PLAIN = """
import math

import pytest
import torch.nn.functional as F

from smoke_common import batches, cnn, mlp, plain_train


def check(model, kind, seed):
    before = [p.detach().clone() for p in model.parameters()]
    losses = plain_train(model, batches(kind, seed), F.cross_entropy)
    assert all(math.isfinite(v) for v in losses)
    assert all(not b.equal(p) for b, p in zip(before, model.parameters()))


@pytest.mark.parametrize("seed", range(5))
def test_mlp(seed):
    check(mlp(), "mlp", seed)


@pytest.mark.parametrize("seed", range(5))
def test_cnn(seed):
    check(cnn(), "cnn", seed)
"""

CONFTEST = """
import os
import time

import pytest
import torch

torch.set_num_threads(1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    t0 = time.process_time()
    yield
    with open(os.environ["SMOKE_TIMES"], "a") as fh:
        fh.write(f"test {time.process_time() - t0}\\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtestloop(session):
    t0 = time.process_time()
    yield
    with open(os.environ["SMOKE_TIMES"], "a") as fh:
        fh.write(f"loop {time.process_time() - t0} {session.testsfailed}\\n")
"""


def write(folder: Path) -> None:
    (folder / "smoke_common.py").write_text(COMMON)
    (folder / "test_smoke_watched.py").write_text(WATCHED)
    (folder / "test_smoke_plain.py").write_text(PLAIN)
    (folder / "conftest.py").write_text(CONFTEST)


class FileRun(NamedTuple):
    """CPU seconds of one run of a file: its test loop, the whole pytest process, and each test in the order run
    (setup, call and teardown)."""

    loop: float
    process: float
    tests: list[float]


def read_times(text: str) -> tuple[float, int, list[float]]:
    """(the loop's CPU seconds, the number of failed tests, each test's CPU seconds) from the times file the
    conftest writes: a ``test <seconds>`` line per test, then ``loop <seconds> <failed>``."""
    loop, failed, tests = None, 0, []
    for line in text.splitlines():
        what, *values = line.split()
        if what == "test":
            tests.append(float(values[0]))
        elif what == "loop":
            loop, failed = float(values[0]), int(values[1])
    if loop is None:
        raise ValueError(f"no loop line in the smoke file's times: {text!r}")
    return loop, failed, tests


def first_and_rest(watched: list[float], plain: list[float]) -> tuple[float, float]:
    """Split a file's test time into what its first test pays once and what every later test pays: (the watched
    file's first test minus the plain file's, in seconds; the later tests' total, watched over plain). The first
    test of either file also pays what the process does once (importing the rest of torch; under the plugin, the
    engine), so the later tests show what a smoke test costs on its own."""
    if len(watched) != len(plain) or len(watched) < 2:
        raise ValueError(f"the two files ran {len(watched)} and {len(plain)} tests: at least 2 each, as many")
    return watched[0] - plain[0], sum(watched[1:]) / sum(plain[1:])


def run_file(folder: Path, name: str, cold: bool = False) -> FileRun:
    """The CPU seconds of one file's run (see :class:`FileRun`); ``cold``: without the bytecode cache (see the
    module docstring)."""
    times = folder / "times.txt"
    times.unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", SMOKE_TIMES=str(times))
    if cold:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:  # compiled once, kept out of the checkout
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
    env["PYTHONPATH"] = os.pathsep.join([str(folder), str(Path.cwd()), env.get("PYTHONPATH", "")])
    env.pop("PYTEST_ADDOPTS", None)
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    if name == "test_smoke_plain.py":
        args += ["-p", "no:neuraldbg"]
    args.append(name)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(args, cwd=folder, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    loop, failed, tests = read_times(times.read_text())
    if done.returncode != 0 or failed:
        raise RuntimeError(f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    process = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return FileRun(loop, process, tests)


class Figures(NamedTuple):
    """Each round's ratios, watched over plain: the test loop, the whole process, the nine tests after the first;
    and each round's plain loop (CPU seconds) and first watched test's extra (seconds)."""

    loops: list[float]
    processes: list[float]
    rests: list[float]
    plain_loop: list[float]
    firsts: list[float]


def measure(rounds: int, cold: bool = False) -> Figures:
    """Run both files ``rounds`` times in alternating order (after one untimed run of each that fills the bytecode
    cache, unless ``cold``) and return their :class:`Figures`."""
    figures = Figures([], [], [], [], [])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write(folder)
        order = ["test_smoke_plain.py", "test_smoke_watched.py"]
        if not cold:  # untimed: fills the bytecode cache
            for name in order:
                run_file(folder, name)
        for round_ in range(rounds):
            chosen = order if round_ % 2 == 0 else order[::-1]
            runs = {name: run_file(folder, name, cold) for name in chosen}
            plain, watched = runs["test_smoke_plain.py"], runs["test_smoke_watched.py"]
            figures.loops.append(watched.loop / plain.loop)
            figures.processes.append(watched.process / plain.process)
            figures.plain_loop.append(plain.loop)
            first, rest = first_and_rest(watched.tests, plain.tests)
            figures.firsts.append(first)
            figures.rests.append(rest)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of both files (default 5)")
    parser.add_argument("--cold", action="store_true", help="no bytecode cache: every import compiled from source")
    args = parser.parse_args(argv)
    loops, processes, rests, plain_loop, firsts = measure(args.rounds, args.cold)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    cache = "no bytecode cache (--cold)" if args.cold else "bytecode cached"
    print(f"10 smoke tests (5 MLP, 5 CNN, 50 steps each), {args.rounds} rounds, {cache}, load average {load}")
    print()
    print("| what | plain file | watched / plain (median) | range |")
    print("|---|---|---|---|")
    print(
        f"| the tests (setup, call, teardown) | {statistics.median(plain_loop):.2f} s CPU |"
        f" {statistics.median(loops):.2f}x | {min(loops):.2f}-{max(loops):.2f}x |"
    )
    print(
        f"| the whole pytest process | - | {statistics.median(processes):.2f}x |"
        f" {min(processes):.2f}-{max(processes):.2f}x |"
    )
    print(f"| the 9 tests after the first | - | {statistics.median(rests):.2f}x | {min(rests):.2f}-{max(rests):.2f}x |")
    print()
    print(
        f"The first watched test takes {1e3 * statistics.median(firsts):.0f} ms more CPU than the first plain one"
        f" ({1e3 * min(firsts):.0f}-{1e3 * max(firsts):.0f} ms). The first test of either file also pays what its"
        " process does once (the rest of torch's imports); the watched file imports the plugin's assertion helpers,"
        " and most of the engine with them, when it is collected, before the loop."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
