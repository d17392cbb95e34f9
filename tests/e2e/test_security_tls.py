"""TLS on both ports: HTTPS and gRPC over TLS with --tls-cert/--tls-key, mutual TLS on gRPC
with Triton's flag names; a CA and certificates made in the test (``cryptography``)."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from tritonclient.utils import InferenceServerException

from tests.e2e.lifecycle_support import write_version
from tests.support import ServerProcess


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _issue(
    subject: str, key: ec.EllipticCurvePrivateKey, ca_key: ec.EllipticCurvePrivateKey, *, ca: bool
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name("inferd test CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _write(
    folder: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_path, _ = _write(folder, "ca", _issue("inferd test CA", ca_key, ca_key, ca=True), ca_key)
    server_key = ec.generate_private_key(ec.SECP256R1())
    cert, key = _write(
        folder, "server", _issue("localhost", server_key, ca_key, ca=False), server_key
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert, client_key_path = _write(
        folder, "client", _issue("client", client_key, ca_key, ca=False), client_key
    )
    return Pki(ca_path, cert, key, client_cert, client_key_path)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tls") / "models"
    write_version(root / "half_plus_two", 1)
    return root


def _tls_server(repo: Path, pki: Pki, *extra: str) -> ServerProcess:
    args = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), *extra]
    server = ServerProcess(repo, extra_args=args, scheme="https", verify=str(pki.ca))
    return server


@pytest.fixture(scope="module")
def tls_server(repo: Path, pki: Pki) -> Iterator[ServerProcess]:
    server = _tls_server(repo, pki).start()
    yield server
    server.stop()


# Both gRPC servers take the same TLS flags: the native one (the default) and grpcio.
GRPC_SERVERS = ["native", "grpcio"]


@pytest.fixture(scope="module", params=GRPC_SERVERS)
def grpc_tls_server(
    request: pytest.FixtureRequest, repo: Path, pki: Pki
) -> Iterator[ServerProcess]:
    server = _tls_server(repo, pki, "--grpc-server", request.param).start()
    assert f"over TLS on {server.grpc_address} ({request.param} server)" in server.log()
    yield server
    server.stop()


def test_https_with_tritonclient(tls_server: ServerProcess, pki: Pki) -> None:
    client = triton_http.InferenceServerClient(
        tls_server.http_address, ssl=True, ssl_options={"ca_certs": str(pki.ca)}
    )
    x = triton_http.InferInput("x", [2], "FP32")
    x.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
    np.testing.assert_allclose(client.infer("half_plus_two", [x]).as_numpy("y").ravel(), [2.5, 3.0])
    client.close()
    with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port gets nowhere
        httpx.get(f"http://127.0.0.1:{tls_server.http_port}/v2/health/ready", timeout=3)


def test_grpc_over_tls_with_tritonclient(grpc_tls_server: ServerProcess, pki: Pki) -> None:
    tls_server = grpc_tls_server
    with triton_grpc.InferenceServerClient(
        tls_server.grpc_address, ssl=True, root_certificates=str(pki.ca)
    ) as client:
        x = triton_grpc.InferInput("x", [1], "FP32")
        x.set_data_from_numpy(np.array([4.0], np.float32))
        np.testing.assert_allclose(client.infer("half_plus_two", [x]).as_numpy("y").ravel(), [4.0])
    with (
        triton_grpc.InferenceServerClient(tls_server.grpc_address) as plain,
        pytest.raises(InferenceServerException),
    ):
        plain.is_server_live(client_timeout=3)


@pytest.mark.parametrize("grpc_server", GRPC_SERVERS)
def test_mutual_tls_on_grpc_with_tritons_flag_names(repo: Path, pki: Pki, grpc_server: str) -> None:
    server = _tls_server(
        repo,
        pki,
        "--grpc-use-ssl-mutual",
        "--grpc-root-cert",
        str(pki.ca),
        "--grpc-server",
        grpc_server,
    ).start()
    try:
        assert f"over TLS on {server.grpc_address} ({grpc_server} server)" in server.log()
        with triton_grpc.InferenceServerClient(
            server.grpc_address,
            ssl=True,
            root_certificates=str(pki.ca),
            private_key=str(pki.client_key),
            certificate_chain=str(pki.client_cert),
        ) as client:
            assert client.is_server_live()
        with (
            triton_grpc.InferenceServerClient(
                server.grpc_address, ssl=True, root_certificates=str(pki.ca)
            ) as anonymous,
            pytest.raises(InferenceServerException),
        ):
            anonymous.is_server_live(client_timeout=3)
    finally:
        server.stop()
