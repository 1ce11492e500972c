"""Token streams for training: the embedded default corpus, user datasets, tokenizers, batching.

Public: ``load_tokens(spec) -> TokenData``, ``DataSpec``, ``Batches``, ``ByteTokenizer``,
``bpe_tokenizer(texts, vocab_size, cache_dir)``, ``default_corpus_documents()``, ``check_same_data(config, meta)``,
``describe_tokens(meta)``, ``check_val_percent(percent)``.

* Default corpus: the running Python's standard library — its ``.py`` sources (code and docstrings) and
  its documentation topics (``pydoc_data/topics.py``) — present on every machine with no download. Test
  suites are left out. Each file is cleaned the same way everywhere (UTF-8 only, ``\\r\\n`` -> ``\\n``,
  trailing whitespace stripped, runs of blank lines collapsed) and goes to validation when the first
  8 hex digits of the SHA-256 of its relative path, mod 100, are below 2 (2 %), else to train. The
  corpus therefore depends only on the Python version (recorded with a digest in config.json).
* User data: text files (one document each), JSONL (field ``text``, one document per line), Parquet
  (column ``text``; needs pyarrow), split by the same hash of the document's index (a file of one document: its
  last percent of characters, from a line start, is validation); or a pre-tokenized
  ``.bin`` of uint16/uint32 token ids, whose last 1 % is validation.
* Tokenizers: bytes by default (vocabulary 256; documents joined by a 0 byte, which clean text never
  holds); or a byte-level BPE trained with the ``tokenizers`` package on the train split once and cached.
* Batching (``Batches``) is a pure function of (seed, step) (and of ``row_seed``, which only reorders a
  batch's rows): every recipe of a paired run sees the same tokens in the same order, and a resumed run
  continues from its step with nothing else to restore.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from numerics.errors import BadInput

VAL_PERCENT = 2
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "dist-packages"}


@dataclass(frozen=True)
class DataSpec:
    path: str | None = None  # None: the embedded standard-library corpus
    tokenizer: str = "byte"  # "byte" or "bpe"
    bpe_vocab: int = 4096
    bin_dtype: str = "uint16"  # for .bin inputs
    cache_dir: str | None = None  # where a trained BPE tokenizer is kept (default ~/.cache/mxval)
    val_percent: int | None = None  # held-out share: None is VAL_PERCENT of the documents (1 % of a .bin)


@dataclass
class TokenData:
    train: np.ndarray  # 1-D token ids
    val: np.ndarray
    vocab_size: int
    meta: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------------------ corpus
def _clean(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    text = re.sub(r"[ \t\f\v]+\n", "\n", text + "\n")
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def _is_val(key: str, percent: int) -> bool:
    """Whether a document is held out: by its key's hash, so a larger percent holds out a superset."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 100 < percent


