"""KeySpace: every key of the job store is under its namespace, and no two keys collide."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_async.store import GLOBAL_SCOPE, KeySpace

# Plausible inputs: job ids (uuid hex), user uids, job and schedule names.
JOB_IDS = ["0123456789abcdef0123456789abcdef", "a", "job-1"]
USERS = ["ann", "u-42", "active", "user"]
NAMES = ["tests.echo", "billing.invoice", "nightly", "skips", "recovery"]

# Namespaces as AgentSettings accepts them (no ':'): the namespace is always the first key segment.
NAMESPACES = st.from_regex(r"\A[A-Za-z0-9_.\-]{1,64}\Z")
TEXT = st.text(min_size=0, max_size=30)


def every_key(space: KeySpace, text: str, scope: str | None) -> dict[str, str]:
    """One key of each kind, the parametrised ones built from `text` (and `scope` for the gate)."""
    return {
        "state": space.state(text),
        "user_index": space.user_index(text),
        "schedule_index": space.schedule_index(text),
        "schedule_skips": space.schedule_skips(text),
        "gate": space.gate(text, scope),
        "active_index": space.active_index,
        "leases": space.leases,
        "cancel_channel": space.cancel_channel,
        "recovery_lock": space.recovery_lock,
    }


KEY_BUILDERS: dict[str, Callable[[KeySpace, str], str]] = {
    "state": KeySpace.state,
    "user_index": KeySpace.user_index,
    "schedule_index": KeySpace.schedule_index,
    "schedule_skips": KeySpace.schedule_skips,
    "gate_global": lambda space, name: space.gate(name, None),
    "gate_user": lambda space, name: space.gate(name, "ann"),
    "active_index": lambda space, _: space.active_index,
    "leases": lambda space, _: space.leases,
    "cancel_channel": lambda space, _: space.cancel_channel,
    "recovery_lock": lambda space, _: space.recovery_lock,
}


def test_every_key_starts_with_the_namespace() -> None:
    space = KeySpace("ns-a")
    for text, scope in itertools.product(JOB_IDS + USERS + NAMES, [None, "ann"]):
        for kind, key in every_key(space, text, scope).items():
            assert key.startswith("ns-a:"), (kind, key)
            assert len(key) > len("ns-a:"), (kind, key)


def test_parametrised_keys_end_with_their_input() -> None:
    space = KeySpace("ns")
    assert space.state("j1").endswith(":j1")
    assert space.user_index("ann").endswith(":ann")
    assert space.schedule_index("nightly").endswith(":nightly")
    assert space.schedule_skips("nightly").endswith(":nightly")
    assert space.gate("tests.echo", "ann").endswith(":tests.echo:user:ann")


def test_two_namespaces_never_share_a_key() -> None:
    first, second = KeySpace("one"), KeySpace("two")
    for text, scope in itertools.product(JOB_IDS + USERS + NAMES, [None, "ann"]):
        a, b = every_key(first, text, scope), every_key(second, text, scope)
        assert set(a.values()).isdisjoint(b.values()), text


def test_a_namespace_that_prefixes_another_shares_no_key() -> None:
    """"agent" and "agent2" (or "agent.x"): the ':' after the namespace keeps them apart."""
    spaces = [KeySpace("agent"), KeySpace("agent2"), KeySpace("agent.x"), KeySpace("agen")]
    for text in JOB_IDS + NAMES:
        keys = [set(every_key(space, text, None).values()) for space in spaces]
        for a, b in itertools.combinations(keys, 2):
            assert a.isdisjoint(b)


@settings(max_examples=100, derandomize=True)
@given(first=NAMESPACES, second=NAMESPACES, text=TEXT, scope=st.none() | TEXT)
def test_namespaces_are_disjoint_for_any_input(first: str, second: str, text: str, scope: str | None) -> None:
    a, b = every_key(KeySpace(first), text, scope), every_key(KeySpace(second), text, scope)
    for key in a.values():
        assert key.split(":", 1)[0] == first
    if first != second:
        assert set(a.values()).isdisjoint(b.values())
    else:
        assert a == b, "a KeySpace is a pure function of its namespace"


def test_gate_scope_defaults_to_the_global_scope() -> None:
    space = KeySpace("ns")
    assert space.gate("tests.echo", None) == f"ns:gate:tests.echo:{GLOBAL_SCOPE}"
    assert space.gate("tests.echo", None) != space.gate("tests.echo", "ann")
    # Per job name and per user: each its own slot.
    assert space.gate("tests.echo", "ann") != space.gate("tests.echo", "ben")
    assert space.gate("tests.echo", "ann") != space.gate("tests.other", "ann")


@pytest.mark.parametrize("uid", ["", GLOBAL_SCOPE, f"x:{GLOBAL_SCOPE}"])
def test_no_user_id_shares_the_system_slots(uid: str) -> None:
    """A user named "_global" (or "") must not take the concurrency slots of system jobs."""
    space = KeySpace("ns")
    assert space.gate("tests.echo", uid) != space.gate("tests.echo", None)


def test_no_two_kinds_of_key_collide_for_plausible_inputs() -> None:
    space = KeySpace("ns")
    seen: dict[str, tuple[str, str]] = {}
    for kind, build in KEY_BUILDERS.items():
        for text in JOB_IDS + USERS + NAMES:
            key = build(space, text)
            previous = seen.setdefault(key, (kind, text))
            # The same key may only come back from the same kind (a fixed key, built again).
            assert previous[0] == kind, f"{key!r} is both {previous} and {(kind, text)}"


@settings(max_examples=100, derandomize=True)
@given(a=TEXT, b=TEXT)
def test_no_two_kinds_of_key_collide_for_any_inputs(a: str, b: str) -> None:
    """Each kind has its own fixed segment right after the namespace: inputs cannot forge another kind."""
    space = KeySpace("ns")
    for (kind_a, build_a), (kind_b, build_b) in itertools.combinations(KEY_BUILDERS.items(), 2):
        if {kind_a, kind_b} == {"gate_global", "gate_user"}:
            continue  # the same kind of key, with two scopes
        assert build_a(space, a) != build_b(space, b), (kind_a, a, kind_b, b)


@pytest.mark.parametrize("kind", ["state", "user_index", "schedule_index", "schedule_skips"])
def test_distinct_inputs_give_distinct_keys(kind: str) -> None:
    space = KeySpace("ns")
    build = KEY_BUILDERS[kind]
    inputs = JOB_IDS + USERS + NAMES
    assert len({build(space, text) for text in inputs}) == len(set(inputs))


def test_keyspace_is_a_frozen_value() -> None:
    space = KeySpace("ns")
    assert space == KeySpace("ns") and hash(space) == hash(KeySpace("ns"))
    with pytest.raises(AttributeError):
        space.namespace = "other"  # type: ignore[misc]
