"""Files customers attach in Slack, read for the agents: downloaded from `url_private` with the bot token (Slack
wants `Authorization: Bearer`, scope `files:read`), within a size limit, and turned into `Attachment` values:
the text of PDF, DOCX and plain-text files, images as bytes when the model accepts images. Whatever fails is an
attachment with a `problem`, so the agent is told the file's name and that it could not be read."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePath
from urllib.parse import urlsplit

import aiohttp

from agents.attachments import Attachment, FileRef, Image

# The readers are the knowledge base's too (manuals go through the same ones).
from agents.knowledge.readers import ATTACHMENT_LIMITS, ReaderLimits, Unreadable, docx_text, pdf_text
from bot.settings import Settings

log = logging.getLogger(__name__)


SLACK_FILES_HOST = "files.slack.com"
MAX_IMAGES = 4
"""Images of one message shown to the model: each is sent (as a data URL) with every call of the turn."""


class Kind(StrEnum):
    PDF = "pdf"
    DOCX = "docx"
    TEXT = "text"
    IMAGE = "image"
    OTHER = "other"


_BY_SUFFIX = {".pdf": Kind.PDF, ".docx": Kind.DOCX, ".txt": Kind.TEXT, ".md": Kind.TEXT, ".markdown": Kind.TEXT}
_BY_MIME = {
    "application/pdf": Kind.PDF,
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": Kind.DOCX,
    "text/plain": Kind.TEXT,
    "text/markdown": Kind.TEXT,
    "text/x-markdown": Kind.TEXT,
}
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""The image types OpenAI-compatible vision models take."""


def kind_of(ref: FileRef) -> Kind:
    if ref.mime in IMAGE_TYPES:
        return Kind.IMAGE
    return _BY_MIME.get(ref.mime) or _BY_SUFFIX.get(PurePath(ref.name).suffix.lower(), Kind.OTHER)


@dataclass(frozen=True)
class FileLimits:
    max_bytes: int = 5_000_000
    """Larger files are not downloaded (Slack's declared size), nor read past this many bytes."""
    max_chars: int = 20_000
    """Text kept per file; the rest is cut, and the agent told so."""
    images: bool = False
    """The model accepts images (MODEL_ACCEPTS_IMAGES): send them; else the agent hears that one was sent."""
    max_files: int = 5
    """Files of one message read (MAX_FILES_PER_MESSAGE); the rest are named to the agent as not read."""
    readers_at_once: int = 2
    """PDF and DOCX reader processes this process runs at once (FILE_READERS_AT_ONCE); others wait for one."""
    reader: ReaderLimits = ATTACHMENT_LIMITS
    """Each reader process's deadline and memory (FILE_READER_MEMORY_MB)."""


def file_limits(settings: Settings) -> FileLimits:
    return FileLimits(
        settings.max_file_bytes,
        settings.max_file_chars,
        settings.model_accepts_images,
        settings.max_files_per_message,
        settings.file_readers_at_once,
        ReaderLimits(memory_bytes=settings.file_reader_memory_mb << 20),
    )


