"""Text out of PDF and DOCX files: one reader for the files customers attach (`bot.slack.files`, within its limits) and
for the operator's own manuals (`kb ingest`, every page).

    pdf_pages()         a PDF's pages; pdf_text() an attachment's text, within the attachments' limits
    docx_read()         a DOCX's paragraphs with their styles; docx_text() an attachment's text
    ReaderLimits        each of these reads in a process of its own, with a deadline and a memory and CPU limit
    read_file()         any file `kb ingest` reads, as a `Document`

`Unreadable`: the file says nothing readable; its message says why, in words fit for an agent or an operator.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import math
import re
import signal
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from xml.etree import ElementTree

from agents.errors import AgentsError
from agents.knowledge.documents import SUFFIXES, Document, docx_document, pdf_document, read_document


class Unreadable(AgentsError):
    """A file that says nothing readable (corrupt, encrypted, a scan); the message says why."""


MAX_PDF_PAGES = 50
"""Pages of an attachment read: a customer's file is anyone's."""


@dataclass(frozen=True)
class ReaderLimits:
    """What one reader process may spend. A small file can cost minutes of CPU (PDF pages sharing one huge content
    stream) or gigabytes of memory (20 MB of XML, from a 58 KB DOCX): a reader runs in a process of its own, so that
    neither holds the event loop's GIL, and within these limits, so that none outlives its welcome or starves the
    host."""

    seconds: float = 10.0
    """Wall-clock deadline; the process is killed past it. Its CPU limit is this too (rounded up): should this
    process die without killing the reader, the reader still ends."""
    memory_bytes: int = 512 << 20
    """Address space (RLIMIT_AS) of the reader process, the interpreter's own (about 50 MB) included."""


ATTACHMENT_LIMITS = ReaderLimits()
MANUAL_LIMITS = ReaderLimits(seconds=120.0, memory_bytes=4 << 30)
"""A manual's (the operator's own file, every page read): only a file that would never end is stopped."""

_MEMORY = 4
"""The reader's exit status when it ran out of memory."""
_READER = f"""
import json, os, resource, sys
memory, cpu = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
sys.path.insert(0, sys.argv[3])
from agents.knowledge.readers import Unreadable, read_here
try:
    out = json.dumps(read_here(sys.argv[4], sys.stdin.buffer.read(), int(sys.argv[5]), int(sys.argv[6])))
except MemoryError:  # at once: unwinding, with the memory still taken, can fail again
    os._exit({_MEMORY})
except Unreadable as exc:
    out = json.dumps({{"unreadable": str(exc)}})
sys.stdout.write(out)
"""
_ROOT = str(Path(__file__).resolve().parents[2])
"""Where the `agents` package is imported from, in the reader process as in this one."""


def read_here(kind: str, data: bytes, max_chars: int, max_pages: int) -> list[Any] | dict[str, str]:
    """What a reader process does (`_READER`): a PDF's pages' texts, or a DOCX's paragraphs as [text, style], read
    no further than `max_chars` and `max_pages` (-1: no limit). Past `max_chars`, one character more is kept, so
    that the reader's caller knows there was more; the rest never crosses the pipe."""
    if kind == "docx":
        paragraphs: list[Any] = []
        length = 0
        for text, style in docx_paragraphs(data):
            paragraphs.append([_within(text, length, max_chars), style])
            length += len(text)
            if 0 <= max_chars < length:
                break
        return paragraphs
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data))
    if reader.is_encrypted:
        raise Unreadable("the PDF is password-protected")
    texts: list[Any] = []
    size = 0
    for page in reader.pages if max_pages < 0 else reader.pages[:max_pages]:
        text = page.extract_text() or ""
        texts.append(_within(text, size, max_chars))
        size += len(text)
        if 0 <= max_chars < size:
            break
    return texts


def _within(text: str, before: int, max_chars: int) -> str:
    """`text`, read after `before` characters, cut one character past `max_chars` (-1: not cut)."""
    return text if max_chars < 0 else text[: max(max_chars + 1 - before, 0)]


async def _read_apart(
    kind: Literal["pdf", "docx"], data: bytes, *, max_chars: int | None, max_pages: int | None, limits: ReaderLimits
) -> list[Any]:
    """`read_here` in a process of its own, within `limits`; killed past its deadline or when this is cancelled."""
    what = kind.upper()
    reader = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _READER, str(limits.memory_bytes), str(math.ceil(limits.seconds)), _ROOT, kind,
        str(-1 if max_chars is None else max_chars), str(-1 if max_pages is None else max_pages),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(reader.communicate(data), timeout=limits.seconds)
    except TimeoutError:
        raise Unreadable(f"the {what} took more than {limits.seconds:g} s to read") from None
    finally:
        if reader.returncode is None:  # past the deadline, or the turn was cancelled: the reader goes with it
            reader.kill()
            await reader.wait()
    if reader.returncode == _MEMORY:
        raise Unreadable(f"the {what} needs more than {limits.memory_bytes >> 20} MB to read")
    if reader.returncode == -signal.SIGXCPU:
        raise Unreadable(f"the {what} took more than {limits.seconds:g} s to read")
    try:
        read = json.loads(out) if reader.returncode == 0 else None
    except ValueError:
        read = None
    if isinstance(read, dict) and isinstance(read.get("unreadable"), str):
        raise Unreadable(read["unreadable"])
    if not isinstance(read, list):
        raise Unreadable(f"not a readable {what}")
    return read


