"""Output locations: checked writable before any work, and written all at once or not at all.

``check_output_dir`` / ``check_output_file`` refuse, up front, an ``--out`` that is a file, lies under a
file, or cannot be written (tried, not guessed from mode bits: root, read-only mounts and immutable
directories all answer for themselves). ``staged(out)`` gives a directory beside ``out`` to write a
command's outputs into; they replace their counterparts in ``out`` only when the command succeeds.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path

from specrank.atomic import make_parents, remove_empty, replace_dir


class OutputError(ValueError):
    """An output location that cannot be written."""


def existing_ancestor(path: Path) -> Path:
    """``path`` itself if it exists, else its nearest existing parent."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _probe(directory: Path, what: str, path: Path) -> None:
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".specrank-probe-")
    except OSError as exc:
        raise OutputError(f"{what} {path}: cannot write in {directory} ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(tmp)


def check_output_dir(path, what: str = "--out") -> Path:
    """``path`` as a Path, refused unless it is (or can be created as) a writable directory; creates nothing."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise OutputError(f"{what} {path}: exists and is not a directory")
    base = existing_ancestor(path)
    if not base.is_dir():
        raise OutputError(f"{what} {path}: {base} is not a directory")
    _probe(base, what, path)
    return path


def check_output_file(path, what: str = "--out") -> Path:
    """``path`` as a Path, refused unless a file can be written there; creates nothing."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise OutputError(f"{what} {path}: is a directory, expected a file name")
    check_output_dir(path.parent, what)
    return path


def check_distinct(outputs: dict, inputs: dict | None = None) -> None:
    """Refuse two outputs that are one file, and an output that is one of ``inputs`` (writing it would
    replace what is being read). Both map a flag (``--out``) to a path or None; paths are compared resolved."""
    seen: dict[Path, str] = {}
    for what, path in outputs.items():
        if path is None:
            continue
        key = Path(path).expanduser().resolve()
        if key in seen:
            raise OutputError(f"{what} {path}: the same file as {seen[key]}; give each output its own path")
        seen[key] = what
    for what, path in (inputs or {}).items():
        key = Path(path).expanduser().resolve() if path is not None else None
        if key in seen:
            raise OutputError(f"{seen[key]} {path}: is the input {what}, which writing would replace")


@contextmanager
def restoring_files(paths):
    """Undo, if the block fails, what it wrote at ``paths`` (None entries skipped): a new file is removed, with
    the parent directories the block made; a file that was there is put back. The old one is kept meanwhile as
    a hard link (an atomic write replaces the name, not the inode) named like a temporary file."""
    paths = [Path(p) for p in paths if p is not None]
    with ExitStack() as stack:
        for path in paths:
            stack.enter_context(removing_new_dirs(path.parent))
        kept = {}
        for path in paths:
            if path.is_file():
                kept[path] = path.with_name(f".{path.name}.before.tmp")
                try:
                    os.link(path, kept[path])
                except OSError:  # a file system without hard links
                    shutil.copy2(path, kept[path])
        try:
            yield
        except BaseException:
            for path in paths:
                if path in kept:
                    os.replace(kept.pop(path), path)
                elif path.exists():
                    path.unlink()
            raise
        finally:
            for backup in kept.values():
                backup.unlink(missing_ok=True)


@contextmanager
def removing_new_dirs(path):
    """On failure, remove ``path`` (if the block created it: with its empty subdirectories) and the parents
    the block created, as far as they are left empty (a resumable run keeps what it finished)."""
    path = Path(path)
    new = [p for p in (path, *path.parents) if not p.exists()][::-1]  # outermost first
    try:
        yield path
    except BaseException:
        if new and path.is_dir():
            for d in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                if not any(d.iterdir()):
                    d.rmdir()
        remove_empty(new)
        raise


def _commit(stage: Path, out: Path) -> None:
    """Move the staged entries into ``out``, two levels deep: ``out/x`` or, inside a directory ``out``
    already has, ``out/x/y`` (a file or a whole directory, such as one saved model) is replaced."""
    make_parents(out)
    for entry in sorted(stage.iterdir()):
        dest = out / entry.name
        if entry.is_dir() and dest.is_dir():
            for sub in sorted(entry.iterdir()):
                _replace(sub, dest / sub.name)
        else:
            _replace(entry, dest)


def _replace(src: Path, dest: Path) -> None:
    if src.is_dir():
        replace_dir(src, dest)
    else:
        os.replace(src, dest)


@contextmanager
def staged(out, what: str = "--out"):
    """A fresh directory to write a command's outputs into; moved into ``out`` on success, removed on failure.

    The stage sits inside ``out`` when it exists, else in its nearest existing parent (the same file
    system either way), and a new ``out`` is created only at the end.
    """
    out = check_output_dir(out, what)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name or 'out'}.staging-", dir=existing_ancestor(out)))
    try:
        yield stage
        _commit(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
