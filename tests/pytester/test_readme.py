"""The code in README.md and in every page of docs/ runs as written.

Each fenced block of each page is one of:

* a Python test file (it defines ``test_`` functions): written where the next pytest command of the same page
  expects it, and run under that command; every test in it must pass;
* a Python file of the repository, quoted whole: ``<!-- file: PATH -->`` right before the block; it must be the
  repository's file (from its first import on), which the suite runs as an ordinary test or script;
* any other Python block: run as a script;
* a shell block: every command in it is an install command (``pip install ...``, ``python3 -m venv``) or is
  listed in ``COMMANDS`` with the check that runs it, or checks it against what CI runs;
* a GitHub Actions example (yaml): its commands are listed in ``COMMANDS`` too;
* the demo's output and the demo's causal graph (README): compared with what the demo prints.

``BLOCKS`` counts the blocks of each page, so a block added to a page fails here until it is run. The links between
the pages, and the repository paths and test names they mention, must exist.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.metadata
import io
import re
import shlex
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest
import torch
from torch import nn

import neuraldbg.demo

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", *sorted(f"docs/{path.name}" for path in (ROOT / "docs").glob("*.md"))]
TEXT = {page: (ROOT / page).read_text(encoding="utf-8") for page in PAGES}
CI_RUN = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
WORKFLOW = (ROOT / ".github" / "workflows" / "ci.yml").read_text(encoding="utf-8")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, from 1
    lang: str
    text: str
    quotes: str | None  # the repository file named by ``<!-- file: PATH -->`` right before the block

    @property
    def kind(self) -> str:
        if self.lang == "python":
            if self.quotes:
                return "quoted file"
            return "test file" if re.search(r"^def test_", self.text, re.MULTILINE) else "script"
        return {"bash": "shell", "yaml": "workflow", "mermaid": "graph", "": "output"}.get(self.lang, self.lang)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def parse(page: str) -> list[Block]:
    lines = TEXT[page].splitlines(keepends=True)
    blocks, i = [], 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].rstrip("\n") != "```":
            end += 1
        assert end < len(lines), f"{page}:{i + 1}: a code block that is never closed"
        quoted = re.fullmatch(r"<!-- file: (\S+) -->", lines[i - 1].strip()) if i else None
        lang = lines[i][3:].strip()
        blocks.append(Block(page, i + 1, lang, "".join(lines[i + 1 : end]), quoted.group(1) if quoted else None))
        i = end + 1
    return blocks


ALL = [block for page in PAGES for block in parse(page)]


def of_kind(kind: str) -> list[Block]:
    return [block for block in ALL if block.kind == kind]


#: Blocks per page and kind: a new block fails here until it is counted (and so run by the tests below).
BLOCKS = {
    "README.md": {"graph": 1, "shell": 7, "script": 1, "output": 1, "test file": 1},
    "docs/README.md": {},
    "docs/benchmark.md": {"shell": 2},
    "docs/cli.md": {},
    "docs/cost.md": {"shell": 1},
    "docs/cost-history.md": {},
    "docs/detection.md": {},
    "docs/development.md": {"shell": 2},
    "docs/distributed.md": {"quoted file": 2, "shell": 1, "script": 1},
    "docs/engine.md": {},
    "docs/extending.md": {"quoted file": 1, "toml": 1},
    "docs/huggingface.md": {"quoted file": 1},
    "docs/lightning.md": {"quoted file": 1},
    "docs/limitations.md": {},
    "docs/plugin.md": {"test file": 1, "workflow": 1},
    "docs/real-scripts.md": {"quoted file": 1},
}

#: Every repository file a page quotes whole, and the page.
QUOTED = [
    ("docs/distributed.md", "tests/distributed/test_readme_distributed_example.py"),
    ("docs/distributed.md", "tests/distributed/torchrun_train.py"),
    ("docs/extending.md", "examples/zero_output_kind.py"),
    ("docs/huggingface.md", "tests/integrations/test_readme_huggingface_example.py"),
    ("docs/lightning.md", "tests/integrations/test_readme_lightning_example.py"),
    ("docs/real-scripts.md", "tests/plugin/test_readme_real_scripts.py"),
]

INSTALL = re.compile(r"(python3 -m venv \.venv|(\.venv/bin/)?pip install .+)")


def commands(block: Block) -> list[str]:
    """The commands of a shell block (comments dropped), or the ``run:`` commands of a workflow example."""
    if block.kind == "workflow":
        return re.findall(r"^\s*run: (.+)$", block.text, re.MULTILINE)
    if block.kind != "shell":
        return []
    lines = (re.sub(r"\s+#.*$", "", line).strip() for line in block.text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def is_install(command: str) -> bool:
    return all(INSTALL.fullmatch(part) for part in command.split(" && "))


#: Every command of the pages that is not only an install, and the check below that covers it.
COMMANDS = {
    # README: the set-up commands, and the plugin's quick start
    "python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e . && .venv/bin/neuraldbg demo": "neuraldbg",
    (
        'python3 -m venv .venv && .venv/bin/pip install -q torch==2.13.0 -e ".[test]"'
        " && .venv/bin/python -m pytest -n auto"
    ): "ci",
    "python -m pytest tests/test_training.py --neuraldbg-gate": "runs a test file",
    # plugin.md: the GitHub Actions example
    "python -m pytest tests/training --neuraldbg-gate --neuraldbg-report=neuraldbg-report": "runs a test file",
    'cat neuraldbg-report/summary.md >> "$GITHUB_STEP_SUMMARY"': "summary",
    # distributed.md
    "torchrun --standalone --nproc_per_node=2 tests/distributed/torchrun_train.py out dead": "torchrun",
    "neuraldbg explain out/run.rank0.json out/run.rank1.json": "explain",
    "neuraldbg explain out/": "explain",
    # cost.md, benchmark.md
    "python -m benchmarks.overhead": "benchmark",
    "python -m benchmarks.overhead --model tiny --model deep": "benchmark",
    "python -m benchmarks.overhead --model many --no-compile --quick": "benchmark",
    "python -m benchmarks.diagnosis": "benchmark",
    "python -m benchmarks.evidence": "benchmark",
    "python -m benchmarks.holdout_evidence": "benchmark",
    "python -m benchmarks.overhead --peers": "benchmark",
    "python -m benchmarks.targets": "benchmark",
    "python -m benchmarks.smoke_file": "benchmark",
    "python -m benchmarks.smoke_file --cold": "benchmark",
    "python -m benchmarks.smoke_steps": "benchmark",
    "python -m benchmarks.smoke_steps --count": "benchmark",
    "python -m benchmarks.smoke_steps --inside": "benchmark",
    "python -m benchmarks.step_parts --model deep --preset full": "benchmark",
    "python -m benchmarks.against REVISION": "benchmark",
    "python -m benchmarks.gpu": "benchmark",
    "python -m benchmarks.step_parts": "benchmark",
    "python -m benchmarks.hook_floor": "benchmark",
    "python -m benchmarks.cold_ops": "benchmark",
    "python -m benchmarks.reductions": "benchmark",
    "python -m benchmarks.layer_capture": "benchmark",
    "python -m benchmarks.instructions": "benchmark",
    "python -m benchmarks.instructions --against REVISION": "benchmark",
    "python -m benchmarks.cheap_parts": "benchmark",
    "python -m benchmarks.cheap_parts --model deep": "benchmark",
    "python -m benchmarks.collector": "benchmark",
    "python -m benchmarks.families": "benchmark",
    ".venv/bin/python -m pytest tests/fuzz --hypothesis-profile=long -p no:cacheprovider": "fuzz profile",
    # development.md
    ".venv/bin/python -m pytest -n auto": "ci",
    ".venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy": "ci",
    ".venv/bin/bandit -c pyproject.toml -r neuraldbg pytest_neuraldbg -ll": "ci",
    "python -m benchmarks.diagnosis && python -m benchmarks.overhead": "benchmark",
}

FOUND = {command: block for block in ALL for command in commands(block) if not is_install(command)}


def without_docstring(source: str) -> str:
    """A module's text after its docstring (the pages quote a file from its first import on)."""
    first = ast.parse(source).body[0]
    docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    lines = source.splitlines(keepends=True)
    return "".join(lines[first.end_lineno :] if docstring else lines).lstrip("\n")


