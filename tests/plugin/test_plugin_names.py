"""File names for test ids: portable, and one test's baseline never another's."""

from __future__ import annotations

import pytest

from pytest_neuraldbg.baseline import file_name
from pytest_neuraldbg.names import portable_name


@pytest.mark.parametrize(
    "ids",
    [
        ("test[a::b]", "test[a.b]"),  # the separator of a class and a test, inside a parameter id
        ("TestA::test_b", "TestA::test_b[x]"),
        ("test[a/b]", "test[a_b]"),
        ("test[é]", "test[_]"),
        ("test[a b]", "test[a_b]"),
    ],
)
def test_two_test_ids_never_share_a_baseline_file(ids: tuple[str, str]) -> None:
    first, second = ids
    assert file_name(first) != file_name(second)


def test_the_usual_ids_keep_readable_names() -> None:
    assert file_name("TestA::test_b[x-1]") == "TestA.test_b[x-1].json"
    assert file_name("test_plain") == "test_plain.json"


def test_a_name_that_had_to_change_ends_with_a_hash_only_when_asked() -> None:
    assert portable_name("a/b") == "a_b"
    assert portable_name("a/b", distinct=True).startswith("a_b-") and len(portable_name("a/b", distinct=True)) == 12
    assert portable_name("con.json") == "_con.json"
    assert len(portable_name("x" * 500)) <= 120
