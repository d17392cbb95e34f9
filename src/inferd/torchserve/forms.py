"""A TorchServe request body as the handler's parameters: (name, value, content type) each.

TorchServe reads a ``multipart/form-data`` body as one parameter per field (a file field keeps
its part's content type, a plain field has none), an ``application/x-www-form-urlencoded``
body as one parameter per ``name=value`` pair, and any other body as the one parameter
``body`` with the request's MIME type (its ``Content-Type`` without parameters).
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from inferd.torchserve.errors import bad_request

MULTIPART = "multipart/form-data"
URLENCODED = "application/x-www-form-urlencoded"
OCTET_STREAM = "application/octet-stream"
PARSED = (MULTIPART, URLENCODED)  # the bodies cut into several parameters (any other is one)

Parameters = tuple[list[bytes], list[str], list[str]]  # values, names, content types


def mime_type(content_type: str) -> str:
    """The MIME type of a ``Content-Type`` header (case kept, parameters dropped)."""
    return content_type.split(";", 1)[0].strip()


def parameters(body: bytes, content_type: str) -> Parameters:
    mime = mime_type(content_type)
    lowered = mime.lower()
    if lowered == MULTIPART:
        return _multipart(body, content_type)
    if lowered == URLENCODED:
        return _urlencoded(body)
    return [body], ["body"], [mime]


def _urlencoded(body: bytes) -> Parameters:
    values: list[bytes] = []
    names: list[str] = []
    for pair in body.split(b"&"):
        name, sep, value = pair.partition(b"=")
        if not sep or not name:
            continue
        names.append(_unquote(name).decode("utf-8", "replace"))
        values.append(_unquote(value))
    return values, names, [""] * len(names)


def _unquote(data: bytes) -> bytes:
    return unquote_to_bytes(data.replace(b"+", b" "))


def _boundary(content_type: str) -> bytes:
    for part in content_type.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.strip().lower() == "boundary" and value:
            return value.strip().strip('"').encode("latin-1")
    raise bad_request("the multipart body's Content-Type has no boundary")


def _multipart(body: bytes, content_type: str) -> Parameters:
    delimiter = b"--" + _boundary(content_type)
    values: list[bytes] = []
    names: list[str] = []
    types: list[str] = []
    chunks = body.split(delimiter)
    if len(chunks) < 2:
        raise bad_request("the multipart body has no part")
    for chunk in chunks[1:]:
        if chunk.startswith(b"--"):
            break  # the closing delimiter
        if chunk.startswith(b"\r\n"):
            chunk = chunk[2:]
        head, sep, value = chunk.partition(b"\r\n\r\n")
        if not sep:
            raise bad_request("a part of the multipart body has no end of headers")
        if value.endswith(b"\r\n"):
            value = value[:-2]
        name = filename = None
        part_type = ""
        for line in head.split(b"\r\n"):
            key, _, raw = line.decode("utf-8", "replace").partition(":")
            key = key.strip().lower()
            if key == "content-disposition":
                for item in raw.split(";")[1:]:
                    field, _, text = item.strip().partition("=")
                    text = text.strip().strip('"')
                    if field.strip().lower() == "name":
                        name = text
                    elif field.strip().lower() == "filename":
                        filename = text
            elif key == "content-type":
                part_type = mime_type(raw)
        if name is None:
            raise bad_request("a part of the multipart body has no name")
        names.append(name)
        values.append(value)
        types.append((part_type or OCTET_STREAM) if filename is not None else "")
    return values, names, types
