"""The pure half of hub downloads: hub references, which files to fetch, progress lines, and the
one-line message for each failure (hub.py does the I/O)."""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from .errors import ModelNotFoundError

DEFAULT_ENDPOINT = "https://huggingface.co"
PROGRESS_INTERVAL_S = 10.0  # at most one progress line (and one status patch) per interval
METADATA_TIMEOUT_S = 30.0  # huggingface_hub's API calls wait forever by default (a firewall that drops)
POLL_S = 1.0

_NAME = r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"{_NAME}/{_NAME}")
_REVISION = re.compile(r"[A-Za-z0-9_](?:[\w.+/-]{0,253}[A-Za-z0-9_])?")
_COMMIT = re.compile(r"[0-9a-f]{40}")
# What transformers reads from a model repository, besides the weights (top-level files only).
_SIDE_FILES = re.compile(r".+\.(json|txt|model|tiktoken|jinja|py)")
_INDEX = re.compile(r".+\.index\.json")
_SAFETENSORS = re.compile(r"model.*\.safetensors")
_PYTORCH_BIN = re.compile(r"pytorch_model.*\.bin")

Report = Callable[[str], None]


class HubError(ModelNotFoundError):
    """A hub id that cannot be used; the message names the field, the reason and what to do."""


@dataclass(frozen=True)
class HubRef:
    """``Org/Name`` or ``Org/Name@revision`` as written in model.path."""

    repo_id: str
    revision: str | None = None

    @property
    def ref_name(self) -> str:
        """The name the cache records the revision under (``refs/<name>``), as huggingface_hub does."""
        return self.revision or "main"

    @property
    def pinned(self) -> bool:
        """A full commit hash: the files can never change."""
        return self.revision is not None and _COMMIT.fullmatch(self.revision) is not None

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.ref_name}"


def parse_hub_ref(text: str, *, field: str = "model.path") -> HubRef | None:
    """The hub reference in ``text``, or None when it does not look like one (then it is a local path).

    Raises HubError for ``Org/Name@`` followed by something that is not a revision name.
    """
    repo_id, at, revision = text.partition("@")
    if not _REPO_ID.fullmatch(repo_id) or "--" in repo_id or ".." in repo_id:
        return None
    if at and (not _REVISION.fullmatch(revision) or ".." in revision or "//" in revision):
        raise HubError(
            f"{field} {text!r}: {revision!r} after @ is not a revision; write Org/Name@<branch, tag or "
            "commit hash>, e.g. Org/Name@main"
        )
    return HubRef(repo_id, revision if at else None)


@dataclass(frozen=True)
class HubFile:
    """A file of a repository revision, as the hub lists it."""

    name: str
    size: int
    blob: str  # its name under blobs/ in the cache: the LFS sha256, else the git blob id


def select_files(names: Iterable[str], *, weights: bool) -> list[str]:
    """The files a transformers model (or, without ``weights``, its tokenizer) needs, sorted.

    Raises ValueError (a sentence) when a model repository has no config.json or no weights.
    """
    top = sorted(n for n in names if "/" not in n)
    safetensors = [n for n in top if _SAFETENSORS.fullmatch(n)]
    pytorch = [n for n in top if _PYTORCH_BIN.fullmatch(n)]
    chosen_weights = safetensors or pytorch
    side = [n for n in top if _SIDE_FILES.fullmatch(n) and not _INDEX.fullmatch(n)]
    if not weights:
        return side
    if "config.json" not in top:
        raise ValueError("the repository has no config.json at its top level: it is not a transformers model")
    if not chosen_weights:
        raise ValueError(
            "the repository has no transformers weights (model*.safetensors or pytorch_model*.bin) at its "
            "top level"
        )
    index = "model.safetensors.index.json" if safetensors else "pytorch_model.bin.index.json"
    return sorted(side + chosen_weights + ([index] if index in top else []))


def _unit(total: int) -> tuple[float, str]:
    for scale, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if total >= scale:
            return scale, unit
    return 1.0, "B"


def format_size(size: int) -> str:
    """Decimal units, as the hub shows them: 850 B, 12.3 kB, 538.1 MB, 8.0 GB."""
    scale, unit = _unit(size)
    return f"{size} B" if unit == "B" else f"{size / scale:.1f} {unit}"


def progress_text(ref: HubRef, done: int, total: int) -> str:
    """``downloading Org/Name@main: 1.2/8.0 GB (15%)``."""
    scale, unit = _unit(total)
    amounts = f"{done}/{total} B" if unit == "B" else f"{done / scale:.1f}/{total / scale:.1f} {unit}"
    percent = 100 * done // total if total else 100
    return f"downloading {ref}: {amounts} ({percent}%)"


