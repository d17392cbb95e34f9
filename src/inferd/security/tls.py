"""TLS for the server's ports from PEM files: a certificate, its key and, for mutual TLS, the CA
that signs client certificates, in the form each server takes (granian's options, an
``ssl.SSLContext`` for the native gRPC server, grpcio's server credentials)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferd.core.errors import ConfigError


def read_pem(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read '{path}': {exc.strerror}") from None


@dataclass(frozen=True, slots=True)
class Tls:
    cert: str
    key: str
    client_ca: str = ""  # set: clients must present a certificate this CA signed

    def grpc_credentials(self) -> Any:
        """For grpcio's ``add_secure_port``."""
        import grpc

        return grpc.ssl_server_credentials(
            [(read_pem(self.key), read_pem(self.cert))],
            root_certificates=read_pem(self.client_ca) if self.client_ca else None,
            require_client_auth=bool(self.client_ca),
        )

    def ssl_context(self) -> ssl.SSLContext:
        """For the native gRPC server's ``add_secure_port`` (it sets ALPN h2 itself)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2  # HTTP/2 needs 1.2 or later
        try:
            context.load_cert_chain(self.cert, self.key)
            if self.client_ca:
                context.load_verify_locations(cafile=self.client_ca)
                context.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot use the TLS files {self.cert}, {self.key}: {exc}") from None
        return context

    def granian_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"ssl_cert": Path(self.cert), "ssl_key": Path(self.key)}
        if self.client_ca:
            options.update(ssl_ca=Path(self.client_ca), ssl_client_verify=True)
        return options