class SlackFiles:
    """`agents.attachments.AttachmentReader` for Slack."""

    def __init__(
        self, *, token: str, limits: FileLimits, api_url: str = "https://slack.com/api/", timeout_s: float = 20.0
    ) -> None:
        self.token = token
        self.limits = limits
        self.timeout_s = timeout_s
        api = urlsplit(api_url)
        self.hosts = frozenset({SLACK_FILES_HOST, api.netloc})
        """Where the bot token may go: Slack's file host, and the Web API's (the emulator serves both)."""
        self.plain_http = api.scheme == "http"
        self.readers = asyncio.Semaphore(limits.readers_at_once)
        """Reader processes at once: each may take a core and its memory limit, and every turn may bring files."""

    async def read(self, files: Sequence[FileRef]) -> tuple[Attachment, ...]:
        read: list[Attachment] = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as http:
            for at, ref in enumerate(files):
                if at >= self.limits.max_files:  # each costs a download and maybe a reader process
                    read.append(Attachment(ref.name, ref.mime, problem=self._past_max_files()))
                    continue
                images = sum(1 for done in read if done.image is not None)
                if kind_of(ref) == Kind.IMAGE and images >= MAX_IMAGES:  # each goes into every call of the turn
                    read.append(Attachment(ref.name, ref.mime, problem=f"only {MAX_IMAGES} images are shown"))
                    continue
                read.append(await self._one(http, ref))
        return tuple(read)

    @property
    def max_bytes(self) -> int:
        return self.limits.max_bytes

    async def fetch(self, ref: FileRef) -> bytes | None:
        """A file's bytes, to relay it (`bot.channels.messenger.FileFetcher`); None when it is larger than the
        limit. Raises when Slack does not give it (`Unreadable`) or the download fails, so the relay is tried again
        later."""
        if self.too_big(ref):
            return None
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as http:
            return await self._download(http, ref.url)

    def _past_max_files(self) -> str:
        most = self.limits.max_files
        return f"only the first {most} files of a message are read" if most else "files are not read here"

    def too_big(self, ref: FileRef) -> bool:
        """Not relayed: larger than the limit, as Slack declared it."""
        return ref.size is not None and ref.size > self.limits.max_bytes

    async def _one(self, http: aiohttp.ClientSession, ref: FileRef) -> Attachment:
        kind = kind_of(ref)
        if kind == Kind.OTHER:
            return Attachment(ref.name, ref.mime, problem="not a type the assistant reads (PDF, DOCX, TXT, MD)")
        if kind == Kind.IMAGE and not self.limits.images:
            return Attachment(ref.name, ref.mime, problem="not shown to the model")
        too_big = f"larger than {self.limits.max_bytes / 1_000_000:g} MB"
        if ref.size is not None and ref.size > self.limits.max_bytes:
            return Attachment(ref.name, ref.mime, problem=too_big)
        try:
            data = await self._download(http, ref.url)
            if data is None:
                return Attachment(ref.name, ref.mime, problem=too_big)
            if kind == Kind.IMAGE:
                return Attachment(ref.name, ref.mime, image=Image(ref.mime, data))
            if kind == Kind.TEXT:  # decoding at most max_bytes: quick, but off the event loop all the same
                text = await asyncio.to_thread(extract_text, data)
            else:
                async with self.readers:
                    read = pdf_text if kind == Kind.PDF else docx_text
                    text = await read(data, max_chars=self.limits.max_chars, limits=self.limits.reader)
        except Unreadable as exc:
            return Attachment(ref.name, ref.mime, problem=str(exc))
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("file %s (%s) not downloaded: %r", ref.id, ref.name, exc)
            return Attachment(ref.name, ref.mime, problem="it could not be downloaded")
        return Attachment(ref.name, ref.mime, text=clip(text, self.limits.max_chars))

    async def _download(self, http: aiohttp.ClientSession, url: str) -> bytes | None:
        """The file's bytes, or None when it turns out larger than the limit (the declared size can be absent)."""
        where = urlsplit(url)
        if where.netloc not in self.hosts or not (where.scheme == "https" or self.plain_http):
            # A remote file's url_private is whatever its app said (anyone's server): the bot token never goes there.
            raise Unreadable("it is not stored in Slack")
        headers = {"Authorization": f"Bearer {self.token}"}
        async with http.get(url, headers=headers, allow_redirects=False) as response:
            if response.status != 200 or response.content_type == "text/html":
                # Slack answers a request it does not authorise with its sign-in page, not an error status.
                raise Unreadable(f"Slack did not give it to the bot (HTTP {response.status}, {response.content_type})")
            data = bytearray()
            async for chunk in response.content.iter_chunked(65536):
                data += chunk
                if len(data) > self.limits.max_bytes:
                    return None
            return bytes(data)


def clip(text: str, max_chars: int) -> str:
    text = text.strip()
    if len(text) <= max_chars:
        return text
    # PDF and DOCX readers stop soon after `max_chars`: how much more the file says is not known.
    return f"{text[:max_chars]}\n[… the rest of the file was cut: the assistant reads its first {max_chars} characters]"


def extract_text(data: bytes) -> str:
    """A plain-text file's text (PDF and DOCX are read by `pdf_text` and `docx_text`, in processes of their own)."""
    text = data.decode("utf-8", errors="replace")
    if not text.strip():
        raise Unreadable("it holds no text (a scan, or empty)")
    return text.replace("\x00", "")
