"""The registry of failure kinds: every kind this process knows, by name, and the one way to ask about an event.

:mod:`neuraldbg.kinds` registers the built-in rooms when it is imported; plugins register theirs through the plugin
manager (:mod:`neuraldbg.plugins.manager`). A kind read from a trace whose plugin is not installed gets an
:class:`~neuraldbg.kinds.base.Unregistered` room: it is reported by its name, with generic words.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..errors import ConfigError
from ..events import FailureKind, SemanticEvent
from ..health import HealthState, state_of
from ..reasoning.rules import CausalRule
from .base import Kind, RootLane, Unregistered, steps_of

_rooms: dict[FailureKind, Kind] = {}
_unregistered: dict[FailureKind, Kind] = {}
#: (state enum, value) -> the kind that state is, or the room that owns it as evidence (states of different signals
#: share names: GradientHealth.EXPLODING and UpdateHealth.EXPLODING are different states).
_state_kind: dict[tuple[type, str], FailureKind] = {}
_evidence_owner: dict[tuple[type, str], Kind] = {}
#: How many times a room was added or replaced: what was resolved against the registry before is stale once it moved.
generation = 0


def _key(state: HealthState | str) -> tuple[type, str]:
    return (type(state), str(state.value)) if isinstance(state, HealthState) else (str, str(state))


def register(room: Kind) -> Kind:
    """Add ``room`` to the registry and return the registered room. Registering the same kind again with a room
    of the same class keeps the first; a class of the same name defined again (a module reloaded, a notebook cell
    run twice) replaces it; another class under a name already taken is a :class:`ConfigError`."""
    global generation
    if not isinstance(room, Kind):
        raise ConfigError(f"a failure kind must be a neuraldbg.kinds.Kind instance, got {type(room).__name__}")
    known = _rooms.get(room.kind)
    if known is not None:
        if type(known) is type(room):
            return known
        redefined = (type(known).__module__, type(known).__qualname__) == (
            type(room).__module__,
            type(room).__qualname__,
        )
        if not redefined:
            raise ConfigError(
                f"failure kind {room.name!r} is already registered by {type(known).__qualname__}; "
                f"{type(room).__qualname__} must use another name"
            )
    for state in room.states:
        _state_kind[_key(state)] = room.kind
    for state in room.evidence:
        _evidence_owner[_key(state)] = room
    _rooms[room.kind] = room
    _unregistered.pop(room.kind, None)
    generation += 1
    return room


def rooms() -> list[Kind]:
    """Every registered kind, built-in ones first, in registration order."""
    return list(_rooms.values())


def room(kind: FailureKind | str) -> Kind:
    """The room of ``kind`` (an :class:`Unregistered` one for a kind no plugin of this process registered)."""
    found = _rooms.get(kind) if isinstance(kind, FailureKind) else None
    if found is not None:
        return found
    name = FailureKind.declare(str(kind))
    found = _rooms.get(name) or _unregistered.get(name)
    if found is None:
        found = _unregistered[name] = Unregistered(name.value)
    return found


def unobserved() -> Kind:
    """The kind that says a part of the run was not observed (see :attr:`Kind.unobserved`)."""
    return next(k for k in _rooms.values() if k.unobserved)


def is_known(kind: FailureKind | str) -> bool:
    """Whether a room was registered for ``kind`` in this process."""
    return isinstance(kind, str) and kind in FailureKind and FailureKind(kind) in _rooms


def room_of(event: SemanticEvent) -> Kind | None:
    """The room that speaks for ``event``: its kind's, or, for kind-less evidence, the kind that owns it."""
    if event.kind is not None:
        return room(event.kind)
    state = event.to_state
    if not isinstance(state, HealthState):  # an event built by hand, with the state's name
        state = state_of(event.event_type, state)
    return _evidence_owner.get(_key(state))


def kind_of(state: HealthState) -> FailureKind | None:
    """The kind a health state is (``GradientHealth.VANISHING`` -> its kind); None for evidence and normal states."""
    return _state_kind.get(_key(state))


def same_objects(a: Sequence[object], b: Sequence[object]) -> bool:
    """Whether ``a`` and ``b`` hold the very same objects in the same order (identity, not equality)."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def resolve(rule: CausalRule) -> CausalRule:
    """``rule`` with the effects it names by health state (``GradientHealth.VANISHING``) named by the kinds those
    states are, each once. A state that is no registered kind's is a :class:`ConfigError`: kind-less effects are
    named ``None`` with their ``effect_states``."""
    kinds: list[FailureKind | None] = []
    for effect in rule.effect_kinds:
        target: FailureKind | None
        if not isinstance(effect, HealthState):
            target = effect
        else:
            target = kind_of(effect)
            if target is None:
                raise ConfigError(
                    f"causal rule {rule.name!r}: effect state {type(effect).__name__}.{effect.name} is no registered "
                    "kind's state; name a kind-less effect None, with effect_states"
                )
        if target not in kinds:
            kinds.append(target)
    resolved = tuple(kinds)
    same = same_objects(resolved, rule.effect_kinds)
    return rule if same else dataclasses.replace(rule, effect_kinds=resolved)


def lane(event: SemanticEvent) -> RootLane | None:
    found = room_of(event)
    return found.lane(event) if found is not None else None


def describe(event: SemanticEvent) -> str:
    """What held, with the number that shows it (see :meth:`Kind.describe`)."""
    found = room_of(event)
    return found.describe(event) if found is not None else Kind.describe(_PLAIN, event)


def label(event: SemanticEvent) -> str:
    found = room_of(event)
    return found.label(event) if found is not None else describe(event)


def effect(event: SemanticEvent) -> str:
    found = room_of(event)
    return found.effect(event) if found is not None else Kind.effect(_PLAIN, event)


def place(event: SemanticEvent) -> str:
    found = room_of(event)
    return found.place(event) if found is not None else event.where


def event_text(event: SemanticEvent) -> str:
    """``'fc2.weight': never updated although it gets gradients (not in any optimizer), steps 0-32``: what
    ``str(event)`` prints."""
    text = f"{place(event)}: {describe(event)}, {steps_of(event)}"
    before = event.from_state
    if before is not None and before not in ("normal", "healthy") and str(before) != str(event.to_state):
        text += f" (previously {str(before).replace('_', '-')})"
    return text


class _Plain(Kind):
    """The generic words, for kind-less evidence no room owns (a plugin detector's)."""

    name = "_"

    def __init__(self) -> None:  # not a kind: declares no FailureKind
        self.title = ""


_PLAIN = _Plain()
