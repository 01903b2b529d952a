"""A run directory and its one resumable shard writer: ``manifest.json`` and ``FOLDER/shard-FIRST-LAST.parquet``.

Shards hold consecutive prompts (by index in the prompt file) and are written atomically, so a
rerun of the same command skips every prompt already in a ``rounds`` shard file and leaves those
files untouched. A shard's other folders (``diagnostics/``) are written before its rounds file,
which marks the shard done. A rerun whose manifest differs is refused. Each shard file gets a
hidden ``.shard-FIRST-LAST.parquet.sha256`` beside it (hidden, so ``pd.read_parquet(FOLDER)`` and
pyarrow datasets, which skip dot files, still read the folder as one table); a shard damaged on disk (its bytes no longer match, or, for a shard
without one, it does not read whole with verified page checksums) is not done: it is removed and its
prompts are redone.
A run that fails before its first shard leaves nothing behind (no manifest without a shard).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from specrank.atomic import atomic_write, remove_temps, write_json_atomic, write_parquet_atomic
from specrank.files import parquet_damage, read_json, sha256_files

SHARD = re.compile(r"shard-(\d+)-(\d+)\.parquet")
CHECKSUM = ".sha256"  # .shard-FIRST-LAST.parquet.sha256: the sha256 of the shard file's bytes
DONE_FOLDER = "rounds"  # a shard counts as done once its rounds file exists
TEMPS = "*/.*.tmp"  # the temporary files of shard writes (specrank.atomic)

# Recorded for the reader but not part of a run's identity: the prompts are identified by their
# hash, so the same file in another checkout (a fresh clone sharing the cache) resumes the run.
LOCATIONS = ("prompts",)
RECORDED_ONLY = LOCATIONS + ("workers",)  # how many Ray workers wrote it: the same run either way


class RunDirError(ValueError):
    """The run directory holds a different run."""


def check_same_run(out_dir, manifest: dict, partial: bool = False) -> None:
    """RunDirError unless ``out_dir`` holds no run yet or the run of ``manifest``; with ``partial`` only the keys
    ``manifest`` has are compared (the fields known before any model loads, ``runs.manifest.config_manifest``)."""
    out = Path(out_dir)
    path = out / "manifest.json"
    if not path.exists():
        return
    old = read_json(path, "run manifest")
    if not isinstance(old, dict):
        raise RunDirError(f"{path}: not a run manifest (a JSON object)")
    keys = (set(manifest) if partial else set(old) | set(manifest)) - set(RECORDED_ONLY)
    differ = sorted(k for k in keys if old.get(k) != manifest.get(k))
    if differ:
        raise RunDirError(f"{out} holds a different run (differs in: {', '.join(differ)}); use a new --out")


def open_run_dir(out_dir, manifest: dict) -> Path:
    """Create the run directory, or check that an existing one holds the same run."""
    out = Path(out_dir)
    check_same_run(out, manifest)
    if not (out / "manifest.json").exists():
        (out / DONE_FOLDER).mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "manifest.json", manifest)
    (out / DONE_FOLDER).mkdir(exist_ok=True)
    remove_temps(out, TEMPS)  # left by a killed write; never a finished shard
    return out


def shard_name(shard: list[int]) -> str:
    """``shard-FIRST-LAST.parquet`` of consecutive prompt indices."""
    return f"shard-{shard[0]:05d}-{shard[-1]:05d}.parquet"


def checksum_path(path: Path) -> Path:
    return path.with_name(f".{path.name}{CHECKSUM}")


def file_damage(path: Path) -> str | None:
    """Why the shard file ``path`` cannot be trusted, or None: its sha256 against the one written beside it,
    else (a shard written before checksums) a whole read with verified page checksums."""
    expected = checksum_path(path)
    if expected.is_file():
        if sha256_files([path]) != expected.read_text().strip():
            return f"its sha256 differs from {expected.name}"
        return None
    return parquet_damage(path)


def shard_damage(out: Path, name: str) -> str | None:
    """Why shard ``name`` of the run in ``out`` cannot be trusted (one of its folders' files is truncated or
    corrupted), or None when every folder's file is intact."""
    for folder in sorted(p for p in out.iterdir() if p.is_dir()):
        if (folder / name).is_file():
            reason = file_damage(folder / name)
            if reason:
                return f"{folder.name}/{name}: {reason}"
    return None


