"""Download a hub model id into the Hugging Face cache, once per revision.

``model.path: Org/Name`` (the repository's default branch) or ``Org/Name@revision`` (a branch, a tag or
a commit hash) is downloaded with ``huggingface_hub`` from ``$HF_ENDPOINT`` (default
https://huggingface.co) into ``$HF_HOME/hub`` (under the operator: the model cache volume), with the
token of ``resources.secrets.huggingFaceToken``, which the operator mounts as the file
``$HF_TOKEN_PATH`` (``$HF_TOKEN`` and ``hf auth login``'s token are used when set, for local runs).

Only what transformers loads is fetched: the top-level JSON files (config, generation config,
tokenizer, weight index), tokenizer vocabularies, chat templates, remote code, and one weight format:
``model*.safetensors`` when there are any, else ``pytorch_model*.bin``; never GGUF, ONNX, ``*.pth``
or sub-directories.

A revision already complete in the cache downloads nothing: a commit hash makes no request at all,
a branch or tag one metadata request (to learn where it points now). A file lock per repository
makes concurrent processes (Ray actors, pods sharing a model cache volume) download it once; when
the hub cannot be reached, a complete cached snapshot of the revision is used. Every failure is a
``HubError`` (a ``ModelNotFoundError``) raised before Ray starts, with a one-line message naming the
field and what to do. Progress goes to a callback, throttled: "downloading Org/Name@main: 1.2/8.0
GB (15%)".
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cache import file_lock
from .hub_rules import (
    METADATA_TIMEOUT_S,
    POLL_S,
    PROGRESS_INTERVAL_S,
    Failure,
    HubError,
    HubFile,
    HubRef,
    HubSettings,
    Report,
    Throttle,
    check_disk_space,
    classify,
    failure_message,
    format_size,
    progress_text,
    select_files,
)


def _repo_folder(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")  # huggingface_hub's cache layout


def _cached_snapshot(settings: HubSettings, ref: HubRef, *, weights: bool) -> Path | None:
    """The revision's snapshot when the cache holds every file we would download, else None."""
    from huggingface_hub import get_cached_repo_tree
    from huggingface_hub.errors import CachedRepoTreeNotFoundError

    storage = settings.cache_dir / _repo_folder(ref.repo_id)
    commit = ref.revision if ref.pinned else _read(storage / "refs" / ref.ref_name)
    if not commit:
        return None
    try:
        tree = get_cached_repo_tree(ref.repo_id, revision=commit, cache_dir=settings.cache_dir)
        names = select_files((f.path for f in tree), weights=weights)
    except (CachedRepoTreeNotFoundError, ValueError):
        return None
    snapshot = storage / "snapshots" / commit
    return snapshot if all((snapshot / n).exists() for n in names) else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _write_ref(storage: Path, name: str, commit: str) -> None:
    """refs/<branch or tag> -> commit, as huggingface_hub records it (so an offline resolve finds it)."""
    path = storage / "refs" / name
    if name == commit or _read(path) == commit:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(commit)
    os.replace(tmp, path)