def default_corpus_documents() -> Iterator[tuple[str, str]]:
    """(relative path, cleaned text) of the standard library's sources and docs, in sorted order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _SKIP_DIRS & set(rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) >= 200:
            yield rel.as_posix(), _clean(text)


def _user_documents(path: Path) -> Iterator[str]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield json.loads(line)["text"]
                    except (json.JSONDecodeError, KeyError, TypeError):
                        raise BadInput(f"{path}:{n}: expected a JSON object with a 'text' field") from None
    elif suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise BadInput("reading Parquet needs pyarrow: pip install pyarrow") from None
        table = pq.read_table(path, columns=["text"])
        yield from (t for t in table.column("text").to_pylist() if t)
    else:
        try:
            yield path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise BadInput(f"{path} is not UTF-8 text (pre-tokenized data must end in .bin)") from None


# the largest vocabulary a .bin's ids may ask for: above every tokenizer in use (the largest, ~262k ids), far
# below what uint16 ids read as uint32 give (two ids joined: ~65,536 x the first; an embedding of billions of rows)
MAX_BIN_VOCAB = 1 << 21


def _read_bin(path: Path, dtype: str) -> np.ndarray:
    """A pre-tokenized file's ids, refused when they were evidently written as the other --data-dtype (read
    as it, a run trains on halves or pairs of ids, in silence)."""
    size, width = path.stat().st_size, np.dtype(dtype).itemsize
    if size % width:
        raise BadInput(f"data {path} holds {size} bytes, not a whole number of {dtype} ids ({width} bytes each): "
                       "is --data-dtype right?")
    ids = np.fromfile(path, dtype=np.dtype(dtype))
    # uint32 ids below 65,536 read as uint16: every second id is a zero high half (little-endian). 64 ids or more:
    # a real uint16 stream with 32 zero ids in every other place is not text
    if dtype == "uint16" and len(ids) >= 64 and not ids[1::2].any() and ids[0::2].any():
        raise BadInput(f"data {path} reads as uint32 ids (every second uint16 is 0): pass --data-dtype uint32")
    if len(ids) and int(ids.max()) >= MAX_BIN_VOCAB:
        raise BadInput(f"data {path} holds ids up to {int(ids.max()):,}, more than any tokenizer's vocabulary "
                       f"({MAX_BIN_VOCAB:,} at most here): is it uint16 ids read as {dtype}? (--data-dtype)")
    return ids


def _split_tail(text: str, percent: int, path: Path) -> tuple[list[str], list[str]]:
    """One document split in two: its last ``percent`` % of characters (from the line start nearest the cut)
    held out. A document is held out whole or not at all by ``_split_docs``, so a file of one document would
    otherwise validate on its own training text."""
    cut = len(text) * (100 - percent) // 100
    line = text.rfind("\n", 0, cut) + 1
    if line > len(text) // 2:  # the nearest line start, unless the lines are so long it would hold out half
        cut = line
    if not 0 < cut < len(text):
        raise BadInput(f"data {path} is one document of {len(text)} characters: too short to hold out {percent} % "
                       "for validation")
    return [text[:cut]], [text[cut:]]


def _split_docs(docs: Iterable[tuple[str, str]], percent: int | None) -> tuple[list[str], list[str]]:
    train, val = [], []
    for key, text in docs:
        (val if _is_val(key, VAL_PERCENT if percent is None else percent) else train).append(text)
    return train, val


# ------------------------------------------------------------------------------------------ tokenizers
class ByteTokenizer:
    name = "byte"
    vocab_size = 256

    def encode_documents(self, docs: list[str]) -> np.ndarray:
        return np.frombuffer("\x00".join(docs).encode("utf-8"), dtype=np.uint8).astype(np.uint16)


class _BPE:
    name = "bpe"

    def __init__(self, tok, path: Path):
        self.tok, self.path = tok, path
        self.vocab_size = tok.get_vocab_size()

    def encode_documents(self, docs: list[str]) -> np.ndarray:
        ids: list[int] = []
        for enc in self.tok.encode_batch(docs):
            ids.extend(enc.ids)
            ids.append(0)  # "<|doc|>" separator, id 0 by construction
        return np.asarray(ids, dtype=np.uint32 if self.vocab_size > 65535 else np.uint16)


def bpe_tokenizer(train_docs: list[str], vocab_size: int, cache_dir: Path) -> _BPE:
    """A byte-level BPE trained on ``train_docs`` once; later calls load it from ``cache_dir``."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise BadInput("the BPE tokenizer (--tokenizer bpe, the 16b's default) needs the tokenizers package: "
                       "pip install 'mxval[bpe]', or pass --tokenizer byte") from None
    h = hashlib.sha256()
    for d in train_docs:
        h.update(d.encode())
    path = cache_dir / f"bpe-{vocab_size}-{h.hexdigest()[:16]}.json"
    if path.exists():
        return _BPE(Tokenizer.from_file(str(path)), path)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|doc|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(train_docs, trainer=trainer)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tok.save(str(tmp))
    os.replace(tmp, path)
    return _BPE(tok, path)