def done_prompts(out_dir) -> set:
    """Prompt indices recorded in finished, intact shard files; a damaged shard's rounds file (the done
    marker) is removed, with a notice, so that its prompts are redone."""
    out, done = Path(out_dir), set()
    for f in sorted(Path(out, DONE_FOLDER).glob("shard-*.parquet")):
        m = SHARD.fullmatch(f.name)
        if not m:
            continue
        damage = shard_damage(out, f.name)
        if damage:
            print(f"specrank: damaged shard {damage}; redoing its prompts", file=sys.stderr)
            f.unlink()
            checksum_path(f).unlink(missing_ok=True)
            continue
        done.update(range(int(m[1]), int(m[2]) + 1))
    return done


def discard_unstarted(out: Path) -> None:
    """Remove what ``open_run_dir`` made for a run that finished no shard: the manifest, its empty folders,
    and ``out`` itself when nothing else is left in it."""
    if any(Path(out, DONE_FOLDER).glob("shard-*.parquet")):
        return
    Path(out, "manifest.json").unlink(missing_ok=True)
    for folder in (p for p in out.iterdir() if p.is_dir()):
        for stale in {*folder.glob(".*"), *folder.glob("shard-*")}:  # temps, checksums, the shard's other folders
            stale.unlink(missing_ok=True)
        if not any(folder.iterdir()):
            folder.rmdir()
    if not any(out.iterdir()):
        out.rmdir()


def pending_shards(n_prompts: int, done: set, shard_size: int) -> list[list[int]]:
    """Consecutive runs of unfinished prompt indices, cut into shards of at most ``shard_size``."""
    shards, current = [], []
    for i in range(n_prompts):
        if i in done or len(current) == shard_size or (current and current[-1] != i - 1):
            if current:
                shards.append(current)
            current = []
        if i not in done:
            current.append(i)
    return shards + ([current] if current else [])


def write_shard(out: Path, shard: list[int], tables: dict) -> None:
    """Write one shard's table per folder atomically, each with its sha256 beside it, the rounds file (the done
    marker) last."""
    name = shard_name(shard)
    for folder in sorted(tables, key=lambda f: f == DONE_FOLDER):
        path = write_parquet_atomic(tables[folder], out / folder / name)
        atomic_write(checksum_path(path), lambda tmp, p=path: Path(tmp).write_text(sha256_files([p]) + "\n"))


def record_shards(out: Path, n_prompts: int, shard_size: int, decode_one: Callable[[int], dict], tables: dict,
                  progress: bool = True, postfix: Callable[[], dict] | None = None, desc: str | None = None) -> None:
    """Decode every unfinished prompt, shard by shard, and write each shard once its prompts are decoded.

    ``decode_one(i) -> {folder: part}`` decodes prompt ``i``; ``tables[folder](parts) -> Arrow table``
    assembles a shard's parts of that folder.
    """
    if shard_size < 1:
        raise ValueError(f"shard size must be >= 1, got {shard_size}")
    done = done_prompts(out)
    # disable=None: tqdm stays quiet when stderr is not a terminal (a log file, a pipe, a test)
    bar = tqdm(total=n_prompts, initial=len(done & set(range(n_prompts))), unit="prompt", desc=desc,
               disable=None if progress else True, dynamic_ncols=True)
    try:
        def advance():
            bar.update(1)
            if postfix is not None:
                bar.set_postfix(postfix())

        for shard in pending_shards(n_prompts, done, shard_size):
            write_shard(out, shard, decode_shard(shard, decode_one, tables, advance))
    except BaseException:
        discard_unstarted(Path(out))
        raise
    finally:
        bar.close()


def decode_shard(shard: list[int], decode_one: Callable[[int], dict], tables: dict,
                 on_prompt: Callable[[], None] | None = None) -> dict:
    """``{folder: Arrow table}`` of one shard: ``decode_one`` on each of its prompts, then ``tables`` (see
    ``record_shards``); ``on_prompt()`` after each prompt."""
    parts = {folder: [] for folder in tables}
    for i in shard:
        for folder, part in decode_one(i).items():
            parts[folder].append(part)
        if on_prompt is not None:
            on_prompt()
    return {folder: build(parts[folder]) for folder, build in tables.items()}
