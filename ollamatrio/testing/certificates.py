"""A throw-away certificate authority and a server certificate it signed, for HTTPS tests and
benchmarks (``OLLAMATRIO_TLS_CERT``/``_KEY``), made with the ``openssl`` command (no Python
dependency): a client that trusts ``ca`` verifies the server as ``localhost`` or
``127.0.0.1``."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
# What a strict verifier (Python 3.13's VERIFY_X509_STRICT) asks of a leaf.
_SERVER_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
"""


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the authority's certificate (what a client trusts)
    cert: Path  # the server's certificate (OLLAMATRIO_TLS_CERT)
    key: Path  # its private key (OLLAMATRIO_TLS_KEY)


def openssl_available() -> bool:
    return shutil.which("openssl") is not None


def make_certificates(folder: Path) -> Certificates:
    """A fresh authority and server certificate (valid for a day) in ``folder``.

    Raises:
        subprocess.CalledProcessError: ``openssl`` failed (its output in the error).
    """
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    cert, key, request = folder / "server.pem", folder / "server.key", folder / "server.csr"
    extensions = folder / "server.ext"
    extensions.write_text(_SERVER_EXTENSIONS)

    def openssl(*args: str | Path) -> None:
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)

    openssl(
        "req", "-x509", *_EC, "-keyout", ca_key, "-out", ca, "-days", "1",
        "-subj", "/CN=ollamatrio test authority",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    openssl("req", *_EC, "-keyout", key, "-out", request, "-subj", "/CN=localhost")
    openssl(
        "x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
        "-out", cert, "-days", "1", "-extfile", extensions,
    )  # fmt: skip
    return Certificates(ca=ca, cert=cert, key=key)
