"""Every ```python block in README.md and docs/*.md runs, on the host driver, as the docs say it does.

A block whose first line is `# ranks: N` is a script for `python -m iris.run -n N`; any other
block runs alone, as `python block.py`. Each starts as a fresh interpreter would (tests/script_batch.py
forks it from a process that has imported torch only: its own globals, folder and output, and the
interpreter's full exit), the blocks of one rank count one after another under one launcher whose
ranks meet between blocks. A block with the line `# prints: the text block above`
(or `below`: the first one after it) must print that ```text block (compared with whitespace
collapsed), so shown output cannot drift from what iris prints. Blocks are the documentation's promises, so each one
asserts what it shows; a block that only illustrates belongs in a ```text fence instead.
"""
import ast
import functools
import os
import re
import warnings
from pathlib import Path

import pytest
import torch
import triton.language as tl

import script_batch

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
RANKS = re.compile(r"\A#\s*ranks:\s*(\d+)\s*$", re.M)
TEXT = re.compile(r"^```text[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
PRINTS, PRINTS_BELOW = "# prints: the text block above", "# prints: the text block below"
TIMEOUT = 180  # seconds a block may run
# the blocks run in batches made by a module fixture: on one worker, each batch once
pytestmark = pytest.mark.xdist_group("test_docs")


def blocks():
    """(id, code, ranks, expected output) for every python block of every page, in page order."""
    out = []
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = page.read_text()
        for i, m in enumerate(FENCE.finditer(text)):
            code = m.group(1)
            line = text[:m.start()].count("\n") + 1
            found = RANKS.match(code)
            shown = [t.group(1) for t in TEXT.finditer(text, 0, m.start())]
            after = TEXT.search(text, m.end())
            expect = shown[-1] if PRINTS in code and shown else \
                after.group(1) if PRINTS_BELOW in code and after else None
            assert (PRINTS not in code and PRINTS_BELOW not in code) or expect, \
                f"{page.name}:{line} promises a text block and has none"
            out.append(pytest.param(code, int(found.group(1)) if found else 0, expect, id=f"{page.name}:{line}"))
    return out


def test_docs_exist_and_have_code():
    pages = {p.name for p in DOCS.glob("*.md")}
    assert {"programming-model.md", "allocators.md", "porting-from-iris.md", "troubleshooting.md"} <= pages
    assert len(blocks()) >= 10


def _probe(out, per):
    """A loop bounded by program_id, run by interpreter_loops_from_program_id."""
    n = 0
    for s in range(tl.program_id(0) * per, per + 1):
        n += 1
    tl.store(out, n)


@functools.lru_cache(maxsize=None)
def interpreter_loops_from_program_id() -> bool:
    """Whether this Triton's interpreter runs a loop bounded by program_id. Triton 3.6's does not under
    NumPy 2 (it converts a one-element array with int()); the collectives' kernels need it. Asked of
    the interpreter in this process (whatever TRITON_INTERPRET says here): a fresh one costs seconds."""
    from triton.runtime.interpreter import InterpretedFunction
    out = torch.zeros(1, dtype=torch.int32)
    try:
        InterpretedFunction(_probe)[(1,)](out, 1)
    except Exception:
        return False
    return out.item() == 2


def _runnable(code) -> bool:
    return "ctx.ccl." not in code or interpreter_loops_from_program_id()


def _forkable(code) -> bool:
    """Whether a block may run forked in a batch: not one that names its parent process, which a job's
    ranks share under a launcher and forked ranks do not."""
    return "os.getppid()" not in code


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """(block id, code, ranks) -> its script_batch.Ran, each block in an empty folder of its own. On first
    use for a rank count, every runnable block of that count that may be forked runs in one batch."""
    root, done = tmp_path_factory.mktemp("blocks"), {}
    env = {k: v for k, v in os.environ.items() if k not in ("IRIS_ALLOCATOR", "IRIS_CHECK_SYMMETRY")}
    env.update(IRIS_PLATFORM="host", TRITON_INTERPRET="1", IRIS_TIMEOUT=os.environ.get("IRIS_TIMEOUT", "60"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))

    def script(name, code):
        folder = root / name
        folder.mkdir()
        (folder / "block.py").write_text(code)
        return str(folder / "block.py"), str(folder)

    def get(block_id, code, ranks):
        if not _forkable(code):
            path, folder = script("alone-" + re.sub(r"\W", "-", block_id), code)
            done[block_id] = script_batch.run_alone(path, ranks, env, folder, TIMEOUT)
        if block_id not in done:
            params = [p for p in blocks() if p.values[1] == ranks and _runnable(p.values[0]) and _forkable(p.values[0])]
            scripts = [script(f"{ranks}-{i}", p.values[0]) for i, p in enumerate(params)]
            results = script_batch.run(str(root / f"batch-{ranks}"), scripts, ranks, env, str(root), TIMEOUT)
            done.update({p.id: r for p, r in zip(params, results)})
        return done[block_id]
    return get


@pytest.mark.parametrize("code,ranks,expect", blocks())
def test_block_runs(code, ranks, expect, ran, request):
    if not _runnable(code):
        pytest.skip("this Triton's interpreter cannot run a loop bounded by program_id (Triton 3.6 under NumPy 2); "
                    "the collectives' host blocks need a newer Triton, as CI installs")
    proc = ran(request.node.callspec.id, code, ranks)
    assert proc.code == 0, f"exit {proc.code}\n--- code ---\n{code}\n--- output ---\n{proc.out}{proc.err}"
    if expect is not None:
        assert " ".join(expect.split()) in " ".join(proc.out.split()), \
            f"the page shows\n{expect}\nbut the block printed\n{proc.out}"


# -- quoted messages and command-line flags match the code -----------------------------------------
SOURCE = None
# what a doc writes in place of a value: 'x', <call>, a lone capital (N, R, O), ..., (...), [...], numbers
PLACEHOLDER = re.compile(r"'[^']*'|<[^>]*>|\b[A-Z]\b|\(\.\.\.\)|\.\.\.|\[[^\]]*\]|0x[0-9a-f.]+|\b\d+(\.\d+)?\b")
QUOTED_ROW = re.compile(r"^\| `([^`]+)`", re.M)              # a table row that starts with a quoted message
QUOTED_BULLET = re.compile(r"^\* \*\*`([^`]+)`", re.M)         # a bullet headed by one
QUOTED_PARA = re.compile(r"^`([^`]+)`:", re.M)                   # a paragraph headed by one (the warnings)


def _source() -> str:
    """Every string literal of iris's source, an f-string's fields as NUL, literals apart by NUL:
    a message spread over several lines reads as the text it prints."""
    global SOURCE
    if SOURCE is None:
        parts = []
        for path in sorted((ROOT / "iris").rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.JoinedStr):
                    parts.append("".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values))
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    parts.append(node.value)
        SOURCE = "\0".join(parts)
    return SOURCE


