"""A file attached in the chat, as text the model reads: its real type found from its bytes, converted, and framed.

    kind = sniff(path, "report.pdf", limits)         # "pdf" | "docx" | "pptx" | "html" | "text" | "image"; or raises
    doc = convert_file(path, "notes.docx", limits)   # Document(name, kind, text, pages, page_ends, encoding)
    frame(doc)                                       # '<document name="notes.docx" type="DOCX">\\n…\\n</document>'

Runs in a conversion process (``reading.py`` owns the pool): nothing here touches the event loop or Chainlit.

- **The type comes from the content**, never from the name: ``%PDF-``, a zip's parts (``word/document.xml`` is a
  DOCX, ``ppt/presentation.xml`` a PPTX), image signatures, else text when a decoding is found. The name's
  extension must agree (a binary renamed ``.txt``, a zip renamed ``.docx``: ``DocumentTypeMismatch``).
- **Text is decoded with the encoding detected** (a BOM, else charset-normalizer), never assumed to be UTF-8.
- **A zip is checked before anything is inflated**: the sizes its directory declares, summed, against
  ``[uploads] max_unzipped_mb`` (``DocumentBomb``). zipfile never inflates a part past its declared size.
- **PDF**: PDFium (pypdfium2), page by page (``pdf_page_count``, ``pdf_pages``: the pool converts a long PDF in
  chunks, for progress and Stop). A password: ``DocumentEncrypted``; no text on any page: ``DocumentNoText``.
- **DOCX**: mammoth to HTML, then the same HTML-to-text as an HTML file (headings ``#``, lists ``-``, table rows
  ``a | b``). **PPTX**: each slide's text (one "page" per slide), read from its XML with the standard library.
- **Framing** (``frame``): a document reaches the model between ``<document …>`` and ``</document>`` lines naming
  it, its type and its pages. The same markers written inside a document or a message are broken with an
  invisible U+2060 WORD JOINER (``neutralize_frames``), so neither can open or close a frame of its own.
"""

from __future__ import annotations

import base64
import codecs
import hashlib
import html
import re
import zipfile
from dataclasses import asdict, dataclass, field, replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from ..text import t
from .document_errors import (
    DocumentBomb,
    DocumentEncrypted,
    DocumentError,
    DocumentNoText,
    DocumentTypeMismatch,
    DocumentUnreadable,
    DocumentUnsupported,
)
from .template import NEUTRALIZER

IMAGE_SUFFIXES = frozenset([".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp"])
#: What the name's extension claims, by extension; any other extension claims nothing (the content decides).
TEXT_SUFFIXES = frozenset(
    [
        ".txt",
        ".md",
        ".markdown",
        ".rst",
        ".py",
        ".pyi",
        ".js",
        ".mjs",
        ".cjs",
        ".ts",
        ".tsx",
        ".jsx",
        ".java",
        ".kt",
        ".go",
        ".rs",
        ".c",
        ".h",
        ".cc",
        ".cpp",
        ".hpp",
        ".cs",
        ".rb",
        ".php",
        ".swift",
        ".scala",
        ".sh",
        ".bash",
        ".zsh",
        ".sql",
        ".json",
        ".jsonl",
        ".yaml",
        ".yml",
        ".toml",
        ".ini",
        ".cfg",
        ".conf",
        ".csv",
        ".tsv",
        ".log",
        ".xml",
        ".tex",
        ".r",
        ".lua",
        ".pl",
        ".diff",
        ".patch",
        ".css",
        ".scss",
        ".vue",
        ".svelte",
        ".env",
        ".properties",
        ".gradle",
        ".dockerfile",
        ".proto",
        ".graphql",
    ]
)
CLAIMS: dict[str, str] = {
    ".pdf": "pdf",
    ".docx": "docx",
    ".pptx": "pptx",
    ".html": "html",
    ".htm": "html",
    **{s: "image" for s in IMAGE_SUFFIXES},
    **dict.fromkeys(TEXT_SUFFIXES, "text"),
}
#: What the chat converts; Chainlit's upload button offers these (``accept``), the content decides in the end.
ACCEPT = tuple(sorted(CLAIMS))
#: How each kind is named to the user and in the frame.
KIND_NAMES = {"pdf": "PDF", "docx": "DOCX", "pptx": "PPTX", "html": "HTML", "text": "text", "image": "image"}
#: What the content was found to be, for messages about a type that is not converted or does not match.
FOUND_NAMES = {**KIND_NAMES, "zip": "a zip archive", "binary": "binary data (no text encoding fits)"}
_IMAGE_MIMES = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
)
_IMAGE_MAGIC = tuple(magic for magic, _ in _IMAGE_MIMES)
_SNIFF_BYTES = 1 << 16
#: Encodings preferred when several decode a text equally well, most common first.
_COMMON = ("ascii", "utf_8", "gb18030", "gbk", "big5", "shift_jis", "euc_kr", "cp1252", "latin_1", "cp1251")
_MB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """The [uploads] limits a conversion checks (a plain value: it crosses into the conversion process)."""

    max_bytes: int = 20 * _MB
    max_unzipped_bytes: int = 100 * _MB