def _clean(text: object) -> str:
    # JSON carries a lone surrogate that Postgres and the model's API would refuse: replaced here.
    return str(text).encode("utf-8", errors="replace").decode("utf-8").replace("\x00", "")


async def pdf_pages(
    data: bytes, *, max_chars: int | None, max_pages: int | None, limits: ReaderLimits = MANUAL_LIMITS
) -> list[str]:
    """A PDF's text, page by page, read apart (`ReaderLimits`). At most `max_pages` pages, and no more once
    `max_chars` are read (None: all)."""
    pages = await _read_apart("pdf", data, max_chars=max_chars, max_pages=max_pages, limits=limits)
    texts = [_clean(page) for page in pages]
    if not any(text.strip() for text in texts):
        raise Unreadable("it holds no text (a scan, or empty)")
    return texts


async def pdf_text(data: bytes, *, max_chars: int, limits: ReaderLimits = ATTACHMENT_LIMITS) -> str:
    """An attached PDF's text: at most MAX_PDF_PAGES pages, no further than `max_chars`."""
    return "\n".join(await pdf_pages(data, max_chars=max_chars, max_pages=MAX_PDF_PAGES, limits=limits))


async def docx_read(
    data: bytes, *, max_chars: int | None, limits: ReaderLimits = MANUAL_LIMITS
) -> list[tuple[str, str | None]]:
    """A DOCX's paragraphs with their styles (`docx_paragraphs`), read apart (`ReaderLimits`), no further than
    `max_chars` (None: all)."""
    read = await _read_apart("docx", data, max_chars=max_chars, max_pages=None, limits=limits)
    return [(_clean(text), None if style is None else str(style)) for text, style in read]


async def docx_text(data: bytes, *, max_chars: int, limits: ReaderLimits = ATTACHMENT_LIMITS) -> str:
    """An attached DOCX's text, no further than `max_chars`."""
    paragraphs = await docx_read(data, max_chars=max_chars, limits=limits)
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(text for text, _ in paragraphs))
    if not text.strip():
        raise Unreadable("it holds no text (empty)")
    return text


_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
DOCX_UNPACKED_BYTES = 20 * 1_000_000


def docx_paragraphs(data: bytes) -> list[tuple[str, str | None]]:
    """The paragraphs of word/document.xml, each with its style's id (`Title`, `Heading1`; None for body text): a
    DOCX is a zip of XML, and the body's text is all a reader needs. Parsing is CPU and memory without bound but
    the unpacked size's: `docx_read` runs it apart, within limits."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as docx:
            info = docx.getinfo("word/document.xml")
            # A zip bomb is refused before it is inflated: the size it declares is checked, then only that much is
            # read, since the declared size is the file's own claim.
            if info.file_size > DOCX_UNPACKED_BYTES:
                raise Unreadable("the document is too large once unpacked")
            with docx.open(info) as member:
                xml = member.read(DOCX_UNPACKED_BYTES + 1)
            if len(xml) > DOCX_UNPACKED_BYTES:
                raise Unreadable("the document is too large once unpacked")
            root = ElementTree.fromstring(xml)
    except ElementTree.ParseError as exc:
        if exc.code == _EXPAT_NO_MEMORY:  # expat's own allocation failed: the memory limit, not the file's form
            raise MemoryError from exc
        raise Unreadable("not a readable DOCX") from exc
    except (zipfile.BadZipFile, KeyError) as exc:
        raise Unreadable("not a readable DOCX") from exc
    paragraphs: list[tuple[str, str | None]] = []
    for paragraph in root.iter(f"{_W}p"):
        nodes = (node for node in paragraph.iter() if node.tag in (f"{_W}t", f"{_W}tab"))
        words = [(node.text or "") if node.tag == f"{_W}t" else "\t" for node in nodes]
        style = paragraph.find(f"{_W}pPr/{_W}pStyle")
        paragraphs.append(("".join(words), style.get(f"{_W}val") if style is not None else None))
    return paragraphs


_EXPAT_NO_MEMORY = 1
"""XML_ERROR_NO_MEMORY (xml.parsers.expat.errors.codes)."""


async def read_file(path: Path, *, source: str | None = None) -> Document:
    """A file `kb ingest` reads (`documents.SUFFIXES`) as a document; `source` names it (the path by default). A PDF's
    every page is read. Raises `Unreadable` (the message says why), OSError, or ValueError for another suffix."""
    source = source or str(path)
    kind = SUFFIXES.get(path.suffix.lower())
    if kind not in ("pdf", "docx"):
        return await asyncio.to_thread(read_document, path, source=source)
    data = await asyncio.to_thread(path.read_bytes)
    content_hash = hashlib.sha256(data).hexdigest()
    if kind == "pdf":
        pages = await pdf_pages(data, max_chars=None, max_pages=None)
        return pdf_document(source, pages, content_hash)
    paragraphs = await docx_read(data, max_chars=None)
    if not any(text.strip() for text, _ in paragraphs):
        raise Unreadable("it holds no text (empty)")
    return docx_document(source, paragraphs, content_hash)
