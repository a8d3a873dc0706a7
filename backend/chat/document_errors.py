"""The errors of a file attached in the chat (backend/chat/documents.py, reading.py): one branch of the exception
tree drawn in backend/errors.py, kept beside the code that raises it.

    DocumentError              a file attached in the chat cannot be read as text; ``name`` is the file's name
    ├── DocumentTooLarge       over [uploads] max_mb
    ├── TooManyDocuments       more files than [uploads] max_files in one message
    ├── DocumentTypeMismatch   the name's extension says one type, the content another
    ├── DocumentUnsupported    a type the chat does not read (an archive, an unknown binary)
    ├── DocumentBomb           a zip (DOCX, PPTX) declaring more than [uploads] max_unzipped_mb inflated
    ├── DocumentEncrypted      a PDF that needs a password
    ├── DocumentNoText         a PDF with no text layer (scanned): no OCR is done
    ├── DocumentUnreadable     a damaged file the converter could not read
    └── ImageNotSupported      an image, sent to a model that reads text only

A conversion runs in a child process (convert_child.py): its error comes back by class name and parameters and is
made again here (``rebuilt_error``).
"""

from __future__ import annotations

from typing import Any

from ..errors import QwenChatError


def rebuilt_error(cls: type[DocumentError], params: dict[str, Any]) -> DocumentError:
    """A DocumentError made again from its parameters (it comes back from a conversion process pickled)."""
    exc = cls.__new__(cls)
    vars(exc).update(params)
    Exception.__init__(exc, exc.user_text("en"))
    return exc


class DocumentError(QwenChatError):
    """A file attached in the chat cannot be read as text; ``name`` is the file's name."""

    code = "document"
    text_key = "error.document"
    name: str

    def __reduce__(self) -> tuple[Any, ...]:
        return (rebuilt_error, (type(self), self.params))


class DocumentTooLarge(DocumentError):
    """The file is larger than [uploads] max_mb."""

    code = "document_too_large"
    text_key = "error.document_too_large"

    def __init__(self, name: str, mb: float, limit: float) -> None:
        self.name, self.mb, self.limit = name, mb, limit
        super().__init__()


class TooManyDocuments(DocumentError):
    """More files in one message than [uploads] max_files."""

    code = "too_many_documents"
    text_key = "error.too_many_documents"

    def __init__(self, count: int, limit: int) -> None:
        self.name, self.count, self.limit = "", count, limit
        super().__init__()


class DocumentTypeMismatch(DocumentError):
    """The extension says one type (``claimed``), the content is another (``found``)."""

    code = "document_type_mismatch"
    text_key = "error.document_type_mismatch"

    def __init__(self, name: str, claimed: str, found: str) -> None:
        self.name, self.claimed, self.found = name, claimed, found
        super().__init__()


class DocumentUnsupported(DocumentError):
    """A type the chat does not convert (``found``: what the content is)."""

    code = "document_unsupported"
    text_key = "error.document_unsupported"

    def __init__(self, name: str, found: str) -> None:
        self.name, self.found = name, found
        super().__init__()


class DocumentBomb(DocumentError):
    """A zip-based file whose parts declare more than [uploads] max_unzipped_mb once inflated; none was inflated."""

    code = "document_bomb"
    text_key = "error.document_bomb"

    def __init__(self, name: str, mb: float, limit: float) -> None:
        self.name, self.mb, self.limit = name, mb, limit
        super().__init__()


class DocumentEncrypted(DocumentError):
    """A PDF that needs a password to be read."""

    code = "document_encrypted"
    text_key = "error.document_encrypted"

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__()


class DocumentNoText(DocumentError):
    """A PDF whose pages carry no text layer (a scan); the chat does no OCR."""

    code = "document_no_text"
    text_key = "error.document_no_text"

    def __init__(self, name: str, pages: int) -> None:
        self.name, self.pages = name, pages
        super().__init__()


class DocumentUnreadable(DocumentError):
    """The converter could not read the file (damaged, truncated); ``detail`` is its reason."""

    code = "document_unreadable"
    text_key = "error.document_unreadable"

    def __init__(self, name: str, kind: str, detail: str) -> None:
        self.name, self.kind = name, kind
        super().__init__(detail)


class ImageNotSupported(DocumentError):
    """An image attached for a model that reads text only."""

    code = "image_not_supported"
    text_key = "error.image_not_supported"

    def __init__(self, name: str, model: str) -> None:
        self.name, self.model = name, model
        super().__init__()
