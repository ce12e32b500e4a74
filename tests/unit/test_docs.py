"""The documentation works as written: its examples run, its links resolve, it carries no
dates, and the API reference names every public name.

Every fenced code block of README.md and docs/*.md that a reader would run is run here,
exactly as written, on the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``), in a scratch
directory of its document where ``examples/`` and ``scripts/`` are the repository's, with
this interpreter's ``bin`` first on ``PATH`` (so ``python``, ``torchrun`` and ``mpiexec``
are the environment's) and the repository first on ``PYTHONPATH``:

- ``sh`` blocks line by line, each line in a fresh ``bash`` (a line ending in ``\\`` goes
  on; lines starting with ``#`` are comments), which must exit with status 0;
- ``python`` blocks as scripts: those of one document in one interpreter, in document
  order, each seeing the names the earlier ones left (as a reader would type them into one
  session);
- blocks of any other language (``text``: output, signatures; ``json``; none) are not run.

An HTML comment on the line before a fence (invisible when rendered) changes that:

- ``<!-- file: NAME -->``: the python block is saved as NAME in the scratch directory, not
  run by itself; the document's shell blocks run it (``python NAME``), as a reader saves
  and runs it. Programs that use ``pydfccl.launch`` must be files: the rank processes are
  spawned and import the script again.
- ``<!-- exit status: N -->``: every line of the shell block must exit with status N (the
  deadlock demos exit with 3).
- ``<!-- needs: torch -->``: skipped where torch is not installed.
- ``<!-- not run: REASON -->``: not run here, for REASON. Kept few (``MAX_NOT_RUN``): the
  README's install and test commands (what CI's ``.ci/run`` does itself: creating a
  virtualenv and installing into it, and the whole test suite, this test among it), and
  commands that need a GPU, a package index or a known bug fixed.

A shell line run before, with the same saved files, is not run again (the README and the
quick start show the same demo).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
MAX_NOT_RUN = 8          # blocks marked not runnable, over all the docs
LINE_TIMEOUT = 240       # seconds for one shell line or one document's python blocks

FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)\s*$")
MARK = re.compile(r"^\s*<!--\s*(file|exit status|needs|not run)\s*:\s*(.*?)\s*-->\s*$")


@dataclass
class Block:
    doc: Path
    line: int                # 1-based line of the opening fence
    lang: str
    text: str
    marks: dict = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def blocks(doc: Path) -> list[Block]:
    """The fenced blocks of ``doc`` with the marks on the lines right before each."""
    lines = doc.read_text().split("\n")
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks, lang = m.groups()
        start, marks, j = i, {}, i - 1
        while j >= 0 and MARK.match(lines[j]):
            key, value = MARK.match(lines[j]).groups()
            marks[key] = value
            j -= 1
        body, i = [], i + 1
        while i < len(lines) and lines[i].strip() != ticks:
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            i += 1
        found.append(Block(doc, start + 1, lang, "\n".join(body) + "\n", marks))
        i += 1
    return found


def shell_lines(text: str) -> list[str]:
    out, pending = [], ""
    for raw in text.split("\n"):
        line = pending + raw
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line.strip() and not line.strip().startswith("#"):
            out.append(line.strip())
    return out


def have_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def environment() -> dict:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"]
                                     if env.get("PYTHONPATH") else "")
    env.pop("PYDFCCL_BACKEND", None)     # the docs' defaults, whatever the caller set
    return env


def scratch(tmp_path: Path) -> Path:
    for name in ("examples", "scripts"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


def run(cmd, cwd: Path, where: str, expect: int = 0) -> None:
    proc = subprocess.run(cmd, cwd=cwd, env=environment(), capture_output=True, text=True,
                          timeout=LINE_TIMEOUT)
    if proc.returncode != expect:
        shown = " ".join(cmd) if isinstance(cmd, list) else cmd
        pytest.fail(f"{where}: `{shown}` exited with {proc.returncode}, expected {expect}\n"
                    f"--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n"
                    f"{proc.stderr[-3000:]}")


# The python blocks of one document, run in one interpreter in order; a failure names the
# block (its code objects carry the document and line as their file name).
DRIVER = """
import json, sys, traceback
blocks = json.load(open(sys.argv[1]))
names = {"__name__": "__main__"}
for where, text in blocks:
    try:
        exec(compile(text, where, "exec"), names)
    except SystemExit as exc:
        if exc.code not in (0, None):
            print(f"{where}: SystemExit({exc.code})", file=sys.stderr)
            sys.exit(1)
    except BaseException:
        traceback.print_exc()
        print(f"FAILED in the block at {where}", file=sys.stderr)
        sys.exit(1)