def _quiet_tqdm() -> type[Any]:
    """huggingface_hub's own progress bars, silenced: ``_DownloadWatch`` reports progress instead."""
    from huggingface_hub.utils.tqdm import tqdm

    class QuietTqdm(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return QuietTqdm


class _DownloadWatch:
    """Reports the bytes written under blobs/ for the files being fetched, throttled, from a thread."""

    def __init__(self, ref: HubRef, blobs: Path, files: Sequence[HubFile], report: Report) -> None:
        self.ref, self.blobs, self.files, self.report = ref, blobs, files, report
        self.total = sum(f.size for f in files)
        self.throttle = Throttle(PROGRESS_INTERVAL_S)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hub-download-progress", daemon=True)

    def done_bytes(self) -> int:
        done = 0
        for f in self.files:
            final = self.blobs / f.blob
            if final.exists():
                done += f.size
            else:  # huggingface_hub writes <blob>.<random>.incomplete, then renames it
                done += max(
                    (_size(p) for p in self.blobs.glob(f"{glob.escape(f.blob)}.*incomplete")), default=0
                )
        return min(done, self.total)

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            if self.throttle.due():
                self.report(progress_text(self.ref, self.done_bytes(), self.total))

    def __enter__(self) -> _DownloadWatch:
        self.started = time.monotonic()
        self.throttle.due()  # the start line below counts as the first report
        self.report(f"{progress_text(self.ref, 0, self.total)}, {len(self.files)} file(s)")
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._stop.set()
        self._thread.join()
        if exc_type is None:
            seconds = time.monotonic() - self.started
            self.report(f"downloaded {self.ref}: {format_size(self.total)} in {seconds:.0f}s")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _free_bytes(path: Path) -> int:
    path.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(path).free


@dataclass(frozen=True)
class _Download:
    ref: HubRef
    field: str
    weights: bool
    settings: HubSettings
    report: Report

    def fail(self, failure: Failure, detail: str = "") -> HubError:
        return HubError(
            failure_message(failure, field=self.field, ref=self.ref, settings=self.settings, detail=detail)
        )

    def run(self) -> Path:
        if self.ref.pinned and (cached := _cached_snapshot(self.settings, self.ref, weights=self.weights)):
            return cached  # a commit never changes: no request at all
        lock = self.settings.cache_dir / ".locks" / "rljob" / f"{_repo_folder(self.ref.repo_id)}.lock"
        with file_lock(
            lock, on_wait=lambda: self.report(f"waiting for another process downloading {self.ref}")
        ):
            return self._locked_run()

    def _locked_run(self) -> Path:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=self.settings.endpoint, token=self.settings.token or False)
        try:
            info = api.model_info(
                self.ref.repo_id, revision=self.ref.revision, files_metadata=True, timeout=METADATA_TIMEOUT_S
            )
        except Exception as error:
            failure, detail = classify(error, token_sent=self.settings.token is not None)
            if failure in (Failure.UNREACHABLE, Failure.HUB_ERROR):
                cached = _cached_snapshot(self.settings, self.ref, weights=self.weights)
                if cached is not None:
                    why = "is unreachable" if failure is Failure.UNREACHABLE else "failed"
                    self.report(
                        f"{self.ref}: the hub at {self.settings.endpoint} {why} ({detail}); "
                        f"using the cached snapshot {cached.name}"
                    )
                    return cached
            raise self.fail(failure, detail) from error
        if info.gated and self.settings.token is None:
            raise self.fail(Failure.GATED_NO_TOKEN)
        if info.sha is None or info.siblings is None:
            raise self.fail(Failure.OTHER, "the hub's answer names no commit or no files")
        files = {
            s.rfilename: HubFile(s.rfilename, s.size or 0, s.lfs.sha256 if s.lfs else (s.blob_id or ""))
            for s in info.siblings
        }
        try:
            chosen = [files[n] for n in select_files(files, weights=self.weights)]
        except ValueError as error:
            raise HubError(f"{self.field} {self.ref}: {error}") from error
        storage = self.settings.cache_dir / _repo_folder(self.ref.repo_id)
        snapshot = storage / "snapshots" / info.sha
        missing = [f for f in chosen if not (snapshot / f.name).exists()]
        if missing:
            self._fetch(info.sha, chosen, missing, storage)
        _write_ref(storage, self.ref.ref_name, info.sha)
        return snapshot

    def _fetch(self, commit: str, chosen: list[HubFile], missing: list[HubFile], storage: Path) -> None:
        from huggingface_hub import snapshot_download

        blobs = storage / "blobs"
        to_fetch = [f for f in missing if not (blobs / f.blob).exists()]
        short = check_disk_space(sum(f.size for f in to_fetch), _free_bytes(self.settings.cache_dir))
        if short is not None:
            raise self.fail(Failure.DISK_FULL, short)
        watch = (
            _DownloadWatch(self.ref, blobs, to_fetch, self.report) if to_fetch else contextlib.nullcontext()
        )
        try:
            with watch:
                snapshot_download(
                    self.ref.repo_id,
                    revision=commit,
                    cache_dir=self.settings.cache_dir,
                    endpoint=self.settings.endpoint,
                    token=self.settings.token or False,
                    allow_patterns=[glob.escape(f.name) for f in chosen],
                    tqdm_class=_quiet_tqdm(),
                )
        except Exception as error:
            raise self.fail(*classify(error, token_sent=self.settings.token is not None)) from error


def download(
    ref: HubRef,
    *,
    field: str = "model.path",
    weights: bool = True,
    report: Report | None = None,
    settings: HubSettings | None = None,
) -> Path:
    """The local snapshot directory of ``ref`` (see the module docstring).

    ``weights=False``: the tokenizer's files only. ``report`` gets the progress lines (default: stdout
    and, under the operator, the job's status.progress.message).
    """
    return _Download(
        ref, field, weights, settings or HubSettings.from_env(), report or console_and_status()
    ).run()


def console_and_status() -> Report:
    """stdout, and under the operator the job's status.progress.message."""
    from ..report import JobIdentity, ProgressReporter

    return ProgressReporter(0, job=JobIdentity.from_env(), tensorboard_dir=None, stream=sys.stdout).message
