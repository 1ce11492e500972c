"""Writing result files so that an interruption never leaves half a file, and nothing is overwritten unasked;
reading a run's JSON-lines files back with one clear line for whatever is wrong in them.

Public functions
  ``check_writable(path, *, force=False)``  before long work: refuses (``BadInput``) an existing file
      without ``force``, a directory, a missing or non-directory parent, or a place where no file can be
      created (probed by creating and removing a temporary file there, which also works for root,
      whom permission bits do not stop).
  ``check_distinct(*, inputs=(), **outputs)``  refuses (``BadInput``) two output options naming the same file
      (the second write would replace the first, or be refused as existing after the first was written) and an
      output naming one of ``inputs`` (with --force it would replace what the command read).
  ``check_once(paths, *, counts)``  refuses (``BadInput``) an input file given twice, saying why each counts
      once (``counts``): a run given twice would count twice in a spread.
  ``atomic_write(path, data, *, force=False) -> Path``  bytes or text to a temporary file in the same
      directory, flushed and fsynced, then renamed over ``path`` (``os.replace`` is atomic on POSIX):
      a reader sees the old file or the new one, never a torn one.
  ``writable_dir(path, *, what="folder") -> Path``  create a folder (and its parents) and prove a file
      can be made in it; a file in its place or a place that cannot be written is ``BadInput``.
  ``removed_if_left_empty(path)``  a context manager for a command that makes its output folder before work that
      may still refuse (its data, its memory): the folders of ``path`` it made are removed again, if still
      empty, when the block raises; nothing half-made is left behind, and nothing that was there is touched.
  ``atomic_path(path, *, force=False)``  the same for writers that want a file name (matplotlib's
      ``savefig``, a TensorBoard writer): a context manager yielding the temporary path, renamed over
      ``path`` when the block ends without an exception and removed otherwise.
  ``file_bytes(path, limit=None) -> bytes``  a file's bytes (the first ``limit``), decompressed when it is gzip
      (told by its first two bytes, not its name: cluster logs are often shipped as ``.gz``; golden keeps long
      curves so). A damaged gzip file is ``BadInput``; ``OSError`` is left to the caller, who knows what the
      file was for.
  ``reading_once()``  a context manager: within it ``file_bytes`` reads and decompresses each file once and hands
      every later reader the same bytes (up to 1 GiB of them; later files are read each time, as outside). For a
      judgement, which reads each run's log several times (its format, its validation and training losses, its
      per-batch losses, once per verdict) and writes none of them.
  ``once(key, make, nbytes)``  ``make()``, made once per ``key`` within ``reading_once`` and handed to every later
      caller (each call outside it): what is parsed from the files read there (a run's loss curve) is parsed once
      too; ``nbytes(value)``, what it holds, counts against the same budget as the bytes (past it, made each time).
  ``gzip_or_plain(path) -> Path``  ``path + ".gz"`` when that exists, else ``path``: where a run's JSON lines
      are, compacted or not (a finished protocol run keeps its logs gzip: ``convergence.protocol.folder``).
  ``read_json_object(path, *, what, fix=...) -> dict``  the JSON object a file holds (a plan, a run's config),
      gzip or not; a file that cannot be read, is not JSON or holds something else is ``BadInput`` naming it,
      what it should be and ``fix`` (by default: restore it, as a file the suite wrote and the user did not pick).
  ``read_json_lines(path, *, what, hint, need, inside=None) -> list[dict]``  every JSON object of a
      JSON-lines file, gzip or not (``inside`` it when ``path`` is a folder, through ``gzip_or_plain``), blank
      lines and a torn last line (no newline, not JSON: a kill's) skipped; a missing or unreadable file, a line
      that is not a JSON object with the keys ``need`` (of their types), or no record at all is ``BadInput``
      naming the file and line.

Every failure to write (``OSError``: read-only file system, disk full, permission) is raised as
``BadInput`` naming the path, so a command line prints one line and exits 2.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from numerics.errors import BadInput

GZIP_MAGIC = b"\x1f\x8b"  # RFC 1952: every gzip member starts with these two bytes
_NEW_FILE_MODE = 0o644  # what open() gives under the usual umask 022; mkstemp's own 0o600 would hide results


def _refuse_target(path: Path, force: bool) -> None:
    """An output path that is a directory, or an existing file without ``force``."""
    if path.is_dir():
        raise BadInput(f"{path} is a directory; give a file name")
    if path.exists() and not force:
        raise BadInput(f"{path} exists; pass --force to overwrite it")


def _refuse(path: Path, force: bool) -> None:
    _refuse_target(path, force)
    parent = path.parent
    if not parent.exists():
        raise BadInput(f"cannot write {path}: the directory {parent} does not exist")
    if not parent.is_dir():
        raise BadInput(f"cannot write {path}: {parent} is not a directory")


def check_distinct(*, inputs=(), **outputs) -> None:
    """No two outputs name one file, and no output names one of ``inputs`` (with --force it would replace what
    was read: compare's --json over its candidate's log)."""
    seen: dict[Path, str] = {}
    for option, path in outputs.items():
        if path is None:
            continue
        where = Path(path).resolve()
        if where in seen:
            raise BadInput(f"--{seen[where]} and --{option.replace('_', '-')} name the same file ({path})")
        seen[where] = option.replace("_", "-")
    for path in inputs:
        if (where := Path(path).resolve()) in seen:
            raise BadInput(f"--{seen[where]} {path} is one of the inputs: writing it would replace what was read")


def check_once(paths, *, counts: str) -> None:
    seen: set[Path] = set()
    for path in paths:
        where = Path(path).resolve()
        if where in seen:
            raise BadInput(f"{path} is given twice: {counts}")
        seen.add(where)


def check_writable(path, *, force: bool = False) -> Path:
    path = Path(path)
    _refuse(path, force)
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=path.parent)
    except OSError as exc:
        raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(probe)
    return path


def check_creatable(path, *, force: bool = False) -> Path:
    """``check_writable`` for an output whose missing folders the command makes when it writes (``numerics.ep``'s
    --json): the nearest folder that exists must be a writable folder, not a file (a file there raised
    FileExistsError after the whole run)."""
    path = Path(path)
    _refuse_target(path, force)
    near = next((p for p in path.parents if p.exists() or p.is_symlink()), Path("."))
    if not near.is_dir():
        raise BadInput(f"cannot write {path}: {near} is a file, not a folder")
    if not os.access(near, os.W_OK | os.X_OK):
        raise BadInput(f"cannot write {path}: {near} is not writable")
    return path


def writable_dir(path, *, what: str = "folder") -> Path:
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise BadInput(f"{path} is a file, not a {what}")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-test.", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise BadInput(f"cannot write the {what} {path}: {exc.strerror or exc}") from None
    return path


@contextlib.contextmanager
def removed_if_left_empty(path) -> Iterator[Path]:
    path = Path(path).absolute()
    made = [p for p in (path, *path.parents) if not p.exists()]  # the deepest first
    try:
        yield path
    except BaseException:  # bad input and Ctrl-C alike
        for folder in made:
            try:
                folder.rmdir()  # only an empty one: what the block wrote there stays
            except OSError:
                break
        raise


@contextlib.contextmanager
def atomic_path(path, *, force: bool = False) -> Iterator[Path]:
    path = Path(path)
    _refuse(path, force)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        tmp.chmod(path.stat().st_mode & 0o7777 if path.exists() else _NEW_FILE_MODE)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path, data: bytes | str, *, force: bool = False) -> Path:
    path = Path(path)
    with atomic_path(path, force=force) as tmp:
        try:
            with open(tmp, "wb") as f:
                f.write(data.encode() if isinstance(data, str) else data)
        except OSError as exc:
            raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


_ONCE: dict[Path, bytes] | None = None  # the files read so far while ``reading_once`` is active
_KEPT = 0  # their bytes and what ``once`` keeps, in all, against _ONCE_BUDGET
_MADE: dict | None = None  # what ``once`` made so far while ``reading_once`` is active
# what ``reading_once`` keeps at most (files' bytes and what is made from them); files read after it is full are read
# as before, each time. 1 GiB holds ~1,600 logs of the proxy's 1,500-step runs (0.65 MB each at most, per-batch
# losses included) with their parsed curves: a large plan's judgement gains the repeated reads without holding every
# log of a long run in memory
_ONCE_BUDGET = 1 << 30


@contextlib.contextmanager
def reading_once() -> Iterator[None]:
    """Within: each file is read once (measured: re-judging golden's 64-run plan read its 64 logs 768 times and
    decompressed them 2,244 times; read once each, a re-judging took 6.9-7.3 s of CPU instead of 7.9-8.7 s). Nested
    uses share the outer one's bytes."""
    global _ONCE, _MADE, _KEPT
    if _ONCE is not None:
        yield
        return
    _ONCE, _MADE, _KEPT = {}, {}, 0
    try:
        yield
    finally:
        _ONCE = _MADE = None


