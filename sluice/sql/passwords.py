"""The endpoint's password file: one user per line, ``user:pbkdf2_sha256:ITER:SALT:HASH``
(salt and hash in base64). The server checks logins against it in
``jobs/java/sluice/sql/PasswordFile.java``, re-reading it on every login."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from pathlib import Path

from sluice.errors import InvalidInput

SCHEME = "pbkdf2_sha256"
ITERATIONS = 210_000  # OWASP's figure for PBKDF2-HMAC-SHA256
USER = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


def hash_line(user: str, password: str, *, iterations: int = ITERATIONS, salt: bytes | None = None) -> str:
    if not USER.match(user):
        raise InvalidInput(f"user names are letters, digits and _.@- (at most 64), not {user!r}")
    if not password:
        raise InvalidInput("the password is empty")
    salt = salt or os.urandom(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    return ":".join((user, SCHEME, str(iterations), base64.b64encode(salt).decode(), base64.b64encode(digest).decode()))


def password_file_option() -> str:
    """The JVM option that names the file to the server (``PasswordFile.PROPERTY``)."""
    from sluice.sql.settings import password_file

    return f"-Dsluice.sql.passwordFile={password_file()}"


def users(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    return [line.split(":", 1)[0] for line in lines if line.strip()]


def set_password(path: Path, user: str, password: str) -> None:
    """Add the user, or replace their password; the file is readable by its owner only."""
    line = hash_line(user, password)
    kept = [ln for ln in _lines(path) if ln.split(":", 1)[0] != user]
    _write(path, [*kept, line])


def remove_user(path: Path, user: str) -> bool:
    lines = _lines(path)
    kept = [ln for ln in lines if ln.split(":", 1)[0] != user]
    _write(path, kept)
    return len(kept) != len(lines)


def verify(path: Path, user: str, password: str) -> bool:
    """The server's check, in Python (for tests and ``sluice sql passwd --check``)."""
    for line in _lines(path):
        fields = line.split(":")
        if len(fields) == 5 and fields[0] == user and fields[1] == SCHEME:
            salt, expected = base64.b64decode(fields[3]), base64.b64decode(fields[4])
            actual = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, int(fields[2]), len(expected))
            if hmac.compare_digest(actual, expected):
                return True
    return False


def _lines(path: Path) -> list[str]:
    try:
        return [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except FileNotFoundError:
        return []


def _write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write("".join(ln + "\n" for ln in lines))
    tmp.replace(path)
