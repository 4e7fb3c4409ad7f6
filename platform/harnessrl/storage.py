"""Sources and outputs on local disk or S3, through pyarrow filesystems.

`s3://` works against AWS or any S3-compatible endpoint (AWS_ENDPOINT_URL); local paths,
directories and globs work as given; `builtin:` names the bundled example corpus.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
from importlib import resources
from pathlib import Path
from typing import Iterator

import pyarrow.fs as pafs

from harnessrl.errors import DataError

BUILTIN_CORPORA = {
    "twx-train": "data/twx_train.jsonl.gz",
    "twx-test": "data/twx_test.jsonl.gz",
}
LOG_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz")


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


def expand_sources(specs: list[str]) -> list[str]:
    """Files named by paths, directories, globs, s3:// prefixes and builtin: names, sorted, deduplicated."""
    found: list[str] = []
    for spec in specs:
        if spec.startswith("builtin:"):
            found.append(_builtin(spec[len("builtin:"):]))
            continue
        if any(ch in spec for ch in "*?[") and not is_remote(spec):
            matches = sorted(glob.glob(spec, recursive=True))
            if not matches:
                raise DataError(f"no files match {spec!r}")
            found.extend(str(Path(m).resolve()) for m in matches if Path(m).is_file())
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
            prefix = spec.split("://")[0] + "://" if is_remote(spec) else ""
            found.extend(prefix + f for f in files)
        else:
            found.append(spec if is_remote(spec) else path)
    return sorted(dict.fromkeys(found))


def read_bytes(uri: str) -> bytes:
    """Whole file, gunzipped when it ends in .gz."""
    fs, path = filesystem(uri)
    try:
        with fs.open_input_stream(path, compression=None) as fh:  # we gunzip ourselves, with a clear error
            data = fh.read()
    except (OSError, FileNotFoundError) as exc:
        raise DataError(f"cannot read {uri}: {exc}") from None
    if uri.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise DataError(f"{uri}: not a valid gzip file: {exc}") from None
    return data


CHUNK_BYTES = 8 << 20


def iter_chunks(uri: str, chunk: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The file's bytes (gunzipped when it ends in .gz) in pieces: big logs are never held whole."""
    fs, path = filesystem(uri)
    try:
        raw = fs.open_input_stream(path, compression=None)
    except (OSError, FileNotFoundError) as exc:
        raise DataError(f"cannot read {uri}: {exc}") from None
    with raw:
        fh = gzip.GzipFile(fileobj=raw) if uri.endswith(".gz") else raw
        while True:
            try:
                block = fh.read(chunk)
            except (OSError, EOFError) as exc:
                if uri.endswith(".gz"):
                    raise DataError(f"{uri}: not a valid gzip file: {exc}") from None
                raise DataError(f"cannot read {uri}: {exc}") from None
            if not block:
                return
            yield block


def read_prefix(uri: str, n: int) -> bytes:
    """The first `n` bytes of the (gunzipped) file, reading no more than needed."""
    out = b""
    for block in iter_chunks(uri, min(n, CHUNK_BYTES)):
        out += block
        if len(out) >= n:
            break
    return out[:n]


def iter_lines(uri: str) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw bytes) for each non-blank line, streamed."""
    rest, no = b"", 0
    for block in iter_chunks(uri):
        lines = (rest + block).split(b"\n")
        rest = lines.pop()
        for line in lines:
            no += 1
            line = line.rstrip(b"\r")
            if line.strip():
                yield no, line
    if rest.rstrip(b"\r").strip():
        yield no + 1, rest.rstrip(b"\r")


def digest_sources(uris: list[str]) -> str:
    """Content digest of a raw corpus: independent of file names and order (streamed)."""
    parts = []
    for u in uris:
        h = hashlib.sha256()
        for block in iter_chunks(u):
            h.update(block)
        parts.append(h.hexdigest())
    return "sha256:" + hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()


def join(base: str, *parts: str) -> str:
    if is_remote(base):
        return "/".join([base.rstrip("/"), *parts])
    return str(Path(base, *parts))


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
