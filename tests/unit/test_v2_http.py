"""KServe v2 HTTP adapter pieces: Triton's choice of a response encoding."""

from __future__ import annotations

import pytest

from inferd.protocols.v2.http import response_encoding


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("gzip, deflate", "gzip"),  # a tie: the first listed
        ("deflate, gzip", "deflate"),
        ("gzip;q=0.2, deflate;q=0.8", "deflate"),
        ("identity, gzip;q=0.5", ""),
        ("br", ""),
        ("gzip;q=zero, deflate", "deflate"),  # a malformed weight skips that one
        ("", ""),
    ],
)
def test_response_encoding_follows_triton(accept: str, chosen: str) -> None:
    assert response_encoding(accept) == chosen
