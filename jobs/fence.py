"""This driver's lease (see :mod:`sluice.records.locks`), for its writers to check.

The job's entry point sets :data:`keeper` once it holds its lease; a batch checks it before
it writes anything (:func:`check`), and each table write asks the store right before its
commit (:func:`confirm`): a driver that lost its lease (paused past it, cut off from the
store, or taken over) stops without writing again. Unset, as in tests that call a writer
directly, every check passes.
"""

from __future__ import annotations

import contextlib

from sluice.records.locks import Keeper, Lease

keeper: Keeper | None = None


def check() -> None:
    if keeper is not None:
        keeper.check()


def confirm() -> None:
    if keeper is not None:
        keeper.confirm()


def lease() -> Lease | None:
    return keeper.lease if keeper is not None else None


def lost() -> str | None:
    """Why this driver may no longer write, once it knows it may not."""
    return keeper.lost if keeper is not None else None


def verify() -> str | None:
    """:func:`lost`, after asking the store (when a run failed: was the lease the cause?)."""
    if keeper is not None and keeper.lost is None:
        # LeaseLost sets keeper.lost; a store that does not answer says nothing either way.
        with contextlib.suppress(Exception):
            keeper.confirm()
    return lost()
