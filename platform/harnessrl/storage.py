"""Sources and outputs on local disk or S3, through pyarrow filesystems.

`s3://` works against AWS or any S3-compatible endpoint (AWS_ENDPOINT_URL); paths, directories
and globs work the same way on local disk and on S3 (`s3://bucket/logs/**/*.jsonl`); `builtin:`
names the bundled example corpus.
"""

from __future__ import annotations

import gzip
import hashlib
import re
import zlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterable, Iterator

import pyarrow.fs as pafs

from harnessrl.errors import DataError

BUILTIN_CORPORA = {
    "twx-train": "data/twx_train.jsonl.gz",
    "twx-test": "data/twx_test.jsonl.gz",
}
# What a directory's log files are called (gzipped or not); a glob or a named file can be anything.
LOG_SUFFIXES = tuple(f"{ext}{gz}" for ext in (".jsonl", ".ndjson", ".json", ".log") for gz in ("", ".gz"))
GLOB_CHARS = "*?["


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and path for a URI or local path."""
    if is_remote(uri):
        return pafs.FileSystem.from_uri(uri)
    path = uri[len("file://"):] if uri.startswith("file://") else uri
    return pafs.LocalFileSystem(), str(Path(path).expanduser().resolve())


def portable_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """Like `filesystem`, but for `s3://` the endpoint and credentials are resolved here
    (boto3's chain: environment, profile, instance role) and carried inside the filesystem
    object, so Ray workers on any node can use it without the driver's environment.
    Short-lived credentials are frozen at this point: long jobs should use instance roles."""
    if not uri.startswith("s3://"):
        return filesystem(uri)
    import os
    from urllib.parse import urlparse

    import boto3

    session = boto3.Session()
    kwargs: dict = {"region": session.region_name or "us-east-1"}
    creds = session.get_credentials()
    if creds is not None:
        frozen = creds.get_frozen_credentials()
        kwargs.update(access_key=frozen.access_key, secret_key=frozen.secret_key, session_token=frozen.token)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        parsed = urlparse(endpoint)
        kwargs.update(endpoint_override=parsed.netloc or parsed.path, scheme=parsed.scheme or "https")
    return pafs.S3FileSystem(**kwargs), uri[len("s3://"):]


def _builtin(name: str) -> str:
    if name not in BUILTIN_CORPORA:
        raise DataError(f"unknown builtin corpus {name!r}; known: {', '.join(sorted(BUILTIN_CORPORA))}")
    path = resources.files("harnessrl.examples").joinpath(BUILTIN_CORPORA[name])
    return str(path)


def _glob(spec: str) -> list[str]:
    """Files matching a glob, local or remote (`*`, `?`, `[...]`; `**` for any depth): one listing
    under the pattern's fixed prefix (pyarrow), matched with fsspec's glob rules."""
    from fsspec.utils import glob_translate

    cut = min(spec.index(c) for c in GLOB_CHARS if c in spec)
    base = spec[: spec.rfind("/", 0, cut) + 1]
    fs, root = filesystem(base or ".")
    root = root.rstrip("/")
    matches = re.compile(glob_translate(f"{root}/{spec[len(base):]}")).match
    if fs.get_file_info(root).type != pafs.FileType.Directory:
        return []
    listed = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    found = sorted(i.path for i in listed if i.type == pafs.FileType.File and matches(i.path))
    return [_scheme(spec) + f for f in found]


def _scheme(spec: str) -> str:
    """`s3://` for a remote spec (pyarrow lists bucket/key paths), "" for a local one."""
    return spec.split("://")[0] + "://" if is_remote(spec) else ""


def expand_sources(specs: list[str]) -> list[str]:
    """Files named by paths, directories, globs, s3:// prefixes and builtin: names, sorted, deduplicated."""
    found: list[str] = []
    for spec in specs:
        if spec.startswith("builtin:"):
            found.append(_builtin(spec[len("builtin:"):]))
            continue
        if any(ch in spec for ch in GLOB_CHARS):
            matches = _glob(spec)
            if not matches:
                raise DataError(f"no files match {spec!r}")
            found.extend(matches)
            continue
        fs, path = filesystem(spec)
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise DataError(f"source not found: {spec}")
        if info.type == pafs.FileType.Directory:
            inner = fs.get_file_info(pafs.FileSelector(path, recursive=True))
            files = sorted(i.path for i in inner if i.type == pafs.FileType.File and i.path.endswith(LOG_SUFFIXES))
            if not files:
                raise DataError(f"no log files ({', '.join(LOG_SUFFIXES)}) under {spec}")
            found.extend(_scheme(spec) + f for f in files)
        else:
            found.append(spec if is_remote(spec) else path)
    return sorted(dict.fromkeys(found))


CHUNK_BYTES = 8 << 20
MAX_LINE_BYTES = 64 << 20  # ingest's default: a longer line is quarantined (line_too_long), never held whole
LONG_LINE_PREFIX = 200  # bytes of a too-long line that are kept (the quarantine row's raw_prefix)


class CorruptFile(DataError):
    """A `.gz` that does not decompress (not gzip, cut short, damaged). `partial`: what was read
    before the fault (set by `read_prefix`); ingest quarantines the rest of the file and goes on."""

    def __init__(self, uri: str, error: str, partial: bytes = b""):
        self.error = f"not a valid gzip file: {error}"
        super().__init__(f"{uri}: {self.error}")
        self.partial = partial


def _open(uri: str):
    fs, path = filesystem(uri)
    try:
        return fs.open_input_stream(path, compression=None)  # we gunzip ourselves, with a clear error
    except (OSError, FileNotFoundError) as exc:
        raise DataError(f"cannot read {uri}: {exc}") from None


def iter_chunks(uri: str, chunk: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The file's bytes (gunzipped when it ends in .gz) in pieces: big logs are never held whole.
    A .gz that stops decompressing raises `CorruptFile` after the pieces read before it (gzip is
    read with `read1`, one compressed buffer at a time, so those pieces are all but the last ~128 KiB)."""
    with _open(uri) as raw:
        packed = uri.endswith(".gz")
        fh = gzip.GzipFile(fileobj=raw) if packed else raw
        read = fh.read1 if packed else fh.read
        while True:
            try:
                block = read(chunk)
            except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
                if packed:
                    raise CorruptFile(uri, str(exc) or type(exc).__name__) from None
                raise DataError(f"cannot read {uri}: {exc}") from None
            if not block:
                return
            yield block


def read_prefix(uri: str, n: int) -> bytes:
    """The first `n` bytes of the (gunzipped) file, reading no more than needed."""
    out = b""
    try:
        for block in iter_chunks(uri, min(n, CHUNK_BYTES)):
            out += block
            if len(out) >= n:
                break
    except CorruptFile as exc:
        exc.partial = out[:n]
        raise
    return out[:n]


@dataclass
class LongLine:
    """A line longer than the reader's limit: its first bytes and its length, nothing more."""

    prefix: bytes
    size: int


def iter_lines(uri: str, max_line_bytes: int | None = None) -> Iterator[tuple[int, bytes | LongLine]]:
    """(1-based line number, raw bytes) for each non-blank line, streamed. With `max_line_bytes`, a
    longer line comes as a `LongLine` and is skipped as it is read: memory stays at the limit."""
    rest, no = b"", 0
    skipping: LongLine | None = None
    for block in iter_chunks(uri):
        if skipping is not None:
            end = block.find(b"\n")
            if end < 0:
                skipping.size += len(block)
                continue
            skipping.size += end
            no += 1
            yield no, skipping
            skipping, block = None, block[end + 1:]
        lines = (rest + block).split(b"\n")
        rest = lines.pop()
        for line in lines:
            no += 1
            line = line.rstrip(b"\r")
            if max_line_bytes is not None and len(line) > max_line_bytes:
                yield no, LongLine(line[:LONG_LINE_PREFIX], len(line))
            elif line.strip():
                yield no, line
        if max_line_bytes is not None and len(rest) > max_line_bytes:
            skipping, rest = LongLine(rest[:LONG_LINE_PREFIX], len(rest)), b""
    if skipping is not None:
        yield no + 1, skipping
    elif rest.rstrip(b"\r").strip():
        yield no + 1, rest.rstrip(b"\r")


def file_digest(uri: str) -> str:
    """sha256 of a file's (gunzipped) content, streamed: a file and its .gz have the same one.
    A .gz that does not decompress is digested as the bytes it holds (ingest quarantines it)."""
    h = hashlib.sha256()
    try:
        for block in iter_chunks(uri):
            h.update(block)
    except CorruptFile:
        h = hashlib.sha256(b"corrupt:")
        with _open(uri) as raw:
            for block in iter(lambda: raw.read(CHUNK_BYTES), b""):
                h.update(block)
    return h.hexdigest()


def combine_digests(file_digests: Iterable[str]) -> str:
    """One digest of a corpus from its files' digests: independent of file names and order."""
    return "sha256:" + hashlib.sha256("\n".join(sorted(file_digests)).encode()).hexdigest()


def digest_sources(uris: list[str]) -> str:
    """Content digest of a raw corpus: independent of file names and order (streamed)."""
    return combine_digests(file_digest(u) for u in uris)


def join(base: str, *parts: str) -> str:
    if is_remote(base):
        return "/".join([base.rstrip("/"), *parts])
    return str(Path(base, *parts))


def read_parquet(uri: str, columns: list[str] | None = None):
    """A Parquet folder (local or `s3://`) as one pyarrow table, read in this process: for tables the
    driver holds anyway (a Ray Data job would cost seconds to start on a small machine)."""
    import pyarrow.dataset as pads

    fs, path = filesystem(uri)
    return pads.dataset(path, filesystem=fs, format="parquet").to_table(columns=columns)


def reset_dir(uri: str) -> None:
    """Empty a stage's output folder so a rerun never mixes old and new files."""
    fs, path = filesystem(uri)
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        fs.delete_dir(path)
    fs.create_dir(path, recursive=True)


def remove_dir(uri: str) -> None:
    """Delete a folder (a stage's scratch data) if it exists."""
    fs, path = filesystem(uri)
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        fs.delete_dir(path)