def pytest_args(command: str) -> list[str] | None:
    """The arguments of a ``python -m pytest`` command, or None for another command."""
    words = shlex.split(command)
    if words[:3] in (["python", "-m", "pytest"], [".venv/bin/python", "-m", "pytest"]):
        return words[3:]
    return None


def run_command(block: Block) -> str:
    """The pytest command a test file runs under: the first one after it on its page."""
    after = [b for b in parse(block.page) if b.line > block.line and b.kind in ("shell", "workflow")]
    for later in after:
        for command in commands(later):
            if pytest_args(command):
                return command
    raise AssertionError(f"{block.id}: no pytest command after this test file on its page")


def cli() -> Callable[[list[str]], int]:
    """The ``neuraldbg`` console script's function, as installed (wherever the package keeps it)."""
    (script,) = [e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "neuraldbg"]
    return cast("Callable[[list[str]], int]", script.load())


# --------------------------------------------------------------------------------------------- inventory


def test_each_page_has_the_blocks_these_tests_run() -> None:
    # a new page or block is run too: count it here (a quoted file: add it to QUOTED; a command: to COMMANDS)
    found = {page: dict(Counter(block.kind for block in parse(page))) for page in PAGES}
    assert found == BLOCKS
    assert sorted((block.page, block.quotes) for block in of_kind("quoted file")) == QUOTED