@dataclass(frozen=True)
class Document:
    """One attached file as text. ``page_ends``: where each page (PDF, slide) ends in ``text``; empty for the
    others, which are cut by lines. ``cut``: the pages (or lines) kept when the user chose to send only the part
    that fits; 0 = whole."""

    name: str
    kind: str
    text: str
    pages: int = 0
    page_ends: tuple[int, ...] = field(default=(), repr=False)
    encoding: str = ""
    cut: int = 0
    data: str = field(default="", repr=False)  # an image: its ``data:`` URL (sent as an image part), else ""
    file: str = ""  # the id of the original file kept ([uploads] keep_originals: backend/storage/files.py), else ""

    @property
    def unit(self) -> str:
        """How the document is cut: "pages" (PDF, PPTX) or "lines"."""
        return "pages" if self.page_ends else "lines"

    @property
    def units(self) -> int:
        """How many pages (or lines) the whole document has."""
        return len(self.page_ends) if self.page_ends else self.text.count("\n") + 1

    def first(self, n: int) -> Document:
        """The document cut to its first ``n`` pages (or lines), saying so in its frame."""
        if self.page_ends:
            end = self.page_ends[max(0, min(n, len(self.page_ends)) - 1)] if n > 0 else 0
        else:
            end = sum(len(line) + 1 for line in self.text.split("\n")[:n])
        return replace(self, text=self.text[:end].rstrip("\n"), cut=n)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["page_ends"] = list(self.page_ends)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Document:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["page_ends"] = tuple(int(x) for x in known.get("page_ends") or ())
        return cls(**known)


