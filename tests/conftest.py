"""Shared by every layer of the tests: ``tests/`` on the path, so that ``shared_workers.py``
(rank workers and the values they fill and expect) can be imported by the tests of each
folder and by the rank processes they start (which inherit the path)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

# The files that take longest, longest first (``pytest --durations=0`` measures them). With
# ``-n 2 --dist loadfile`` each worker takes a whole file at a time, in the order of the
# collection; xdist's default order (the files with the most tests first) handed out the
# heaviest files of few tests (the PTX compile, build-kernels) last, where one of them ran
# alone on one worker after the other had finished. Any file not named keeps its place.
SLOWEST_FILES = (
    "tests/unit/test_docs.py",
    "tests/torch/test_torch_api.py",
    "tests/torch/test_torch.py",
    "tests/kernels/test_kernels_compile.py",
    "tests/ranks/test_faults.py",
    "tests/kernels/test_build_kernels.py",
    "tests/ranks/test_net.py",
    "property_tests/test_agreement.py",
    "tests/ranks/test_soak.py",
    "tests/torch/test_torch_faults.py",
    "tests/ranks/test_engine.py",
)


def pytest_configure(config):
    if getattr(config.option, "loadscopereorder", None):
        config.option.loadscopereorder = False     # xdist keeps the order set below


def pytest_collection_modifyitems(items):
    first = {path: i for i, path in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: first.get(item.nodeid.split("::")[0], len(first)))


@pytest.fixture
def standin_driver(tmp_path):
    """``make(source)``: the C ``source`` built as a stand-in ``libcuda.so.1``; returns the
    folder to put on LD_LIBRARY_PATH. Skips where there is no C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler for the stand-in driver")

    def make(source: str) -> str:
        (tmp_path / "cuda.c").write_text(source)
        subprocess.run([compiler, "-shared", "-fPIC", "-o", str(tmp_path / "libcuda.so.1"),
                        str(tmp_path / "cuda.c")], check=True)
        return str(tmp_path)
    return make
