"""Who may reach the control plane: the bearer token ``swap`` and ``rollback``
require (read from a file only its owner can read), and which hosts are this
machine alone. No JAX, no HTTP: the CLI's ``serve swap`` reads the same file."""

from __future__ import annotations

import ipaddress
import os

from ..errors import ConfigError


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``127.0.0.1``, ``::1``, ``localhost``).

    Example:
      >>> is_loopback("127.0.0.1"), is_loopback("localhost"), is_loopback("0.0.0.0")
      (True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(path: str | os.PathLike[str]) -> bytes:
    """Reads a control token from a file (one line; surrounding space dropped).

    Raises:
      ConfigError: for a file that cannot be read, that others may read or
        write, or whose token is not 16 to 4096 printable ASCII characters.

    Example:
      >>> import os, tempfile
      >>> path = os.path.join(tempfile.mkdtemp(), "token")
      >>> with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
      ...     _ = f.write("s3cret-token-of-24-chars" + "\\n")
      >>> read_token(path)
      b's3cret-token-of-24-chars'
    """
    try:
        st = os.stat(path)
        with open(path, "rb") as f:
            token = f.read(4097).strip()
    except OSError as e:
        raise ConfigError(
            f"control token file {os.fspath(path)}: {e.strerror}",
            hint="write a random token there: python -c 'import secrets; "
            "print(secrets.token_urlsafe())' > FILE; chmod 600 FILE",
        ) from e
    if st.st_mode & 0o077:
        raise ConfigError(
            f"control token file {os.fspath(path)}: others may read it "
            f"(mode {st.st_mode & 0o777:o})",
            hint=f"chmod 600 {os.fspath(path)}",
        )
    if any(b < 0x20 or b > 0x7E for b in token):
        raise ConfigError(
            f"control token file {os.fspath(path)}: the token holds a character other than "
            "printable ASCII, which an HTTP header cannot carry",
            hint="python -c 'import secrets; print(secrets.token_urlsafe())' > FILE",
        )
    if len(token) < 16 or len(token) > 4096:
        raise ConfigError(
            f"control token file {os.fspath(path)}: the token has {len(token)} characters, "
            "not 16 to 4096",
            hint="python -c 'import secrets; print(secrets.token_urlsafe())' > FILE",
        )
    return token