"""

_already_run: set = set()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_run_as_written(doc, tmp_path):
    cwd = scratch(tmp_path)
    files: dict[str, str] = {}
    session = []
    for block in blocks(doc):
        if "not run" in block.marks:
            assert block.marks["not run"], f"{block.where}: say why it is not run"
            continue
        if block.marks.get("needs") == "torch" and not have_torch():
            continue
        if block.lang == "python":
            if "file" in block.marks:
                name = block.marks["file"]
                files[name] = block.text
                (cwd / name).write_text(block.text)
            else:
                session.append((block.where, block.text))
        elif block.lang == "sh":
            expect = int(block.marks.get("exit status", 0))
            for line in shell_lines(block.text):
                used = tuple(sorted((n, t) for n, t in files.items() if n in line))
                if (line, used) in _already_run:
                    continue
                run(["bash", "-c", line], cwd, f"{block.where} ({line})", expect)
                _already_run.add((line, used))
    if session:
        (cwd / "_blocks.json").write_text(json.dumps(session))
        (cwd / "_driver.py").write_text(DRIVER)
        run([sys.executable, "_driver.py", "_blocks.json"], cwd,
            f"{doc.relative_to(ROOT)}'s python blocks")


LANGUAGES = {"python", "sh", "text", "json", ""}   # run: python and sh; the rest are shown


def test_blocks_are_run_or_shown_on_purpose():
    """A block in another language (``bash``, ``console``, ``py``) would be skipped
    silently; and a saved file that no shell line of its document runs (by its name, or a
    policy module by ``module:name``) is an example nobody runs."""
    for doc in DOCS:
        found = blocks(doc)
        commands = " ".join(line for b in found if b.lang == "sh"
                            for line in shell_lines(b.text))
        for block in found:
            assert block.lang in LANGUAGES, (
                f"{block.where}: language {block.lang!r}; use one of {sorted(LANGUAGES)}")
            name = block.marks.get("file")
            if name and "not run" not in block.marks:
                module = name[:-3] + ":" if name.endswith(".py") else None   # module:policy
                assert name in commands or (module and module in commands), (
                    f"{block.where}: no shell line runs {name}")


def test_few_blocks_are_marked_not_runnable():
    marked = [b.where for doc in DOCS for b in blocks(doc) if "not run" in b.marks]
    assert len(marked) <= MAX_NOT_RUN, (
        f"{len(marked)} blocks are marked not runnable (at most {MAX_NOT_RUN}): {marked}")


def test_marks_are_known_and_placed():
    """A mark applies to the block right after it: a mark followed by anything else is
    a typo or a leftover."""
    for doc in DOCS:
        lines = doc.read_text().split("\n")
        for i, line in enumerate(lines):
            if "<!--" not in line:
                continue
            where = f"{doc.relative_to(ROOT)}:{i + 1}"
            if re.search(r"<!--\s*(file|exit status|needs|not run)\b", line):
                assert MARK.match(line), f"{where}: malformed mark {line.strip()!r}"
                rest = lines[i + 1:]
                following = next(l for l in rest if not MARK.match(l))
                assert FENCE.match(following), f"{where}: a mark must precede a fence"
    for doc in DOCS:
        for block in blocks(doc):
            if "file" in block.marks:
                assert block.lang == "python", f"{block.where}: only python blocks are files"
            if "exit status" in block.marks:
                assert block.lang == "sh", f"{block.where}: exit status is for shell blocks"
                assert block.marks["exit status"].isdigit(), f"{block.where}: a number"
            if "needs" in block.marks:
                assert block.marks["needs"] == "torch", f"{block.where}: needs torch only"


DATE = re.compile(r"\b(19|20)\d\d-[01]\d-[0-3]\d\b")
CLOCK = re.compile(r"\b([01]?\d|2[0-3]):[0-5]\d(:[0-5]\d)?\b")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_dates_or_clock_times(doc):
    """Documentation for users says what is true, not when it was found: dates belong in
    CHANGELOG.md, and results name the commit they were measured at."""
    for n, line in enumerate(doc.read_text().split("\n"), 1):
        for pattern in (DATE, CLOCK):
            m = pattern.search(line)
            assert not m, f"{doc.relative_to(ROOT)}:{n}: {m.group(0)!r} in {line.strip()!r}"


CODE = sorted((ROOT / "pydfccl").rglob("*.py")) + sorted(
    path for folder in ("examples", "scripts") for path in (ROOT / folder).rglob("*")
    if path.suffix in (".py", ".sh", ".md") and "__pycache__" not in path.parts)


def prose(path: Path):
    """(line, text) of what a reader of ``path`` reads as prose: a Python file's comments
    and docstrings (string statements), not its code (where ``1:20`` is a slice); every
    line of a shell script or a Markdown file."""
    if path.suffix != ".py":
        yield from enumerate(path.read_text().split("\n"), 1)
        return
    statement_start = (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.NL,
                       tokenize.ENCODING)
    previous = tokenize.NEWLINE
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING
                                            and previous in statement_start):
            yield tok.start[0], tok.string
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            previous = tok.type


def test_prose_reader_sees_comments_and_docstrings_only(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('"""Module, 2020-01-02."""\nx = "12:30"[1:20]  # at 09:15\n'
                    'def f():\n    """Done at 23:59."""\n    return "2020-01-02"\n')
    assert [n for n, text in prose(path) for pattern in (DATE, CLOCK)
            if pattern.search(text)] == [1, 2, 4]


@pytest.mark.parametrize("path", CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_dates_or_clock_times_in_code_comments(path):
    """The library's comments and docstrings, the examples and the scripts state facts, not
    when they were found (measured figures say what machine, e.g. "on an H200")."""
    for n, text in prose(path):
        for pattern in (DATE, CLOCK):
            m = pattern.search(text)
            assert not m, f"{path.relative_to(ROOT)}:{n}: {m.group(0)!r} in {text.strip()!r}"


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    """Links to other files of the repository, and to headings of the docs, exist."""
    text = doc.read_text()
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        assert dest.exists(), f"{doc.relative_to(ROOT)}: link to missing {target}"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), (
                f"{doc.relative_to(ROOT)}: no heading #{anchor} in {path or doc.name}")


def anchors(doc: Path) -> set:
    """GitHub's anchors of a document's headings (lower case, punctuation dropped, spaces
    as hyphens), outside code blocks."""
    out, in_code = set(), False
    for line in doc.read_text().split("\n"):
        if FENCE.match(line):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_api_reference_names_every_public_name():
    """docs/api.md is the reference beside the docstrings: every name the package exports,
    every public method of Communicator and every WorldConfig field is in it."""
    import dataclasses

    import pydfccl
    from pydfccl import Communicator, WorldConfig

    text = (ROOT / "docs" / "api.md").read_text()
    names = set(pydfccl.__all__)
    names |= {n for n, v in vars(Communicator).items() if not n.startswith("_")
              and (callable(v) or isinstance(v, (classmethod, staticmethod, property)))}
    names |= {f.name for f in dataclasses.fields(WorldConfig)}
    if have_torch():
        import pydfccl.torch
        names |= set(pydfccl.torch.__all__)
    missing = sorted(n for n in names if not re.search(rf"\b{re.escape(n)}\b", text))
    assert not missing, f"docs/api.md does not document {missing}"