def test_every_command_is_an_install_command_or_has_a_check() -> None:
    assert sorted(FOUND) == sorted(COMMANDS)
    installs = [c for block in ALL for c in commands(block) if is_install(c)]
    assert len(installs) == 7  # README: from a checkout (3), from git, CPU torch (2); development.md: the dev extras


def test_the_readme_stays_a_page_read_in_five_minutes() -> None:
    assert len(TEXT["README.md"].splitlines()) <= 300


# --------------------------------------------------------------------------------------------- Python blocks


@pytest.mark.parametrize("block", of_kind("quoted file"), ids=lambda b: b.quotes)
def test_each_quoted_file_is_the_repositorys_file(block: Block) -> None:
    assert block.quotes is not None
    source = (ROOT / block.quotes).read_text(encoding="utf-8")
    assert block.text == without_docstring(source), f"{block.page} quotes {block.quotes} as it no longer is"


@pytest.mark.parametrize("block", of_kind("test file"), ids=lambda b: b.id)
def test_each_test_file_passes_under_the_command_printed_after_it(block: Block, pytester: pytest.Pytester) -> None:
    args = pytest_args(run_command(block))
    assert args
    target = Path(args[0]) if args[0].endswith(".py") else Path(args[0]) / "test_docs_example.py"
    (pytester.path / target.parent).mkdir(parents=True, exist_ok=True)
    (pytester.path / target).write_text(block.text, encoding="utf-8")
    result = pytester.runpytest(*args)
    tests = re.findall(r"^def (test_\w+)", block.text, re.MULTILINE)
    result.assert_outcomes(passed=len(tests))  # a test that expects its failure is not failed by the gate
    report = [arg.split("=", 1)[1] for arg in args if arg.startswith("--neuraldbg-report=")]
    if report:
        summary = (pytester.path / report[0] / "summary.md").read_text("utf-8")
        expected = len(re.findall(r"pytest\.raises\(AssertionError", block.text))
        assert f"**No test watching training failed, but {expected} of {len(tests)} watched runs are unhealthy**" in (
            summary
        )
        assert "| passed | ❌ unhealthy (expected by the test) |" in summary


@pytest.mark.parametrize("block", of_kind("script"), ids=lambda b: b.id)
def test_each_other_python_block_runs_as_a_script(block: Block, pytester: pytest.Pytester) -> None:
    script = pytester.path / "block.py"
    script.write_text(block.text, encoding="utf-8")
    result = pytester.run(sys.executable, "-W", "ignore", str(script), timeout=300)
    assert result.ret == 0, result.stderr.str()
    if "explain_failure()" in block.text:  # the engine's quick start: its model trains healthily on its data
        assert result.stdout.str() == ""  # "[] when training is healthy": nothing printed
    if "grad_scaler=scaler" in block.text:  # the mixed-precision snippet: healthy, its scaler's counts shown
        assert result.stdout.lines[0].startswith("NeuralDBG: healthy - no training failure in 100 observed steps")
        assert result.stdout.lines[-1].startswith("{'steps': 100, 'skipped_steps': ")


# --------------------------------------------------------------------------------------------- the demo


@pytest.mark.parametrize("block", [b for page in PAGES for b in parse(page) if b.kind == "toml"], ids=lambda b: b.id)
def test_each_toml_block_parses_and_names_the_entry_point_group_plugins_are_loaded_from(block: Block) -> None:
    import tomllib

    from neuraldbg.plugins import manager

    points = tomllib.loads(block.text)["project"]["entry-points"]
    assert list(points) == ["neuraldbg"]  # the group manager._entry_point_plugins loads
    assert 'load_setuptools_entrypoints("neuraldbg")' in Path(manager.__file__).read_text(encoding="utf-8")