def describe(doc: Document, lang: str) -> str:
    """ "report.pdf: PDF · 12 pages · 34,567 characters" (the reading step, /export); an image: its size."""
    if doc.kind == "image":
        return t("image_parts.read", lang, name=doc.name, kb=max(1, len(doc.data) * 3 // 4 // 1024))
    pages = t("document.read_one_page", lang) if doc.pages == 1 else ""
    pages = t("document.read_pages", lang, pages=doc.pages) if doc.pages > 1 else pages
    return t(
        "document.read", lang, name=doc.name, kind=KIND_NAMES.get(doc.kind, doc.kind), pages=pages, chars=len(doc.text)
    )


def fenced(text: str) -> str:
    """``text`` in a fenced block that shows it verbatim (a fence longer than any run of backticks inside)."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


# ---------------------------------------------------------------- framing

_FRAME_MARK = re.compile(r"<(/?)(document)", re.IGNORECASE)


def neutralize_frames(text: str) -> str:
    """``text`` with every ``<document`` / ``</document`` broken by U+2060, so it cannot open or close a frame."""
    return _FRAME_MARK.sub(lambda m: "<" + NEUTRALIZER + m.group(1) + m.group(2), text)


def _attribute(value: str) -> str:
    """A file name as a frame attribute: one line, no quotes or angle brackets."""
    return html.escape(" ".join(value.split()), quote=True)


def frame(doc: Document) -> str:
    """The document as the model reads it: a header naming it, its type and its pages, its text, a footer."""
    attrs = f'name="{_attribute(doc.name)}" type="{KIND_NAMES.get(doc.kind, doc.kind)}"'
    if doc.cut:
        attrs += f' {doc.unit}="1-{doc.cut} of {doc.units}" cut="the rest was left out"'
    elif doc.pages:
        attrs += f' pages="{doc.pages}"'
    return f"<document {attrs}>\n{neutralize_frames(doc.text)}\n</document>"


def reference_frame(doc: Document, tokens: int) -> str:
    """The document named, not carried: its frame with the SHA-256 of its text as the model read it (of the image's
    bytes for an image), its tokens and characters, and ``text="omitted"`` (a preference pair's prompt keeps a long
    document so: ``compare.turn_prompt``)."""
    body = base64.b64decode(doc.data.partition(",")[2]) if doc.kind == "image" else doc.text.encode("utf-8")
    attrs = f'name="{_attribute(doc.name)}" type="{KIND_NAMES.get(doc.kind, doc.kind)}"'
    attrs += f' pages="{doc.pages}"' if doc.pages else ""
    attrs += f' sha256="{hashlib.sha256(body).hexdigest()}" tokens="{tokens}" characters="{len(doc.text)}"'
    return f'<document {attrs} text="omitted">\n</document>'


def framed_message(question: str, documents: tuple[Document, ...] | list[Document]) -> str:
    """A user message as sent: its documents' frames first, then the question (its frame markers broken too).
    Images are not framed: they go as image parts beside this text (``vision.with_images``)."""
    if not documents:
        return question
    return "\n\n".join([*(frame(d) for d in documents if d.kind != "image"), neutralize_frames(question)])


# ---------------------------------------------------------------- finding the type


def _zip_kind(path: Path, name: str, limits: Limits) -> str:
    """ "docx", "pptx" or "zip" from the parts a zip lists; a bomb refused on its declared sizes, nothing inflated."""
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise DocumentUnreadable(name, "zip", str(exc)) from exc
    declared = sum(i.file_size for i in infos)
    if declared > limits.max_unzipped_bytes:
        raise DocumentBomb(name, declared / _MB, limits.max_unzipped_bytes / _MB)
    names = {i.filename for i in infos}
    if "word/document.xml" in names:
        return "docx"
    if "ppt/presentation.xml" in names:
        return "pptx"
    return "zip"


def _decode(data: bytes) -> tuple[str, str] | None:
    """(text, encoding) by the BOM, else charset-normalizer's best guess; None when no encoding fits (binary)."""
    for bom, enc in ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16")):
        if data.startswith(bom):
            return data.decode(enc, errors="replace"), enc
    if not data:
        return "", "utf-8"
    if b"\0" in data[:_SNIFF_BYTES]:
        return None  # no text encoding without a BOM puts NUL bytes in text
    from charset_normalizer import from_bytes

    found = list(from_bytes(data))
    if not found:
        return None
    # Single-byte code pages often tie (cp1250 and cp1252 read French text equally "well"): among the guesses as
    # good as the best, the most common encoding wins, else charset-normalizer's own order.
    best = min(m.chaos for m in found)
    tied = [m for m in found if m.chaos <= best + 1e-6]
    pick = min(tied, key=lambda m: _COMMON.index(m.encoding) if m.encoding in _COMMON else len(_COMMON))
    return str(pick), pick.encoding


def image_mime(head: bytes) -> str:
    """The MIME type of an image from its first bytes ("" when it is none we read)."""
    for magic, mime in _IMAGE_MIMES:
        if head.startswith(magic):
            return mime
    return "image/webp" if head[:4] == b"RIFF" and head[8:12] == b"WEBP" else ""


def image_document(path: Path, name: str) -> Document:
    """An image kept whole as a ``data:`` URL, for a model that reads images (``reading.py`` refuses it otherwise)."""
    raw = path.read_bytes()
    return Document(name, "image", "", data=f"data:{image_mime(raw[:16])};base64,{base64.b64encode(raw).decode()}")


def _found(path: Path, name: str, limits: Limits) -> str:
    """What the content is: pdf, docx, pptx, zip, image, html, text or binary."""
    with path.open("rb") as f:
        start = f.read(_SNIFF_BYTES)
    head = start[:1024]
    if b"%PDF-" in head:
        return "pdf"
    if head.startswith(b"PK\x03\x04"):
        return _zip_kind(path, name, limits)
    if head.startswith(_IMAGE_MAGIC) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP"):
        return "image"
    decoded = _decode(start)
    if decoded is None:
        return "binary"
    if re.match(r"\s*(<!doctype html|<html)", decoded[0][:512], re.IGNORECASE):
        return "html"
    return "text"


def sniff(path: Path, name: str, limits: Limits) -> str:
    """The kind to convert ``path`` as (named ``name`` by the user); raises when it cannot or the name lies."""
    found = _found(path, name, limits)
    suffix = Path(name).suffix.lower()
    claimed = CLAIMS.get(suffix)
    fits = claimed is None or claimed == found or {claimed, found} <= {"html", "text"}
    if not fits:
        raise DocumentTypeMismatch(name, f"{suffix} ({KIND_NAMES.get(claimed or '', claimed)})", FOUND_NAMES[found])
    if found in ("zip", "binary"):
        raise DocumentUnsupported(name, FOUND_NAMES[found])
    return "text" if claimed == "text" and found == "html" else found


# ---------------------------------------------------------------- converting


def convert_file(path: Path, name: str, limits: Limits | None = None) -> Document:
    """``path`` as a Document, whole (a PDF too: ``reading.py`` converts long ones in chunks instead)."""
    limits = limits or Limits()
    kind = sniff(path, name, limits)
    if kind == "pdf":
        count = pdf_page_count(path, name)
        return pdf_document(name, pdf_pages(path, name, 0, count), count)
    if kind == "image":
        return image_document(path, name)
    if kind == "docx":
        return Document(name, "docx", docx_text(path, name))
    if kind == "pptx":
        slides = pptx_slides(path, name)
        text, ends = _joined(slides)
        return Document(name, "pptx", text, pages=len(slides), page_ends=ends)
    decoded = _decode(path.read_bytes())
    if decoded is None:  # the head decoded, the whole did not
        raise DocumentTypeMismatch(name, KIND_NAMES[kind], FOUND_NAMES["binary"])
    text, encoding = decoded
    if kind == "html":
        return Document(name, "html", html_text(text), encoding=encoding)
    return Document(name, "text", text.replace("\r\n", "\n"), encoding=encoding)


def _joined(pages: list[str]) -> tuple[str, tuple[int, ...]]:
    """Pages as one text (a blank line between them) and where each ends in it."""
    ends, pos = [], 0
    for i, page in enumerate(pages):
        pos += len(page) + (2 if i else 0)
        ends.append(pos)
    return "\n\n".join(pages), tuple(ends)


def pdf_document(name: str, pages: list[str], count: int) -> Document:
    """The pages of a PDF as one Document; a PDF with no text on any page is refused (no OCR here)."""
    if not any(p.strip() for p in pages):
        raise DocumentNoText(name, count)
    text, ends = _joined(pages)
    return Document(name, "pdf", text, pages=count, page_ends=ends)


def pdf_page_count(path: Path, name: str) -> int:
    """How many pages; a password-protected PDF is refused here, before any page is read."""
    import pypdfium2 as pdfium  # type: ignore[import-untyped]

    try:
        doc = pdfium.PdfDocument(str(path))
    except pdfium.PdfiumError as exc:
        if "password" in str(exc).lower():
            raise DocumentEncrypted(name) from exc
        raise DocumentUnreadable(name, "PDF", str(exc)) from exc
    try:
        return len(doc)
    finally:
        doc.close()


def pdf_pages(path: Path, name: str, start: int, stop: int) -> list[str]:
    """The text of pages ``start`` ≤ i < ``stop`` (0-based), each with its line ends as ``\\n``."""
    import pypdfium2 as pdfium

    try:
        doc = pdfium.PdfDocument(str(path))
    except pdfium.PdfiumError as exc:
        raise DocumentUnreadable(name, "PDF", str(exc)) from exc
    try:
        out = []
        for i in range(start, stop):
            page = doc[i]
            textpage = page.get_textpage()
            out.append(textpage.get_text_range().replace("\r\n", "\n").replace("\r", "\n").strip("\n"))
            textpage.close()
            page.close()
        return out
    finally:
        doc.close()


def docx_text(path: Path, name: str) -> str:
    """A DOCX's text: mammoth's HTML (headings, lists, tables kept), then ``html_text``."""
    import mammoth  # type: ignore[import-untyped]

    try:
        with path.open("rb") as f:
            result = mammoth.convert_to_html(f)
    except Exception as exc:
        raise DocumentUnreadable(name, "DOCX", f"{type(exc).__name__}: {exc}"[:200]) from exc
    return html_text(str(result.value))


_A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"


def pptx_slides(path: Path, name: str) -> list[str]:
    """Each slide's text, in slide order (ppt/slides/slideN.xml), one line per paragraph."""
    try:
        with zipfile.ZipFile(path) as z:
            numbers = sorted(
                int(m.group(1)) for n in z.namelist() if (m := re.fullmatch(r"ppt/slides/slide(\d+)\.xml", n))
            )
            slides = []
            for number in numbers:
                root = ElementTree.fromstring(z.read(f"ppt/slides/slide{number}.xml"))
                lines = ["".join(t.text or "" for t in p.iter(f"{_A}t")) for p in root.iter(f"{_A}p")]
                slides.append("\n".join(line for line in lines if line.strip()))
    except (zipfile.BadZipFile, ElementTree.ParseError, KeyError, OSError) as exc:
        raise DocumentUnreadable(name, "PPTX", str(exc)) from exc
    return slides


class _HtmlText(HTMLParser):
    """HTML to plain text with its structure: headings ``#``, list items ``-``, table cells ``|``, blocks apart."""

    BLOCKS = frozenset(
        [
            "p",
            "div",
            "br",
            "li",
            "tr",
            "h1",
            "h2",
            "h3",
            "h4",
            "h5",
            "h6",
            "table",
            "ul",
            "ol",
            "section",
            "article",
            "pre",
            "blockquote",
            "hr",
        ]
    )
    SKIP = frozenset(("script", "style", "head", "template", "noscript"))

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.skipping = 0
        self.cells = 0  # cells so far in the current table row
        self.in_cell = 0  # inside a td/th: its paragraphs stay on the row's line

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIP:
            self.skipping += 1
        elif self.in_cell and tag in ("p", "div", "br"):
            self.out.append(" ")
        elif tag in self.BLOCKS:
            self.out.append("\n")
            self.cells = 0 if tag == "tr" else self.cells
            if len(tag) == 2 and tag[0] == "h" and tag[1].isdigit():
                self.out.append("#" * int(tag[1]) + " ")
            elif tag == "li":
                self.out.append("- ")
        elif tag in ("td", "th"):
            self.out.append(" | " if self.cells else "")
            self.cells += 1
            self.in_cell += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif tag in ("td", "th"):
            self.in_cell = max(0, self.in_cell - 1)
        elif self.in_cell and tag in ("p", "div", "br"):
            pass
        elif tag in self.BLOCKS:
            self.out.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.out.append(" ".join(data.split()) if data.strip() else (" " if data else ""))


def html_text(markup: str) -> str:
    """The readable text of an HTML page or fragment (see ``_HtmlText``)."""
    parser = _HtmlText()
    parser.feed(markup)
    parser.close()
    lines = [re.sub(r"[ \t]{2,}", " ", line).strip() for line in "".join(parser.out).split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


__all__ = ["ACCEPT", "Document", "DocumentError", "Limits", "convert_file", "frame", "framed_message", "sniff"]