# ------------------------------------------------------------------------------------------ loading
def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


def load_tokens(spec: DataSpec) -> TokenData:
    """Read, clean, split and tokenize the data a run trains on (the same for every recipe)."""
    if spec.tokenizer not in ("byte", "bpe"):
        raise BadInput(f"unknown tokenizer {spec.tokenizer!r}; choose from byte, bpe")
    meta: dict = {"source": spec.path or "python-stdlib", "tokenizer": spec.tokenizer}
    if spec.path is not None:
        path = check_data_path(spec.path)
        if path.suffix.lower() == ".bin":
            if spec.bin_dtype not in ("uint16", "uint32"):
                raise BadInput(f"--data-dtype must be uint16 or uint32, got {spec.bin_dtype!r}")
            ids = _read_bin(path, spec.bin_dtype)
            n_val = len(ids) * (spec.val_percent or 1) // 100
            train, val = ids[: len(ids) - n_val], ids[len(ids) - n_val:]
            vocab = int(ids.max()) + 1 if len(ids) else 0
            meta.update(tokenizer="pre-tokenized", bin_dtype=spec.bin_dtype)
            return _finish(train, val, vocab, meta)
        docs = list(enumerate(_user_documents(path)))
        if len(docs) == 1:  # a single text file: hold out its tail, never the text it trains on (nor all of it)
            train_docs, val_docs = _split_tail(docs[0][1], spec.val_percent or VAL_PERCENT, path)
            meta["held_out"] = f"the last {spec.val_percent or VAL_PERCENT} % of its one document"
        else:
            train_docs, val_docs = _split_docs(((str(i), d) for i, d in docs), spec.val_percent)
    else:
        import sys

        meta["python"] = sys.version.split()[0]
        train_docs, val_docs = _split_docs(default_corpus_documents(), spec.val_percent)
    if not train_docs:
        raise BadInput(f"data {meta['source']} holds no training documents")
    if not val_docs:  # tiny inputs: hold out the last document rather than run without validation
        train_docs, val_docs = train_docs[:-1] or train_docs, train_docs[-1:]
    if spec.tokenizer == "bpe":
        cache = Path(spec.cache_dir or Path.home() / ".cache" / "mxval")
        tok = bpe_tokenizer(train_docs, spec.bpe_vocab, cache)
        meta["bpe_file"] = str(tok.path)
    else:
        tok = ByteTokenizer()
    meta.update(documents={"train": len(train_docs), "val": len(val_docs)})
    return _finish(tok.encode_documents(train_docs), tok.encode_documents(val_docs), tok.vocab_size, meta)


def check_same_data(config_path: Path, meta: dict) -> None:
    """Refuse (one line) to continue or join the run whose ``config.json`` is ``config_path`` on other tokens than
    it trained on: the default corpus is the running Python's standard library, so another Python version (or an
    edited data file) gives other tokens under the same command line. A run whose config.json holds no data
    digests is not checked."""
    try:
        had = json.loads(Path(config_path).read_text()).get("data") or {}
    except (OSError, ValueError):
        return  # a run without a readable config is refused, or rewritten, by its own checks
    if not had.get("digest") or had.get("digest") == meta.get("digest"):
        return
    raise BadInput(f"{config_path.parent} trained on {describe_tokens(had)}, this machine reads "
                   f"{describe_tokens(meta)}: continue it where the data are the same (for the default corpus, the "
                   "same Python version), or start again")


def describe_tokens(meta: dict) -> str:
    """A ``TokenData.meta`` in words, to tell two token streams apart: source, Python, digests."""
    digest = meta.get("digest") or {}
    src = f"{meta.get('source', '?')}" + (f" of Python {meta['python']}" if meta.get("python") else "")
    return f"{src} (train {digest.get('train')}, val {digest.get('val')})"


