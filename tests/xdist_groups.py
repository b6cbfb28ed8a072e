"""``--dist loadgroup`` that groups again: the ``@group`` suffix pytest-xdist 3.8 can no longer set.

``make test`` runs ``pytest -n 2 --dist loadgroup``, and the tests that share an expensive resource
(the real vLLM engine of ``tests/engine/``, the heavy whole-system runs) carry
``pytest.mark.xdist_group(name)`` so that one worker runs all of them, one after another. xdist
implements that on each worker by appending ``@name`` to every grouped item's node id, and its
scheduler keeps the items whose ids end in the same ``@name`` together. pytest 9.2 keeps an item's
node id in a structured ``_id``, so xdist 3.8's ``item._nodeid = ...`` no longer changes it: the
suffix is silently lost and the group's tests are spread over both workers like any others, which
started one real engine per worker (pytest-xdist issue #1386, open; 3.8.0 is its latest release).

This plugin, registered by ``tests/conftest.py``, sets the suffix xdist meant to set, on the
workers of a ``--dist loadgroup`` run only, and only where it is missing (an xdist that sets it
itself makes this a no-op). ``tests/test_xdist_groups.py`` runs a grouped suite on two workers and
fails if the group is split.
"""

from __future__ import annotations

import pytest


def group_suffix(item: pytest.Item) -> str | None:
    """``@name`` for an item marked ``xdist_group(name)`` (names joined by ``_`` as xdist does), else None."""
    names = sorted(
        {
            str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
            for mark in item.iter_markers("xdist_group")
        }
    )
    return "@" + "_".join(names) if names else None


def set_node_id(item: pytest.Item, nodeid: str) -> None:
    """Give ``item`` the node id ``nodeid`` (pytest >= 9.2: the structured ``_id``; older: ``_nodeid``)."""
    structured = getattr(item, "_id", None)
    if structured is not None:
        item._id = type(structured).parse(nodeid)  # type: ignore[attr-defined]
    else:
        item._nodeid = nodeid  # type: ignore[attr-defined]
    if item.nodeid != nodeid:
        raise pytest.UsageError(
            f"tests/xdist_groups.py cannot set the node id of {item.nodeid!r} to {nodeid!r} under this "
            "pytest: --dist loadgroup would not keep the xdist_group tests on one worker"
        )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):  # set by xdist on its workers under --dist loadgroup
        return
    for item in items:
        suffix = group_suffix(item)
        if suffix is not None and not item.nodeid.endswith(suffix):
            set_node_id(item, item.nodeid + suffix)
