"""File names of report files, made from test node ids."""

from __future__ import annotations

import re

import pytest

from pytest_neuraldbg.reporting import MAX_NAME, file_names, safe_name

SAFE = re.compile(r"[A-Za-z0-9._-]+")


@pytest.mark.parametrize(
    ("nodeid", "name"),
    [
        ("tests/test_x.py::test_dead", "tests_test_x.py_test_dead"),
        ("tests/test_x.py::TestA::test_b[a/b c]", "tests_test_x.py_TestA_test_b_a_b_c"),
        ("t.py::test[..\\..\\etc]", "t.py_test_.._.._etc"),
        ("t.py::test[é✓]", "t.py_test"),
        ("CON", "_CON"),
        ("nul.txt", "_nul.txt"),
        ("...", "test"),
    ],
)
def test_node_ids_become_portable_file_names(nodeid: str, name: str) -> None:
    assert safe_name(nodeid) == name
    assert SAFE.fullmatch(safe_name(nodeid))


def test_long_node_ids_are_cut_and_stay_distinct() -> None:
    a = safe_name("t.py::test[" + "x" * 300 + "1]")
    b = safe_name("t.py::test[" + "x" * 300 + "2]")
    assert len(a) <= MAX_NAME and len(b) <= MAX_NAME and a != b


def test_ids_that_sanitise_alike_and_several_runs_of_one_test_get_distinct_names() -> None:
    recs = [
        {"nodeid": "t.py::test[a/b]", "run": "1"},
        {"nodeid": "t.py::test[a_b]", "run": "1"},
        {"nodeid": "t.py::test_two", "run": "base line"},
        {"nodeid": "t.py::test_two", "run": "2"},
    ]
    names = file_names(recs)
    assert names[0] == "t.py_test_a_b" and names[1].startswith("t.py_test_a_b-") and names[1] != names[0]
    assert names[2:] == ["t.py_test_two-run-base_line", "t.py_test_two-run-2"]
    assert len({n.lower() for n in names}) == 4
