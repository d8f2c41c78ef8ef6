"""Where the SQL endpoint listens and where its catalog lives, from the environment.

=================================  =========================================================
``SLUICE_SQL_HOST``                address the endpoint binds to [127.0.0.1]
``SLUICE_SQL_PORT``                its port [10000, Hive's]
``SLUICE_SQL_AUTH``                ``none`` or ``password`` (a file of hashed passwords) [none]
``SLUICE_SQL_PASSWORD_FILE``       that file [$SLUICE_HOME/sql/passwords]
``SLUICE_METASTORE_URL``           a JDBC URL of a PostgreSQL metastore, e.g.
                                   ``jdbc:postgresql://db:5432/metastore``; unset: embedded
                                   Derby under $SLUICE_HOME/metastore
``SLUICE_METASTORE_USER``          its user
``SLUICE_METASTORE_PASSWORD_FILE`` a file holding its password, readable by the endpoint's
                                   user only: the password is read by the Spark driver, never
                                   put on a command line or in a run record
=================================  =========================================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sluice import config
from sluice.errors import InvalidInput

Auth = Literal["none", "password"]
DEFAULT_PORT = 10000
#: The database every pipeline's tables are registered in.
DATABASE = "sluice"


def password_file() -> Path:
    return Path(os.environ.get("SLUICE_SQL_PASSWORD_FILE") or config.sluice_home() / "sql" / "passwords")


@dataclass(frozen=True)
class Endpoint:
    """How the endpoint is (to be) served."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    auth: Auth = "none"
    allow_writes: bool = False

    @classmethod
    def from_env(cls) -> Endpoint:
        auth = os.environ.get("SLUICE_SQL_AUTH") or "none"
        if auth not in ("none", "password"):
            raise InvalidInput(f"SLUICE_SQL_AUTH must be none or password, not {auth!r}")
        port = os.environ.get("SLUICE_SQL_PORT") or str(DEFAULT_PORT)
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidInput(f"SLUICE_SQL_PORT must be a port number, not {port!r}")
        return cls(os.environ.get("SLUICE_SQL_HOST") or "127.0.0.1", int(port), auth)  # type: ignore[arg-type]

    def jdbc_url(self, host: str | None = None) -> str:
        """The URL beeline, DBeaver and other JDBC clients connect to."""
        return f"jdbc:hive2://{host or self.client_host}:{self.port}/{DATABASE}"

    def sqlalchemy_url(self, user: str = "USER") -> str:
        """The URL SQLAlchemy and Superset connect to (PyHive's dialect)."""
        password = ":PASSWORD" if self.auth == "password" else ""
        query = "?auth=CUSTOM" if self.auth == "password" else ""
        return f"hive://{user}{password}@{self.client_host}:{self.port}/{DATABASE}{query}"

    @property
    def client_host(self) -> str:
        """Where a client on this machine reaches it (a wildcard bind is reachable on loopback)."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host  # noqa: S104 - compared, not bound


def metastore_conf(home: Path | None = None) -> dict[str, str]:
    """Spark settings that put the catalog in the Hive metastore: PostgreSQL when
    ``SLUICE_METASTORE_URL`` names one, embedded Derby under ``$SLUICE_HOME`` otherwise.

    Embedded Derby serves one JVM at a time, which is why only the endpoint (or, when it is
    not running, one local ``sluice sql``) opens it; PostgreSQL serves any number.
    """
    home = home or config.sluice_home()
    url = os.environ.get("SLUICE_METASTORE_URL")
    conf = {
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": str(home / "metastore" / "warehouse"),
        # The metastore's own tables are created on first use (Spark's Hive client is 2.3).
        "spark.hadoop.datanucleus.schema.autoCreateTables": "true",
        "spark.hadoop.datanucleus.schema.autoCreateColumns": "true",
        "spark.hadoop.hive.metastore.schema.verification": "false",
    }
    if not url:
        derby = home / "metastore" / "derby"
        return conf | {
            "spark.hadoop.datanucleus.schema.autoCreateAll": "true",
            "spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={derby};create=true",
        }
    if not url.startswith("jdbc:postgresql://"):
        raise InvalidInput(f"SLUICE_METASTORE_URL must be a jdbc:postgresql:// URL, not {url!r}")
    _no_password_in_environment()  # before anything starts; the file is the driver's to read
    return conf | {
        # DataNucleus creates the metastore's tables as it first needs each one, on a second
        # connection; adding a foreign key to a table the first connection is writing then
        # waits for it forever (seen: TBL_PRIVS -> TBLS while a table is registered). The
        # metastore keeps its rows consistent itself, so its tables go without those keys.
        "spark.hadoop.datanucleus.schema.autoCreateAll": "false",
        "spark.hadoop.datanucleus.schema.autoCreateConstraints": "false",
        "spark.hadoop.javax.jdo.option.ConnectionURL": url,
        "spark.hadoop.javax.jdo.option.ConnectionDriverName": "org.postgresql.Driver",
        "spark.hadoop.javax.jdo.option.ConnectionUserName": os.environ.get("SLUICE_METASTORE_USER", ""),
    }


def metastore_password() -> str | None:
    """The PostgreSQL metastore's password, from ``SLUICE_METASTORE_PASSWORD_FILE`` (None: no
    password). Read by the Spark driver itself (see ``jobs/sql/thrift.py``), so that it appears on
    no command line, in no run record and in no setting a client's session could show."""
    _no_password_in_environment()
    path = os.environ.get("SLUICE_METASTORE_PASSWORD_FILE")
    if not path:
        return None
    try:
        return Path(path).read_text(encoding="utf-8").rstrip("\r\n")
    except OSError as exc:
        raise InvalidInput(f"SLUICE_METASTORE_PASSWORD_FILE: cannot read {path}: {exc.strerror}") from None


def _no_password_in_environment() -> None:
    if os.environ.get("SLUICE_METASTORE_PASSWORD"):
        raise InvalidInput(
            "SLUICE_METASTORE_PASSWORD would put the metastore's password on the Spark command line: "
            "write it to a file only you can read and set SLUICE_METASTORE_PASSWORD_FILE to it"
        )


def metastore_name() -> str:
    """The metastore in one phrase, for status lines (no password)."""
    url = os.environ.get("SLUICE_METASTORE_URL")
    return (
        f"PostgreSQL {url.removeprefix('jdbc:')}" if url else f"embedded Derby in {config.sluice_home() / 'metastore'}"
    )