def _printed(piece: str, source: str) -> bool:
    """Whether iris's literals spell piece, allowing up to three words between them for a value that
    a literal's field prints (`one of {names}` prints `one of cuda, hip, host`)."""
    words, at, covered = piece.split(), 0, 0
    while at < len(words):
        run = next((n for n in range(len(words) - at, 1, -1) if " ".join(words[at:at + n]) in source), 0)
        if run:
            at, covered = at + run, covered + run
            continue
        if len(words) - at <= 3:  # a value at the end
            break
        gap = next((g for g in range(1, 4) if " ".join(words[at + g:at + g + 2]) in source), 0)
        if not gap:
            return False
        at += gap
    return covered >= 0.5 * len(words)


def quoted_messages():
    text = (DOCS / "troubleshooting.md").read_text()
    found = QUOTED_ROW.findall(text) + QUOTED_BULLET.findall(text) + QUOTED_PARA.findall(text)
    return [m for m in found if " " in m and not m.startswith(("cu", "hip", "mmap", "memfd", "open(", "ipc_"))]


def test_troubleshooting_quotes_messages_iris_prints():
    """Every message that troubleshooting.md quotes is in iris's source: each run of four or more
    words between the values it stands for (N, 'x', <call>, ...) is spelled by iris's literals."""
    source, stale = _source(), []
    messages = quoted_messages()
    assert len(messages) > 40, messages
    for message in messages:
        for piece in PLACEHOLDER.split(message):
            piece = (piece or "").strip(" :;,.()")
            if len(piece.split()) >= 4 and not _printed(piece, source):
                stale.append(f"{message!r}: {piece!r}")
    assert not stale, "quoted in docs/troubleshooting.md but printed by nothing in iris/:\n" + "\n".join(stale)


def _as_pattern(doc: str) -> re.Pattern:
    """The documented message as a pattern: its placeholders match any value, the rest as written."""
    out, at = "", 0
    for m in re.finditer(r"'x'|\b[A-Z]\b|\.\.\.", doc):
        out += re.escape(doc[at:m.start()]) + ("'[^']*'" if m.group() == "'x'" else r"\S+" if m.group() != "..." else ".*")
        at = m.end()
    return re.compile(out + re.escape(doc[at:]))


def _raised(fn) -> str:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the message is what is compared
        return str(e)
    raise AssertionError(f"{fn} did not raise")


