"""A ctypes binding to the parts of libnghttp2 (the HTTP/2 library curl uses) that a gRPC server
needs: a server session fed with received bytes, callbacks for headers, data and stream ends,
responses whose data comes from a read callback, trailers, and settings.

libnghttp2 does the framing, HPACK and flow control in C; Python sees one callback per header,
data chunk and frame. ``load()`` returns None when the library is missing, so the server can
fall back to grpcio.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    Union,
    c_char_p,
    c_int,
    c_int32,
    c_size_t,
    c_ssize_t,
    c_uint8,
    c_uint32,
    c_void_p,
)
from typing import Any

# Frame types and flags (RFC 9113).
DATA = 0x0
HEADERS = 0x1
RST_STREAM = 0x3
SETTINGS = 0x4
PING = 0x6
GOAWAY = 0x7
FLAG_END_STREAM = 0x1
FLAG_ACK = 0x1  # on SETTINGS and PING
FLAG_NONE = 0x0

# Data provider flags and the "no data yet" answer of a read callback.
DATA_FLAG_EOF = 0x01
DATA_FLAG_NO_END_STREAM = 0x02
ERR_DEFERRED = -508
ERR_TEMPORAL_CALLBACK_FAILURE = -521  # resets the stream, the session goes on
ERR_CALLBACK_FAILURE = -902

# Settings ids.
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

# Error codes for RST_STREAM and GOAWAY.
NO_ERROR = 0x0
INTERNAL_ERROR = 0x2
REFUSED_STREAM = 0x7
CANCEL = 0x8
ENHANCE_YOUR_CALM = 0xB


class NV(Structure):
    """One header: name and value pointers with their lengths."""

    _fields_ = [
        ("name", c_void_p),
        ("value", c_void_p),
        ("namelen", c_size_t),
        ("valuelen", c_size_t),
        ("flags", c_uint8),
    ]


class FrameHd(Structure):
    """The header every ``nghttp2_frame`` starts with."""

    _fields_ = [
        ("length", c_size_t),
        ("stream_id", c_int32),
        ("type", c_uint8),
        ("flags", c_uint8),
        ("reserved", c_uint8),
    ]


class DataSource(Union):
    _fields_ = [("fd", c_int), ("ptr", c_void_p)]


# Callback arguments are plain ints (c_void_p, c_char_p: bytes) rather than POINTER(...) types:
# ctypes builds a new pointer object for each POINTER argument of each call, which cost more
# than the rest of a header callback. Frames are read with ``FrameHd.from_address``.
ReadCallback = CFUNCTYPE(
    c_ssize_t, c_void_p, c_int32, c_void_p, c_size_t, c_void_p, c_void_p, c_void_p
)


class DataProvider(Structure):
    _fields_ = [("source", DataSource), ("read_callback", ReadCallback)]


class SettingsEntry(Structure):
    _fields_ = [("settings_id", c_int32), ("value", c_uint32)]


SendCallback = CFUNCTYPE(c_ssize_t, c_void_p, c_void_p, c_size_t, c_int, c_void_p)
FrameCallback = CFUNCTYPE(c_int, c_void_p, c_void_p, c_void_p)
# nghttp2 hands each header's name and value NUL-terminated (it rejects NUL inside them unless
# told not to check headers), so ctypes can make them bytes without a string_at call each.
HeaderCallback = CFUNCTYPE(
    c_int, c_void_p, c_void_p, c_char_p, c_size_t, c_char_p, c_size_t, c_uint8, c_void_p
)
DataChunkCallback = CFUNCTYPE(c_int, c_void_p, c_uint8, c_int32, c_void_p, c_size_t, c_void_p)
StreamCloseCallback = CFUNCTYPE(c_int, c_void_p, c_int32, c_uint32, c_void_p)

_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "nghttp2_session_callbacks_new": (c_int, [POINTER(c_void_p)]),
    "nghttp2_session_callbacks_del": (None, [c_void_p]),
    "nghttp2_session_callbacks_set_send_callback": (None, [c_void_p, c_void_p]),
    "nghttp2_session_callbacks_set_on_begin_headers_callback": (None, [c_void_p, c_void_p]),
    "nghttp2_session_callbacks_set_on_header_callback": (None, [c_void_p, c_void_p]),
    "nghttp2_session_callbacks_set_on_frame_recv_callback": (None, [c_void_p, c_void_p]),
    "nghttp2_session_callbacks_set_on_data_chunk_recv_callback": (None, [c_void_p, c_void_p]),
    "nghttp2_session_callbacks_set_on_stream_close_callback": (None, [c_void_p, c_void_p]),
    "nghttp2_session_server_new2": (c_int, [POINTER(c_void_p), c_void_p, c_void_p, c_void_p]),
    "nghttp2_option_new": (c_int, [POINTER(c_void_p)]),
    "nghttp2_option_del": (None, [c_void_p]),
    "nghttp2_option_set_no_auto_window_update": (None, [c_void_p, c_int]),
    "nghttp2_option_set_no_closed_streams": (None, [c_void_p, c_int]),
    "nghttp2_session_consume": (c_int, [c_void_p, c_int32, c_size_t]),
    "nghttp2_session_consume_connection": (c_int, [c_void_p, c_size_t]),
    "nghttp2_submit_ping": (c_int, [c_void_p, c_uint8, c_void_p]),
    "nghttp2_session_del": (None, [c_void_p]),
    "nghttp2_session_mem_recv": (c_ssize_t, [c_void_p, c_char_p, c_size_t]),
    # Pointers the calls of every request take are declared c_void_p and given as addresses:
    # ctypes checks a POINTER(...) argument against its type each call, at a cost of about
    # a whole call more.
    "nghttp2_session_send": (c_int, [c_void_p]),
    "nghttp2_session_want_read": (c_int, [c_void_p]),
    "nghttp2_session_want_write": (c_int, [c_void_p]),
    "nghttp2_session_resume_data": (c_int, [c_void_p, c_int32]),
    "nghttp2_session_set_local_window_size": (c_int, [c_void_p, c_uint8, c_int32, c_int32]),
    "nghttp2_session_get_last_proc_stream_id": (c_int32, [c_void_p]),
    "nghttp2_submit_settings": (c_int, [c_void_p, c_uint8, POINTER(SettingsEntry), c_size_t]),
    "nghttp2_submit_response": (c_int, [c_void_p, c_int32, c_void_p, c_size_t, c_void_p]),
    "nghttp2_submit_trailer": (c_int, [c_void_p, c_int32, c_void_p, c_size_t]),
    "nghttp2_submit_rst_stream": (c_int, [c_void_p, c_uint8, c_int32, c_uint32]),
    "nghttp2_submit_goaway": (c_int, [c_void_p, c_uint8, c_int32, c_uint32, c_char_p, c_size_t]),
    "nghttp2_strerror": (c_char_p, [c_int]),
}


# bytes from a pointer and a length: what ctypes.string_at calls, without its Python wrapper.
bytes_at = ctypes.PYFUNCTYPE(ctypes.py_object, c_void_p, c_ssize_t)(
    ("PyBytes_FromStringAndSize", ctypes.pythonapi)
)

# ctypes.memmove with the GIL kept, for the read callback.
memmove = ctypes.PYFUNCTYPE(c_void_p, c_void_p, c_void_p, c_size_t)(
    ctypes.cast(ctypes.memmove, c_void_p).value or 0  # never NULL: ctypes' own memmove
)


def load() -> Any | None:
    """The library with its prototypes set, or None when it cannot be loaded."""
    names = ["libnghttp2.so.14"]
    found = ctypes.util.find_library("nghttp2")
    if found:
        names.append(found)
    for name in names:
        try:
            # PyDLL: calls keep the GIL. Each is a few microseconds of C that never blocks, so
            # releasing the GIL around it (and taking it back in every callback it makes)
            # only cost time.
            lib = ctypes.PyDLL(name)
        except OSError:
            continue
        try:
            for function, (restype, argtypes) in _SIGNATURES.items():
                fn = getattr(lib, function)
                fn.restype = restype
                fn.argtypes = argtypes
        except AttributeError:
            continue
        return lib
    return None


class Headers:
    """A header list kept alive for as long as nghttp2 may read it (it copies on submit)."""

    __slots__ = ("_keep", "address", "array", "count")

    def __init__(self, pairs: list[tuple[bytes, bytes]]) -> None:
        self.count = len(pairs)
        self.array = (NV * max(1, len(pairs)))()
        self._keep: list[Any] = []
        for i, (name, value) in enumerate(pairs):
            n = ctypes.create_string_buffer(name, len(name))
            v = ctypes.create_string_buffer(value, len(value))
            self._keep += (n, v)
            self.array[i] = NV(ctypes.addressof(n), ctypes.addressof(v), len(name), len(value), 0)
        self.address = ctypes.addressof(self.array)


def new_server_session(lib: Any, session: c_void_p, callbacks: tuple[Any, ...]) -> None:
    """Create a server session in ``session`` with ``callbacks`` (on_begin_headers, on_header,
    on_frame_recv, on_data_chunk_recv, on_stream_close, send: kept alive by the caller)."""
    table = c_void_p()
    options = c_void_p()
    lib.nghttp2_session_callbacks_new(ctypes.byref(table))
    lib.nghttp2_option_new(ctypes.byref(options))
    try:
        names = ("on_begin_headers", "on_header", "on_frame_recv", "on_data_chunk_recv")
        for name, callback in zip((*names, "on_stream_close", "send"), callbacks, strict=True):
            setter = getattr(lib, f"nghttp2_session_callbacks_set_{name}_callback")
            setter(table, ctypes.cast(callback, c_void_p))
        # Windows reopen as calls take their bytes (nghttp2_session_consume), not as nghttp2
        # parses them; closed streams are forgotten at once.
        lib.nghttp2_option_set_no_auto_window_update(options, 1)
        lib.nghttp2_option_set_no_closed_streams(options, 1)
        if lib.nghttp2_session_server_new2(ctypes.byref(session), table, None, options):
            raise MemoryError("nghttp2_session_server_new2 failed")
    finally:
        lib.nghttp2_option_del(options)
        lib.nghttp2_session_callbacks_del(table)