def test_the_output_quoted_for_the_demo_is_what_the_demo_prints() -> None:
    (block,) = of_kind("output")
    assert TEXT[block.page].splitlines()[block.line - 3].endswith("For the demo's model that prints:")
    printed = neuraldbg.demo.dead_layer().explain_failure()
    assert [" ".join(block.text.split())] == [" ".join(text.split()) for text in printed]


def test_the_graph_at_the_top_is_the_demos_graph() -> None:
    (block,) = of_kind("graph")
    assert block.page == "README.md"
    assert block.text == neuraldbg.demo.dead_layer().export_mermaid_causal_graph() + "\n"


# --------------------------------------------------------------------------------------------- commands


def ci_test_command() -> str:
    """The set-up-and-test line of .ci/run (it continues with its failure message)."""
    (line,) = [line for line in CI_RUN.splitlines() if line.startswith("python3 -m venv")]
    assert line.endswith(" \\")
    return line.removesuffix(" \\")


def test_the_readmes_test_command_is_the_one_ci_runs() -> None:
    readme = [command for block in parse("README.md") for command in commands(block)]
    assert ci_test_command() in readme
    text = TEXT["README.md"]
    assert f"(this is exactly what CI runs, `.ci/run`):\n\n```bash\n{ci_test_command()}\n```" in text


def ci_commands() -> set[str]:
    """What CI runs (.ci/run and the workflow), without the venv prefix and the options that only change output."""
    lines = [*CI_RUN.splitlines(), *(m for m in re.findall(r"^\s*(?:- )?run: (.+)$", WORKFLOW, re.MULTILINE))]
    lines += re.findall(r"^\s{10,}(\S.*)$", WORKFLOW, re.MULTILINE)  # the lines of `run: |` blocks
    found = set()
    for line in lines:
        for part in line.rstrip(" \\").split(" && "):
            part = part.strip().replace(".venv/bin/", "")
            found.add(re.sub(r" (-q|--output-format=\S+)(?= )", "", part))
    return found


COMMAND_CHECKS = sorted(COMMANDS.items())