def once(key, make, nbytes):
    global _KEPT
    if _MADE is None:
        return make()
    if key in _MADE:
        return _MADE[key]
    value = make()
    size = nbytes(value)
    if _KEPT + size <= _ONCE_BUDGET:
        _MADE[key] = value
        _KEPT += size
    return value


def file_bytes(path, limit: int | None = None) -> bytes:
    global _KEPT
    if _ONCE is None:
        return _read(Path(path), limit)
    key = Path(path).resolve()
    data = _ONCE.get(key)
    if data is None:
        data = _read(Path(path), None)  # whole: a later reader wants the rest
        if _KEPT + len(data) <= _ONCE_BUDGET:
            _ONCE[key] = data
            _KEPT += len(data)
    return data if limit is None else data[:limit]


def _read(path: Path, limit: int | None) -> bytes:
    import gzip
    import zlib

    with open(path, "rb") as f:
        raw = f.read(-1 if limit is None else limit)
    if not raw.startswith(GZIP_MAGIC):
        return raw
    try:
        if limit is None:
            return gzip.decompress(raw)
        with gzip.open(path) as g:
            return g.read(limit)
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise BadInput(f"{path}: a damaged gzip file ({exc or 'cut short'})") from None


def read_json_object(path, *, what: str, fix: str = "restore it, e.g. from git") -> dict:
    path = Path(path)
    try:
        value = json.loads(file_bytes(path).decode("utf-8"))  # gzip-aware, as the logs beside it are
    except OSError as exc:
        raise BadInput(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both are
        raise BadInput(f"{path}: not {what} (not JSON: {exc}); {fix}") from None
    if not isinstance(value, dict):
        raise BadInput(f"{path}: not {what} (a JSON {type(value).__name__}, not an object); {fix}")
    return value


def gzip_or_plain(path) -> Path:
    """Both exist only after a crash between writing the gzip (atomically: whole) and removing the plain file,
    so the gzip wins."""
    path = Path(path)
    packed = path.with_name(path.name + ".gz")
    return packed if packed.exists() else path


def read_json_lines(path, *, what: str, hint: str, need: dict[str, type], inside: str | None = None) -> list[dict]:
    import json

    path = Path(path)
    if inside and path.is_dir():
        path = gzip_or_plain(path / inside)
    try:
        text = file_bytes(path).decode("utf-8")
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file ({hint})") from None
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not a {what} (not UTF-8 text)") from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot read it ({exc.strerror or exc})") from None
    records = []
    lines = text.splitlines(keepends=True)
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines) and not line.endswith("\n"):
                break  # a last line without its newline: torn by a kill while it was written (JsonlLog.records)
            raise BadInput(f"{path}:{n}: not a JSON line") from None
        if not isinstance(rec, dict) or not all(isinstance(rec.get(k), t) for k, t in need.items()):
            keys = " and ".join(f'"{k}"' for k in need)
            raise BadInput(f"{path}:{n}: not a {what} record (a JSON object with {keys})")
        records.append(rec)
    if not records:
        raise BadInput(f"{path}: no {what} records")
    return records

