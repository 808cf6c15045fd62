"""Locks a forked child can take.

``os.fork()`` copies every lock in the state it had in the parent: a lock another thread of the
parent held at the fork stays held in the child, where that thread does not exist and nothing
will release it, so the child's first miss, tuning or patch would wait for ever. CPython
re-initializes its own module locks in the child for this reason (``Lib/threading.py``'s
``_after_fork``, ``Lib/logging/__init__.py``'s ``_at_fork_reinit`` of each handler's lock);
fastkernel's locks are made here and re-initialized the same way, by the lock's own
``_at_fork_reinit`` (CPython's ``_thread`` locks, 3.9 and later). A re-entrant lock the forking
thread itself holds is left as it is: that thread is the child's, and it releases the lock as it
leaves the block that took it. A plain lock has no owner to ask; fastkernel never forks while
holding one.
"""

from __future__ import annotations

import os
import threading
import weakref

# Every lock made here that is still alive (locks are weakly referenceable).
_made: weakref.WeakSet = weakref.WeakSet()
_RLOCK_TYPE = type(threading.RLock())


def lock() -> threading.Lock:
    """A new ``threading.Lock``, released again in a forked child."""
    made = threading.Lock()
    _made.add(made)
    return made


def rlock() -> threading.RLock:
    """A new ``threading.RLock``, released again in a forked child unless the forking thread
    holds it."""
    made = threading.RLock()
    _made.add(made)
    return made


def _after_fork_in_child() -> None:
    for made in list(_made):
        if isinstance(made, _RLOCK_TYPE) and made._is_owned():  # type: ignore[attr-defined]
            continue
        made._at_fork_reinit()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
