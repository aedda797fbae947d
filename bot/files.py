"""Files customers attach in Slack, read for the agents: downloaded from `url_private` with the bot token (Slack
wants `Authorization: Bearer`, scope `files:read`), within a size limit, and turned into `Attachment` values:
the text of PDF, DOCX and plain-text files, images as bytes when the model accepts images. Whatever fails is an
attachment with a `problem`, so the agent is told the file's name and that it could not be read."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePath
from xml.etree import ElementTree

import aiohttp

from agents.attachments import Attachment, FileRef, Image
from bot.settings import Settings

log = logging.getLogger(__name__)


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


class Unreadable(Exception):
    """A file that was fetched but says nothing readable; its message says why, for the agent."""


@dataclass(frozen=True)
class FileLimits:
    max_bytes: int = 5_000_000
    """Larger files are not downloaded (Slack's declared size), nor read past this many bytes."""
    max_chars: int = 20_000
    """Text kept per file; the rest is cut, and the agent told so."""
    images: bool = False
    """The model accepts images (MODEL_ACCEPTS_IMAGES): send them; else the agent hears that one was sent."""


def file_limits(settings: Settings) -> FileLimits:
    return FileLimits(settings.max_file_bytes, settings.max_file_chars, settings.model_accepts_images)


class SlackFiles:
    """`agents.attachments.AttachmentReader` for Slack."""

    def __init__(self, *, token: str, limits: FileLimits, timeout_s: float = 20.0) -> None:
        self.token = token
        self.limits = limits
        self.timeout_s = timeout_s

    async def read(self, files: Sequence[FileRef]) -> tuple[Attachment, ...]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as http:
            return tuple([await self._one(http, ref) for ref in files])

    async def fetch(self, ref: FileRef) -> bytes | None:
        """A file's bytes, to relay it (`bot.outbox`); None when it is larger than the limit. Raises when Slack does
        not give it (`Unreadable`) or the download fails, so the relay is tried again later."""
        if self.too_big(ref):
            return None
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as http:
            return await self._download(http, ref.url)

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
            # Parsing is CPU work: off the event loop, so acks keep their time.
            text = await asyncio.to_thread(extract_text, kind, data)
        except Unreadable as exc:
            return Attachment(ref.name, ref.mime, problem=str(exc))
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("file %s (%s) not downloaded: %r", ref.id, ref.name, exc)
            return Attachment(ref.name, ref.mime, problem="it could not be downloaded")
        return Attachment(ref.name, ref.mime, text=clip(text, self.limits.max_chars))

    async def _download(self, http: aiohttp.ClientSession, url: str) -> bytes | None:
        """The file's bytes, or None when it turns out larger than the limit (the declared size can be absent)."""
        headers = {"Authorization": f"Bearer {self.token}"}
        async with http.get(url, headers=headers, allow_redirects=True) as response:
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
    return f"{text[:max_chars]}\n[… the rest of the file ({len(text) - max_chars} characters) was cut]"


def extract_text(kind: Kind, data: bytes) -> str:
    match kind:
        case Kind.PDF:
            text = _pdf_text(data)
        case Kind.DOCX:
            text = _docx_text(data)
        case _:
            text = data.decode("utf-8", errors="replace")
    if not text.strip():
        raise Unreadable("it holds no text (a scan, or empty)")
    return text.replace("\x00", "")


def _pdf_text(data: bytes) -> str:
    from pypdf import PdfReader  # imported when a PDF arrives: most processes never read one
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise Unreadable("the PDF is password-protected")
        return "\n".join(page.extract_text() or "" for page in reader.pages)
    except (PyPdfError, ValueError, KeyError, TypeError) as exc:
        raise Unreadable("not a readable PDF") from exc


_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"


def _docx_text(data: bytes) -> str:
    """The paragraphs of word/document.xml: a DOCX is a zip of XML, and the body's text is all the agent needs."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as docx:
            info = docx.getinfo("word/document.xml")
            if info.file_size > 20 * 1_000_000:  # a zip bomb is refused before it is inflated
                raise Unreadable("the document is too large once unpacked")
            root = ElementTree.fromstring(docx.read(info))
    except (zipfile.BadZipFile, KeyError, ElementTree.ParseError) as exc:
        raise Unreadable("not a readable DOCX") from exc
    paragraphs = []
    for paragraph in root.iter(f"{_W}p"):
        nodes = (node for node in paragraph.iter() if node.tag in (f"{_W}t", f"{_W}tab"))
        words = [(node.text or "") if node.tag == f"{_W}t" else "\t" for node in nodes]
        paragraphs.append("".join(words))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(paragraphs))