class Throttle:
    """``due()`` is true at the first call, then once per ``interval`` seconds."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self._last: float | None = None

    def due(self) -> bool:
        now = self.clock()
        if self._last is not None and now - self._last < self.interval:
            return False
        self._last = now
        return True


class Failure(Enum):
    GATED_NO_TOKEN = "gated-no-token"
    GATED_NO_ACCESS = "gated-no-access"
    TOKEN_REFUSED = "token-refused"
    NOT_FOUND = "not-found"
    REVISION_NOT_FOUND = "revision-not-found"
    UNREACHABLE = "unreachable"
    HUB_ERROR = "hub-error"
    DISK_FULL = "disk-full"
    OTHER = "other"


@dataclass(frozen=True)
class HubSettings:
    """Where to download from and to, and with which token: read from the environment at each call."""

    endpoint: str
    cache_dir: Path  # huggingface_hub's cache: $HF_HOME/hub
    token: str | None
    token_source: str  # where the token came from, for messages

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> HubSettings:
        xdg = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        home = Path(environ.get("HF_HOME") or Path(xdg) / "huggingface").expanduser()
        cache = Path(environ.get("HF_HUB_CACHE") or home / "hub").expanduser()
        token, source = environ.get("HF_TOKEN") or None, "HF_TOKEN"
        if token is None:
            mounted = environ.get("HF_TOKEN_PATH")  # the operator mounts the Secret there
            token_file = Path(mounted or home / "token").expanduser()
            if token_file.is_file():
                token = token_file.read_text().strip() or None
                source = (
                    f"{token_file} ({'resources.secrets.huggingFaceToken' if mounted else 'hf auth login'})"
                )
        endpoint = (environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        return cls(endpoint, cache, token, source if token else "none")


def failure_message(
    failure: Failure,
    *,
    field: str,
    ref: HubRef,
    settings: HubSettings,
    detail: str = "",
) -> str:
    """One line: the field, the model, what went wrong and what to do."""
    page = f"{settings.endpoint}/{ref.repo_id}"
    head = f"{field} {ref}"
    match failure:
        case Failure.GATED_NO_TOKEN:
            return (
                f"{head} is gated: set resources.secrets.huggingFaceToken to a Secret holding a token that "
                f"has accepted its terms ({page})"
            )
        case Failure.GATED_NO_ACCESS:
            return (
                f"{head} is gated and the token from {settings.token_source} has no access to it: accept its "
                f"terms at {page} with that token's account, or use a token that has"
            )
        case Failure.TOKEN_REFUSED:
            return (
                f"{head}: the hub at {settings.endpoint} refused the token from {settings.token_source} "
                "(invalid or revoked): put a valid read token in the Secret of "
                "resources.secrets.huggingFaceToken"
            )
        case Failure.NOT_FOUND:
            private = (
                f"if it is private, the token from {settings.token_source} cannot read it"
                if settings.token
                else "if it is private, set resources.secrets.huggingFaceToken to a token that can read it"
            )
            return (
                f"{head}: no local directory of that name and no such repository on {settings.endpoint}: "
                f"check the id (Org/Name); {private}"
            )
        case Failure.REVISION_NOT_FOUND:
            return (
                f"{head}: {ref.repo_id} has no revision {ref.ref_name!r} on {settings.endpoint}: write an "
                "existing branch, tag or commit hash after @"
            )
        case Failure.UNREACHABLE:
            return (
                f"{head}: cannot reach the hub at {settings.endpoint} ({detail}) and this revision is not in "
                f"the cache {settings.cache_dir}: let the pods reach it, or set HF_ENDPOINT (resources.env) "
                "to a mirror"
            )
        case Failure.HUB_ERROR:
            return (
                f"{head}: the hub at {settings.endpoint} answered {detail}: try again later, or set "
                "HF_ENDPOINT (resources.env) to a mirror"
            )
        case Failure.DISK_FULL:
            return (
                f"{head}: no space left in the model cache {settings.cache_dir} ({detail}): give "
                "resources.modelCache a larger volume, or free space in it"
            )
        case _:
            return f"{head}: download from {settings.endpoint} failed: {detail}"


def check_disk_space(needed: int, free: int) -> str | None:
    """None when ``needed`` bytes fit in ``free``; else the detail of a DISK_FULL message."""
    if needed <= free:
        return None
    return f"{format_size(needed)} to download, {format_size(free)} free"


def classify(error: BaseException, *, token_sent: bool) -> tuple[Failure, str]:
    """What a huggingface_hub / network / disk error means for the user, and a short detail."""
    import httpx2
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    detail = f"{type(error).__name__}: {' '.join(str(error).split())}"[:300]
    if isinstance(error, GatedRepoError):
        return (Failure.GATED_NO_ACCESS if token_sent else Failure.GATED_NO_TOKEN), detail
    if isinstance(error, RevisionNotFoundError):
        return Failure.REVISION_NOT_FOUND, detail
    if isinstance(error, RepositoryNotFoundError):
        return Failure.NOT_FOUND, detail
    if isinstance(error, HfHubHTTPError):
        status = error.response.status_code
        if status in (401, 403) and token_sent:
            return Failure.TOKEN_REFUSED, detail
        if status == 401:
            return Failure.NOT_FOUND, detail
        return Failure.HUB_ERROR, f"HTTP {status}"
    if isinstance(error, httpx2.TransportError | OfflineModeIsEnabled | LocalEntryNotFoundError):
        cause = error.__cause__ if isinstance(error, LocalEntryNotFoundError) and error.__cause__ else error
        return Failure.UNREACHABLE, f"{type(cause).__name__}: {' '.join(str(cause).split())}"[:200]
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return Failure.DISK_FULL, "the disk filled up while downloading"
    return Failure.OTHER, detail