def check_data_path(path) -> Path:
    """A --data path that can be read as a non-empty file (its contents are checked when it is read:
    ``load_tokens``)."""
    path = Path(path)
    if not path.exists():
        raise BadInput(f"data path {path} does not exist")
    if path.is_dir():
        raise BadInput(f"data path {path} is a directory; pass a .txt/.jsonl/.parquet/.bin file")
    if path.stat().st_size == 0:  # found before a protocol records the path, not only when the tokens are read
        raise BadInput(f"data path {path} is empty")
    return path


def check_val_percent(percent: int | None) -> None:
    """``--val-percent``: 1 to 50 (None: the default split); above half a run would hold out more than it
    trains on."""
    if percent is not None and not 1 <= percent <= 50:
        raise BadInput(f"--val-percent must be from 1 to 50, got {percent}")


def _finish(train: np.ndarray, val: np.ndarray, vocab: int, meta: dict) -> TokenData:
    meta.update(
        tokens={"train": int(len(train)), "val": int(len(val))},
        digest={"train": _digest(train), "val": _digest(val)},
        vocab_size=vocab,
    )
    return TokenData(train=train, val=val, vocab_size=vocab, meta=meta)


# ------------------------------------------------------------------------------------------ batching
class Batches:
    """Windows of seq+1 tokens, shuffled per epoch by (seed, epoch); batch ``step`` is a pure function.

    ``row_seed`` (None: rows as drawn) permutes the rows of each batch by (row_seed, step): the same tokens
    in the same step, summed in another order by every reduction over the batch (weight gradients, the
    loss) -- a benign perturbation of one rounding per sum, with nothing else changed."""

    def __init__(self, tokens: np.ndarray, *, batch: int, seq: int, seed: int, row_seed: int | None = None):
        self.tokens, self.batch, self.seq, self.seed, self.row_seed = tokens, batch, seq, seed, row_seed
        self.windows = (len(tokens) - 1) // seq
        if self.windows < batch:
            raise BadInput(
                f"the data yields {len(tokens)} training tokens, fewer than one batch "
                f"({batch} x {seq} + 1 = {batch * seq + 1})"
            )
        self._perm: tuple[int, np.ndarray] | None = None

    def _order(self, epoch: int) -> np.ndarray:
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.windows))
        return self._perm[1]

    def batch_at(self, step: int) -> torch.Tensor:
        """[batch, seq + 1] int64 tokens of training step ``step`` (0-based)."""
        rows = []
        for sample in range(step * self.batch, (step + 1) * self.batch):
            w = int(self._order(sample // self.windows)[sample % self.windows])
            rows.append(self.tokens[w * self.seq: w * self.seq + self.seq + 1].astype(np.int64))
        if self.row_seed is not None:
            rows = [rows[i] for i in np.random.default_rng([self.row_seed, step]).permutation(self.batch)]
        return torch.from_numpy(np.stack(rows))

    def eval_count(self, max_batches: int) -> int:
        """How many batches ``eval_batches(max_batches)`` yields: all the split holds when that is fewer."""
        return min(max_batches, self.windows // self.batch)

    def eval_batches(self, max_batches: int) -> Iterator[torch.Tensor]:
        """``max_batches`` batches of consecutive windows, spread evenly over the split (all of it when it holds
        no more), in order, no shuffle: the same validation set at every evaluation, drawn from across the
        held-out documents rather than from the first few (a tiny-model pilot: 6 rounding replicates' spread
        1.19 % on the first 32 batches, 0.89 % on 180 spread ones)."""
        available = self.windows // self.batch
        count = self.eval_count(max_batches)
        for i in range(count):
            b = i * available // count
            idx = range(b * self.batch, (b + 1) * self.batch)
            yield torch.from_numpy(np.stack(
                [self.tokens[w * self.seq: w * self.seq + self.seq + 1].astype(np.int64) for w in idx]
            ))
