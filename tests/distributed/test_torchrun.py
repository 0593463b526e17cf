"""``torchrun --nproc_per_node=2 train.py`` with NeuralDbg inside the user's script: per-rank traces, the job's
merged diagnosis printed by rank 0, and the same diagnosis from the traces with ``neuraldbg explain``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from neuraldbg import cli

SCRIPT = os.path.join(os.path.dirname(__file__), "torchrun_train.py")


def test_torchrun_with_neuraldbg_in_the_users_script_diagnoses_the_job(tmp_path, capsys):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*command, SCRIPT, str(tmp_path), "dead"], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dead_neurons at '3' from step 0 on all ranks" in done.stdout  # rank 0 printed the job's diagnosis
    assert done.stdout.count("NeuralDBG job:") == 1  # only rank 0 did
    for rank in (0, 1):
        with open(tmp_path / f"run.rank{rank}.json", encoding="utf-8") as fh:
            meta = json.load(fh)["meta"]
        assert (meta["rank"], meta["world_size"], meta["backend"]) == (rank, 2, "gloo")
    assert cli.main(["explain", str(tmp_path / "run.rank0.json"), str(tmp_path / "run.rank1.json")]) == 1
    assert "dead_neurons at '3' from step 0 on all ranks" in capsys.readouterr().out
