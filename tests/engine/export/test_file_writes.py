"""Every file NeuralDBG writes is whole or absent: killed writers, devices, links, and two writers at once."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from neuraldbg.export.files import (
    OutputError,
    clean_temporary,
    folder_lock,
    is_temporary,
    write_atomic,
)

#: What the child writes: ``WRITER`` names a function taking (path, text); the text is large enough that the write
#: takes a while, so the parent can kill the child in the middle of it.
CHILD = """
import sys, time
from pathlib import Path
target, writer = Path(sys.argv[1]), sys.argv[2]
text = ("new " * 25 + "\\n") * 1_000_000  # about 100 MB
if writer == "report":
    from pytest_neuraldbg.reporting import _write
    _write(target, text)
elif writer == "trace":
    from neuraldbg.export.trace_format import write
    write(target, {"padding": text})
else:
    from pytest_neuraldbg.baseline.files import write
    write(target, {"padding": text})
time.sleep(30)
"""


def _kill_mid_write(target: Path, writer: str) -> None:
    """Start a child writing ``target``; SIGKILL it as soon as bytes of the new content reach the disk."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(target), writer])
    old = target.stat().st_size
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and child.poll() is None:
            started = target.stat().st_size != old or any(
                is_temporary(p.name) and p.stat().st_size > 0 for p in target.parent.iterdir()
            )
            if started:
                break
            time.sleep(0.001)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


@pytest.mark.parametrize("writer", ["report", "trace", "baseline"])
def test_a_writer_killed_mid_write_leaves_the_previous_file_whole(tmp_path: Path, writer: str) -> None:
    target = tmp_path / ("summary.md" if writer == "report" else "run.json")
    previous = '{"previous": "good"}\n'
    target.write_text(previous, encoding="utf-8")
    _kill_mid_write(target, writer)
    text = target.read_text(encoding="utf-8")
    assert text == previous or (text.endswith("\n") and len(text) > 90_000_000), len(text)
    assert target.stat().st_size > 0
    # the dead writer's temporary file is no result, and the next write removes it
    write_atomic(tmp_path / "other.md", "x")
    assert not [p for p in tmp_path.iterdir() if is_temporary(p.name)]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="making device nodes needs root")
@pytest.mark.parametrize(("name", "minor"), [("null", 3), ("full", 7)])
def test_a_device_is_never_replaced_by_a_file(tmp_path: Path, name: str, minor: int, nan_free_run: object) -> None:
    # a copy of /dev/null or /dev/full in tmp_path: the code before this change replaced the node it was given
    device = tmp_path / name
    os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    with pytest.raises(OutputError, match="is a character device; expected the path of a regular file"):
        write_atomic(device, "text")
    with pytest.raises(OutputError, match="character device"):
        nan_free_run.save(device)  # type: ignore[attr-defined]
    after = os.lstat(device)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == os.makedev(1, minor)


def test_a_link_to_stdout_a_fifo_a_folder_and_a_link_are_refused_and_left_alone(tmp_path: Path) -> None:
    stdout = tmp_path / "stdout"
    stdout.symlink_to("/proc/self/fd/1")  # what /dev/stdout is
    with pytest.raises(OutputError, match="is a symbolic link"):
        write_atomic(stdout, "text")
    assert stdout.is_symlink()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match=r"is a FIFO \(named pipe\)"):
        write_atomic(fifo, "text")  # refused before opening: never blocks
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    with pytest.raises(OutputError, match="is a directory"):
        write_atomic(tmp_path, "text")
    real = tmp_path / "real.md"
    real.write_text("real", encoding="utf-8")
    link = tmp_path / "link.md"
    link.symlink_to(real)
    with pytest.raises(OutputError, match="is a symbolic link"):
        write_atomic(link, "text")
    assert link.is_symlink() and real.read_text(encoding="utf-8") == "real"
    assert not [p for p in tmp_path.iterdir() if is_temporary(p.name)]


def test_a_file_is_written_whole_with_the_permissions_of_the_one_it_replaces(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "er" / "report.md"
    write_atomic(target, "one\n")
    assert target.read_text(encoding="utf-8") == "one\n"
    os.chmod(target, 0o640)
    write_atomic(target, b"two\n")
    assert target.read_bytes() == b"two\n" and stat.S_IMODE(os.stat(target).st_mode) == 0o640
    write_atomic(target, "lone \udc80 surrogate")  # a name from a layer: escaped, never a crash
    assert target.read_text(encoding="utf-8") == "lone \\udc80 surrogate"


def test_only_dead_writers_temporary_files_are_cleaned(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = tmp_path / f".neuraldbg-tmp-{dead.stdout.strip()}-abcdef.tmp"
    mine = tmp_path / f".neuraldbg-tmp-{os.getpid()}-abcdef.tmp"
    other = tmp_path / ".neuraldbg-tmp-notes.txt"
    for path in (gone, mine, other):
        path.write_text("partial", encoding="utf-8")
    assert clean_temporary(tmp_path) == [gone]
    assert mine.exists() and other.exists()


TWO_SESSIONS = """
import sys
from pathlib import Path
from neuraldbg.export.files import folder_lock
from pytest_neuraldbg.reporting import _write
folder, name = Path(sys.argv[1]), sys.argv[2]
for i in range(40):
    with folder_lock(folder):
        _write(folder / "summary.md", "".join(f"{name} header {i}\\n" + f"{name} row {j}\\n" for j in range(20_000)))
"""


def test_two_sessions_writing_one_folder_never_tear_a_file(tmp_path: Path) -> None:
    (tmp_path / "summary.md").write_text("A header\nA row\n", encoding="utf-8")
    writers = [subprocess.Popen([sys.executable, "-c", TWO_SESSIONS, str(tmp_path), n]) for n in ("A", "B")]
    reads = 0
    while any(w.poll() is None for w in writers):
        lines = (tmp_path / "summary.md").read_text(encoding="utf-8").splitlines()
        assert lines, "an empty summary"
        owners = {line.split(" ", 1)[0] for line in lines}
        assert len(owners) == 1, f"a torn summary: lines of {sorted(owners)}"
        reads += 1
    assert all(w.returncode == 0 for w in writers) and reads > 0


def test_the_folder_lock_makes_writers_take_turns(tmp_path: Path) -> None:
    """A second writer enters only once the first has left: the holder keeps the lock until told to release it (no
    duration is measured: the second writer must not have entered while the lock is held, and must enter after)."""
    import fcntl
    import threading

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import sys
                from neuraldbg.export.files import folder_lock
                with folder_lock(sys.argv[1]):
                    print("held", flush=True)
                    sys.stdin.readline()
                print("released", flush=True)
                """
            ),
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None and holder.stdout is not None
    assert holder.stdout.readline().strip() == "held"
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):  # the lock is on the folder itself
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    entered = threading.Event()

    def second() -> None:
        with folder_lock(tmp_path):
            entered.set()

    thread = threading.Thread(target=second, daemon=True)
    thread.start()
    assert not entered.wait(1.0), "the second writer entered while the first held the lock"
    holder.stdin.write("go\n")
    holder.stdin.flush()
    assert holder.stdout.readline().strip() == "released"
    assert entered.wait(60.0), "the second writer never entered after the first left"
    thread.join()
    holder.wait()
    assert not [p for p in tmp_path.iterdir()]  # no lock file left among the reports


@pytest.fixture
def nan_free_run() -> object:
    import torch

    from neuraldbg import NeuralDbg

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model) as dbg:
        for _ in range(2):
            opt.zero_grad()
            model(torch.ones(4, 2)).sum().backward()
            opt.step()
    return dbg