def test_quoted_messages_are_what_iris_raises(monkeypatch):
    """The quotes with a fixed part that a placeholder could hide (a list of names, a call's name),
    raised for real and compared whole."""
    import iris
    from iris.platform import detect
    def check(start, fn):
        doc = next(m for m in quoted_messages() if m.startswith(start))
        got = _raised(fn)
        assert _as_pattern(doc).fullmatch(got), f"docs/troubleshooting.md quotes\n{doc}\niris raises\n{got}"

    monkeypatch.setenv("IRIS_PLATFORM", "hots")
    check("IRIS_PLATFORM=", detect)
    monkeypatch.setenv("IRIS_PLATFORM", "host")
    monkeypatch.delenv("IRIS_ALLOCATOR", raising=False)
    check("unknown allocator ", lambda: iris.iris(heap_size=1 << 20, allocator="x"))
    ctx = iris.iris(heap_size=1 << 20)
    try:
        x = ctx.zeros(16)
        ctx.free(x)
        check("free: this tensor was freed already", lambda: ctx.free(x))
    finally:
        ctx.close()

    def warns(start, fn):
        doc = next(m for m in quoted_messages() if m.startswith(start))
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            fn().close()
        said = [str(w.message) for w in got]
        assert any(_as_pattern(doc).fullmatch(s) for s in said), f"docs/troubleshooting.md quotes\n{doc}\niris warns\n{said}"

    warns("heap_size=N is not a multiple", lambda: iris.iris(heap_size=(2 << 20) + 1, allocator="vmem"))
    monkeypatch.setenv("IRIS_ALLOCATOR", "vmem")
    warns("IRIS_ALLOCATOR=vmem overrides", lambda: iris.iris(heap_size=2 << 20, allocator="torch"))


# a command line in the docs: the script or command, then its options up to the end of the code span
COMMAND = re.compile(r"(?=(benchmarks/(\w+)\.py|iris (info|bench|trace)\b|python -m iris\.run)([^`\n]*))")


def _declared(target: str) -> set:
    from iris.cli import bench
    if target.startswith("benchmarks/"):
        return bench.declared_options(ROOT / target)
    name = "run" if "iris.run" in target else target.split()[1]
    return bench.declared_options(ROOT / "iris" / "cli" / f"{name}.py") | {"--help"}


def test_flags_in_docs_are_declared():
    """Every --flag written after a benchmark script or an iris command, in the docs, the README and
    the benchmarks' docstrings, is one that script or command declares."""
    pages = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted((ROOT / "benchmarks").glob("*.py"))]
    wrong, seen = [], 0
    for page in pages:
        text = page.read_text()
        if page.suffix == ".py":
            text = text.split('"""')[1] if text.count('"""') >= 2 else ""
        for m in COMMAND.finditer(text):
            target = m.group(1)
            if target.startswith("benchmarks/") and not (ROOT / target).exists():
                wrong.append(f"{page.name}: {target} does not exist")
                continue
            tail = m.group(4).split(" benchmarks/")[0].split(" python ")[0]  # this command's options only
            for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", tail):
                seen += 1
                if flag not in _declared(target):
                    wrong.append(f"{page.name}: {target} {flag}")
    assert seen > 20, seen
    assert not wrong, "flags the code does not declare:\n" + "\n".join(sorted(set(wrong)))


# -- links, the reading order, and one home per figure ----------------------------------------------
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"^```.*?^```", re.S | re.M)


def _anchors(page: Path) -> set:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces as -."""
    text = CODE.sub("", page.read_text())
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, re.M)}


def test_links_reach_a_page_and_a_heading():
    broken = []
    for page in PAGES:
        for target in LINK.findall(CODE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_index_lists_every_page_and_every_page_says_where_next():
    index = (DOCS / "README.md").read_text()
    listed = set(LINK.findall(index))
    missing = [p.name for p in DOCS.glob("*.md") if p.name != "README.md" and p.name not in listed]
    assert not missing, f"docs/README.md does not list {missing}"
    for page in DOCS.glob("*.md"):
        last = page.read_text().rstrip().split("\n\n")[-1]
        assert "Next:" in last and LINK.search(last.split("Next:", 1)[1]), f"{page.name} ends without a next page"


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def test_readme_figures_are_rows_of_performance_md():
    """The README quotes a few headline rows; each is a row of docs/performance.md, word for word,
    and every number in its Performance section appears there, so a figure has one home."""
    section = _section((ROOT / "README.md").read_text(), "## Performance")
    perf = (DOCS / "performance.md").read_text()
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| what")]
    assert 1 <= len(rows) <= 6, f"the README quotes {len(rows)} rows: a few headline figures, the rest in performance.md"
    assert all(row in perf.splitlines() for row in rows), [row for row in rows if row not in perf.splitlines()]
    figures = set(re.findall(r"\d+(?:[.,]\d+)*", section))
    assert not {f for f in figures if f not in perf}, sorted(f for f in figures if f not in perf)


def test_design_md_lists_the_layers_import_linter_enforces():
    layers = re.search(r"^layers = \[\n(.*?)^\]", (ROOT / "pyproject.toml").read_text(), re.S | re.M).group(1)
    enforced = re.findall(r'"([^"]+)"', layers)
    table = [cell.replace("\\|", "|") for cell in
             re.findall(r"^\| `((?:[^`]|`(?! \|))+)` \|", _section((DOCS / "design.md").read_text(), "## Layers"), re.M)]
    assert table == enforced, f"docs/design.md's layers\n{table}\nimport-linter's (pyproject.toml)\n{enforced}"
