"""Every notebook executes as a user opens it: as shipped (no parameter replaced, no path injected), its kernel
started in notebooks/, on the results committed for its default profile (a copy: running it renders figures), and
says first which profile it shows and what that profile can show."""
import shutil
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """notebooks/ and the committed results its notebooks default to, laid out as in the repository."""
    root = tmp_path_factory.mktemp("checkout")
    shutil.copytree(ROOT / "notebooks", root / "notebooks")
    shutil.copytree(ROOT / "results" / "tiny", root / "results" / "tiny")
    return root


@pytest.mark.parametrize("name", ["ablation", "per_position", "verify"])
def test_notebook_runs_as_shipped_from_its_folder(name, checkout):
    nb = nbformat.read(checkout / "notebooks" / f"{name}.ipynb", as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "store notebooks without outputs"
    (param,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert 'PROFILE = "tiny"' in param.source and 'RESULTS = "results"' in param.source  # committed defaults
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(checkout / "notebooks")}}).execute()
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, "the notebook shows the rendered figures"
    said = [o["data"]["text/markdown"] for c in nb.cells for o in c.get("outputs", []) if "text/markdown" in
            o.get("data", {})]
    assert said and said[0].startswith("**A smoke run** (`tiny`"), "the first thing shown: what the profile can show"
    assert "It opens on `tiny`, the committed CPU **smoke run**" in nb.cells[0].source  # and the introduction
    if name == "verify":  # the study's models, as REPORT.md names them (in bold when left from earlier models)
        assert said[1].startswith("Models: the study's runs at ")
    assert not (checkout / "notebooks" / "results").exists()  # nothing written beside the notebooks


def test_a_relative_results_folder_is_found_above_the_working_directory(tmp_path, monkeypatch):
    from dmtp.analysis.report import find_results

    (tmp_path / "results" / "tiny").mkdir(parents=True)
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    assert find_results("results") == tmp_path.resolve() / "results"
    assert find_results(tmp_path / "elsewhere") == tmp_path / "elsewhere"  # absolute: as given
    assert find_results("no_such_folder") == Path("no_such_folder")
