"""TLS on the TCP port (standard-library `ssl`): the server's context from `--tls-cert`,
`--tls-key` and, for mutual TLS, `--tls-client-ca`. Built at start (a setting that cannot
work raises ValueError naming it: exit 78) and again on SIGHUP (a renewed certificate),
on the main thread; does no I/O but reading those files.
"""

from __future__ import annotations

import ssl

HANDSHAKE_FIRST_BYTE = 0x16  # a TLS record of type handshake: how every ClientHello begins


def server_context(cert: str | None, key: str | None, client_ca: str | None) -> ssl.SSLContext | None:
    """The context of the TCP port, or None without TLS. Raises ValueError naming the
    setting: a certificate without its key (or the reverse), a file that cannot be read,
    a key that does not match the certificate, a client CA without a certificate."""
    if cert is None and key is None:
        if client_ca is not None:
            raise ValueError("--tls-client-ca (tls_client_ca) needs --tls-cert and --tls-key: mutual TLS is TLS")
        return None
    if cert is None or key is None:
        raise ValueError("--tls-cert and --tls-key (tls_cert, tls_key) go together: give both")
    for flag, path in (("--tls-cert", cert), ("--tls-key", key), ("--tls-client-ca", client_ca)):
        if path is None:
            continue
        try:
            open(path, "rb").close()
        except OSError as e:
            raise ValueError(f"cannot read {flag} ({flag[2:].replace('-', '_')}) {path}: {e.strerror or e}") from None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as e:
        raise ValueError(f"--tls-key {key} does not match --tls-cert {cert}, or one of them is not a PEM "
                         f"certificate / private key (tls_cert, tls_key): {e.reason or e}") from None
    if client_ca is not None:
        try:
            ctx.load_verify_locations(client_ca)
        except ssl.SSLError as e:
            raise ValueError(f"--tls-client-ca (tls_client_ca) {client_ca} holds no PEM CA certificate: "
                             f"{e.reason or e}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx
