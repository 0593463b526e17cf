"""The command line: demo, explain, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import support

from neuraldbg.cli import main


def test_the_demo_diagnoses_the_broken_model_and_exits_0(capsys: pytest.CaptureFixture[str]):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "NeuralDBG: UNHEALTHY" in out
    assert "Dead neurons in '5' (ReLU), fed by '4' (Linear)" in out
    assert "flowchart TD" in out
    assert "diagnosis as expected" in out


def test_every_demo_is_diagnosed_as_expected(capsys: pytest.CaptureFixture[str]):
    assert main(["demo", "--all", "--no-graph"]) == 0
    assert capsys.readouterr().out.count("diagnosis as expected") == 6


def test_explain_prints_the_report_and_exits_1_on_failures(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["demo", "frozen", "--save", str(tmp_path / "t.json")]) == 0
    capsys.readouterr()
    assert main(["explain", str(tmp_path / "t.json")]) == 1
    assert "Frozen parameters: '0.weight', '0.bias'" in capsys.readouterr().out
    assert main(["explain", str(tmp_path / "t.json"), "--mermaid"]) == 1
    assert capsys.readouterr().out.startswith("flowchart TD")
    assert main(["explain", str(tmp_path / "t.json"), "--json"]) == 1
    payload = json.loads(capsys.readouterr().out)
    assert payload["healthy"] is False
    assert payload["hypotheses"][0]["kind"] == "frozen_parameters"
    assert payload["hypotheses"][0]["layer"] == "0"


def test_explain_exits_0_on_a_healthy_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    dbg, _ = support.train(support.mlp(), support.regression_batches(), steps=10)
    path = dbg.save(tmp_path / "healthy.json")
    assert main(["explain", path]) == 0
    assert "healthy" in capsys.readouterr().out


def test_bad_input_exits_2_with_a_message_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    bad = tmp_path / "broken.json"
    bad.write_text("{")
    assert main(["explain", str(bad)]) == 2
    assert f"{bad}: not valid JSON" in capsys.readouterr().err
    assert main(["demo", "nosuch"]) == 2
    assert "unknown demo 'nosuch'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["explain"])
    assert info.value.code == 2
