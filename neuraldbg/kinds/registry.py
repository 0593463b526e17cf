"""The registry of failure kinds: every kind this process knows, by name, and the one way to ask about an event.

:mod:`neuraldbg.kinds` registers the built-in rooms when it is imported; plugins register theirs through the plugin
manager (:mod:`neuraldbg.plugins.manager`). A kind read from a trace whose plugin is not installed gets an
:class:`~neuraldbg.kinds.base.Unregistered` room: it is reported by its name, with generic words.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

from ..errors import ConfigError, NeuralDbgWarning
from ..events import FailureKind, SemanticEvent
from ..health import HealthState, state_of
from ..reasoning.rules import CausalRule
from .base import Kind, RootLane, RootPool, Series, Unregistered, steps_of

if TYPE_CHECKING:
    from ..reasoning.topology import Topology

_T = TypeVar("_T")

_rooms: dict[FailureKind, Kind] = {}
_unregistered: dict[FailureKind, Kind] = {}
#: (state enum, value) -> the kind that state is, or the room that owns it as evidence (states of different signals
#: share names: GradientHealth.EXPLODING and UpdateHealth.EXPLODING are different states).
_state_kind: dict[tuple[type, str], FailureKind] = {}
_evidence_owner: dict[tuple[type, str], Kind] = {}
#: A stand-in with the generic words for each kind whose own method failed (see :func:`_ask`), and the
#: (kind, method) pairs already warned about.
_generic: dict[FailureKind, Kind] = {}
_warned: set[tuple[str, str]] = set()
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


def states() -> list[HealthState]:
    """Every health state a registered kind is or owns as evidence (plugins' included), in registration order."""
    return list(dict.fromkeys(s for found in _rooms.values() for s in (*found.states, *found.evidence)))


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


def _ask(found: Kind, method: str, ok: Callable[[object], TypeGuard[_T]], expected: str, *args: Any) -> _T:
    """``found.<method>(*args)``; where it raises or returns something else than ``expected`` (a plugin's kind
    gone wrong), the default :class:`Kind` method's answer, as for a kind whose plugin is not installed, and one
    :class:`NeuralDbgWarning` per kind and method: the diagnosis of the run and of its other kinds goes on."""
    try:
        result = getattr(found, method)(*args)
    except Exception as exc:
        problem = f"raised {exc!r}"
    else:
        if ok(result):
            return result
        problem = f"returned {result!r}, expected {expected}"
    if (found.name, method) not in _warned:
        _warned.add((found.name, method))
        cls = type(found)
        warnings.warn(
            f"NeuralDBG: {method}() of the failure kind {found.name!r} ({cls.__module__}.{cls.__qualname__}) "
            f"{problem}; its events get the generic Kind.{method}() instead. Fix the plugin that adds "
            f"{found.name!r}.",
            NeuralDbgWarning,
            stacklevel=3,
        )
    generic = _generic.get(found.kind)
    if generic is None:
        generic = _generic[found.kind] = Unregistered(found.name)
    answer: _T = getattr(generic, method)(*args)
    return answer


def _is_text(value: object) -> TypeGuard[str]:
    return isinstance(value, str)


def _is_lane(value: object) -> TypeGuard[RootLane | None]:
    return value is None or isinstance(value, RootLane)


def _is_pair(value: object) -> TypeGuard[tuple[str, str]]:
    return isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, str) for v in value)


def _is_event(value: object) -> TypeGuard[SemanticEvent]:
    return isinstance(value, SemanticEvent)


def _is_bool(value: object) -> TypeGuard[bool]:
    return isinstance(value, bool)


def lane(event: SemanticEvent) -> RootLane | None:
    found = room_of(event)
    return _ask(found, "lane", _is_lane, "a RootLane or None", event) if found is not None else None


def choose_root(found: Kind, head: SemanticEvent, pool: RootPool) -> SemanticEvent:
    """The root of the hypothesis whose lane ``head`` leads (see :meth:`Kind.choose_root`)."""
    return _ask(found, "choose_root", _is_event, "a SemanticEvent", head, pool)


def set_off_by_surge(found: Kind, root: SemanticEvent) -> bool:
    """Whether updates as large as the weights may have set ``root`` off (see :meth:`Kind.set_off_by_surge`)."""
    return _ask(found, "set_off_by_surge", _is_bool, "a bool", root)


def explain(
    found: Kind, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
) -> tuple[str, str]:
    """``(what happened, the fix)`` in ``found``'s words (see :meth:`Kind.explain`)."""
    return _ask(found, "explain", _is_pair, "a (what, fix) tuple of two strings", root, rest, topo, series)


def describe(event: SemanticEvent) -> str:
    """What held, with the number that shows it (see :meth:`Kind.describe`)."""
    found = room_of(event)
    if found is None:
        return Kind.describe(_PLAIN, event)
    return _ask(found, "describe", _is_text, "a string", event)


def label(event: SemanticEvent) -> str:
    found = room_of(event)
    return _ask(found, "label", _is_text, "a string", event) if found is not None else describe(event)


def effect(event: SemanticEvent) -> str:
    found = room_of(event)
    if found is None:
        return Kind.effect(_PLAIN, event)
    return _ask(found, "effect", _is_text, "a string", event)


def place(event: SemanticEvent) -> str:
    found = room_of(event)
    return _ask(found, "place", _is_text, "a string", event) if found is not None else event.where


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
