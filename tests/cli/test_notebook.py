"""The teaching notebook runs from top to bottom as a reader runs it (on the simulator
here, on a GPU where there is one); its cells assert what each step shows."""

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "deadlock_and_dfccl.ipynb"


def test_the_deadlock_notebook_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()          # a cell that raises fails here, naming the cell
    text = "".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                   for out in cell.get("outputs", []))
    assert "wait-for cycle: rank 0 -> rank 1 -> rank 0" in text
    assert "a budget grew from one try to the next: True" in text
    images = sum("image/png" in out.get("data", {}) for cell in nb.cells
                 if cell.cell_type == "code" for out in cell.get("outputs", []))
    assert images == 3
    assert (tmp_path / "notebook-pictures" / "dfccl-timeline.png").exists()