@pytest.mark.parametrize(("command", "check"), COMMAND_CHECKS, ids=[c for c, _ in COMMAND_CHECKS])
def test_each_command_runs_or_is_what_ci_runs(
    command: str, check: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    parts = [part for part in command.split(" && ") if not INSTALL.fullmatch(part)]
    if check == "ci" and "pip install" in command:  # the set-up-and-test line: exactly .ci/run's
        assert command == ci_test_command()
    elif check == "ci":  # one of the commands of .ci/run or a step of the workflow (without output options)
        assert all(part.replace(".venv/bin/", "") in ci_commands() for part in parts), ci_commands()
    elif check == "neuraldbg":  # the installed console script, run here
        for part in parts:
            args = shlex.split(part)
            assert args[0].rsplit("/", 1)[-1] == "neuraldbg"
            assert cli()(args[1:]) == 0, capsys.readouterr()  # for `demo`: diagnosed as expected
    elif check == "runs a test file":  # run by the test-file test above
        assert command in [run_command(block) for block in of_kind("test file")]
    elif check == "summary":  # the report directory the test-file test checks
        path = shlex.split(command)[1]
        assert any(f"--neuraldbg-report={path.split('/')[0]}" in run_command(b) for b in of_kind("test file"))
    elif check == "torchrun":
        check_torchrun(command)
    elif check == "explain":
        check_explain(command, tmp_path, monkeypatch, capsys)
    elif check == "benchmark":
        for part in parts:
            check_benchmark_arguments(part, capsys)
    elif check == "fuzz profile":
        check_fuzz_profile(command)
    else:  # pragma: no cover
        raise AssertionError(f"no check called {check!r}")


def check_torchrun(command: str) -> None:
    """The suite runs this script with these arguments (``tests/distributed/test_torchrun.py``: two processes
    take seconds, so it is not run twice)."""
    words = shlex.split(command)
    script = next(word for word in words if word.endswith(".py"))
    assert (ROOT / script).is_file()
    runners = [
        path
        for path in sorted((ROOT / "tests").rglob("test_*.py"))
        if path != Path(__file__).resolve()
        and Path(script).name in path.read_text("utf-8")
        and '"torch.distributed.run"' in path.read_text("utf-8")
    ]
    assert runners, f"no test runs {script} with torch.distributed.run"
    source = runners[0].read_text("utf-8")
    for word in words[1:]:
        if word.startswith("--") or word == words[-1]:
            assert f'"{word}"' in source, f"{runners[0]} does not run {script} with {word}"


def rank_traces(folder: Path) -> None:
    """Traces of the torchrun script's dead model, one per rank (each rank its own data, as in the script)."""
    for rank in (0, 1):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
        with torch.no_grad():
            model[2].bias.fill_(-10.0)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(rank)
        with neuraldbg.NeuralDbg(model) as dbg:
            for _ in range(30):
                x = torch.randn(32, 16, generator=g)
                optimizer.zero_grad()
                nn.functional.mse_loss(model(x), x[:, :1]).backward()
                optimizer.step()
        dbg.save(str(folder / f"run.rank{rank}.json"))


def check_explain(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "out").mkdir()
    rank_traces(tmp_path / "out")
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert cli()(shlex.split(command)[1:]) == 1  # failures found
    assert "dead_neurons at '3' from step 0 on all ranks" in capsys.readouterr().out  # "Each prints ..."


def check_benchmark_arguments(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The benchmark exists and takes these arguments (its ``--help`` after them; running it takes minutes)."""
    words = shlex.split(command)
    assert words[:2] == ["python", "-m"]
    assert "argparse" in (ROOT / (words[2].replace(".", "/") + ".py")).read_text("utf-8")  # so --help is safe
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # `python -m benchmarks...` runs from the repository's root
    with pytest.raises(SystemExit) as exit_, contextlib.redirect_stderr(io.StringIO()) as stderr:
        importlib.import_module(words[2]).main([*words[3:], "--help"])
    assert exit_.value.code == 0, stderr.getvalue()
    assert capsys.readouterr().out.startswith("usage:")


def check_fuzz_profile(command: str) -> None:
    """The profile exists where the command names it, with the number of examples benchmark.md gives it."""
    args = pytest_args(command)
    assert args
    (profile,) = [arg.split("=", 1)[1] for arg in args if arg.startswith("--hypothesis-profile=")]
    conftest = (ROOT / args[0] / "conftest.py").read_text("utf-8")
    registered = re.search(rf'register_profile\("{profile}", max_examples=(\d+)', conftest)
    assert registered, f"{args[0]} registers no hypothesis profile {profile!r}"
    assert f"`{profile}` ({registered.group(1)} examples per property" in TEXT["docs/benchmark.md"]


# --------------------------------------------------------------------------------------------- links and names


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def prose(page: str) -> str:
    """A page without its code blocks."""
    return re.sub(r"^```.*?^```$", "", TEXT[page], flags=re.DOTALL | re.MULTILINE)


@pytest.mark.parametrize("page", PAGES)
def test_each_link_between_the_pages_leads_somewhere(page: str) -> None:
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(page)):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        file = (ROOT / page).parent / path if path else ROOT / page
        assert file.exists(), f"{page} links to {target}: no such file"
        if anchor:
            text = re.sub(r"^```.*?^```$", "", file.read_text("utf-8"), flags=re.DOTALL | re.MULTILINE)
            headings = re.findall(r"^#+ (.+)$", text, re.MULTILINE)
            assert anchor in [slug(h) for h in headings], f"{page} links to {target}: no such heading"


def test_the_index_links_every_page_and_the_readme_links_the_index() -> None:
    linked = set(re.findall(r"\]\(([\w-]+\.md)\)", TEXT["docs/README.md"]))
    assert linked == {page.removeprefix("docs/") for page in PAGES if page.startswith("docs/")} - {"README.md"}
    assert "](docs/README.md)" in TEXT["README.md"]


@functools.cache
def sources_of_the_tests() -> str:
    return "".join(path.read_text("utf-8") for path in sorted((ROOT / "tests").rglob("*.py")))


@pytest.mark.parametrize("page", PAGES)
def test_each_repository_path_and_test_the_pages_name_exists(page: str) -> None:
    tests = sources_of_the_tests()
    yours = {shlex.split(run_command(block))[3].rstrip("/") for block in of_kind("test file")}  # a user's files
    for span in re.findall(r"`([^`\n]+)`", prose(page)):
        if span.rstrip("/") in yours:
            continue
        if re.fullmatch(r"(tests|benchmarks|examples|\.ci|\.github|pytest_neuraldbg)/[\w./-]*", span) or re.fullmatch(
            r"neuraldbg/[\w/]+\.py", span
        ):
            assert (ROOT / span).exists(), f"{page} names {span}, which does not exist"
        elif re.fullmatch(r"test_\w+", span):
            assert f"def {span}(" in tests, f"{page} names the test {span}, which does not exist"
