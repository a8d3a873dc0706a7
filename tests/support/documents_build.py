"""Documents built at test time, with no library: a PDF (text pages, or pages with no text layer) and a DOCX.

    pdf = make_pdf(["page one text", "page two text"])        # bytes; Helvetica, one line per "\\n"
    scan = make_pdf(["", ""], drawn=True)                      # pages with a drawn box and no text: a "scan"
    docx = make_docx(["Title", "A paragraph."], table=[["a", "b"], ["1", "2"]])

Both follow the formats' smallest valid form (PDF 1.4 with an xref table; a DOCX's three required parts), so what
the converter reads is what the test wrote, not what a writer library chose to emit.
"""

from __future__ import annotations

import io
import zipfile
from xml.sax.saxutils import escape


def _pdf_text(line: str) -> str:
    return (
        line.encode("latin-1", "replace")
        .decode("latin-1")
        .replace("\\", "\\\\")
        .replace("(", "\\(")
        .replace(")", "\\)")
    )


def _page_stream(text: str, drawn: bool) -> bytes:
    if drawn or not text:
        return b"q 0.5 g 50 50 400 600 re f Q"  # a grey box: ink, but no text layer
    lines = text.split("\n")
    body = " T* ".join(f"({_pdf_text(line)}) Tj" for line in lines)
    return f"BT /F1 11 Tf 14 TL 50 800 Td {body} ET".encode("latin-1")


def make_pdf(pages: list[str], *, drawn: bool = False) -> bytes:
    """A PDF with one page per item of ``pages`` (each line of an item is a text line)."""
    objects: list[bytes] = []
    n = len(pages)
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(n))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode())
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
    for i, text in enumerate(pages):
        stream = _page_stream(text, drawn)
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Resources << /Font << /F1 3 0 R >> >> "
            f"/Contents {5 + 2 * i} 0 R >>".encode()
        )
        objects.append(f"<< /Length {len(stream)} >>\nstream\n".encode() + stream + b"\nendstream")
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(f"{number} 0 obj\n".encode() + body + b"\nendobj\n")
    xref = out.tell()
    out.write(f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode())
    for offset in offsets:
        out.write(f"{offset:010d} 00000 n \n".encode())
    out.write(f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode())
    return out.getvalue()


_W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
_CONTENT_TYPES = (
    '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
    '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
    '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
    '<Default Extension="xml" ContentType="application/xml"/>'
    '<Override PartName="/word/document.xml" '
    'ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>'
)
_RELS = (
    '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
    '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
    '<Relationship Id="rId1" '
    'Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" '
    'Target="word/document.xml"/></Relationships>'
)


def _para(text: str, style: str = "") -> str:
    props = f'<w:pPr><w:pStyle w:val="{style}"/></w:pPr>' if style else ""
    return f'<w:p>{props}<w:r><w:t xml:space="preserve">{escape(text)}</w:t></w:r></w:p>'


def make_docx(paragraphs: list[str], *, table: list[list[str]] | None = None, heading: str = "") -> bytes:
    """A DOCX: an optional heading (style Heading1), the paragraphs, then an optional table."""
    body = _para(heading, "Heading1") if heading else ""
    body += "".join(_para(p) for p in paragraphs)
    if table:
        rows = "".join("<w:tr>" + "".join(f"<w:tc>{_para(cell)}</w:tc>" for cell in row) + "</w:tr>" for row in table)
        body += f"<w:tbl>{rows}</w:tbl>"
    document = (
        f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document xmlns:w="{_W}"><w:body>{body}'
        "</w:body></w:document>"
    )
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", _CONTENT_TYPES)
        z.writestr("_rels/.rels", _RELS)
        z.writestr("word/document.xml", document)
    return out.getvalue()


def make_zip_bomb(declared: int) -> bytes:
    """A DOCX-shaped zip whose word/document.xml inflates to ``declared`` bytes (zeros compress ~1000:1)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", _CONTENT_TYPES)
        z.writestr("_rels/.rels", _RELS)
        with z.open("word/document.xml", "w", force_zip64=True) as f:
            chunk = b"\0" * (1 << 20)
            for _ in range(declared // len(chunk)):
                f.write(chunk)
    return out.getvalue()
