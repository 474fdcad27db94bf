"""Name -> protocol: the built-ins, those other packages register through the
`vitbench.protocols` entry-point group, and those registered at run time (`register`, for a
notebook or a test). Nothing outside a protocol's module needs to know its name."""

from __future__ import annotations

import logging
from functools import cache

from vitbench.entry_points import PROTOCOLS, load_group
from vitbench.errors import UserError
from vitbench.protocols.base import Protocol
from vitbench.protocols.eval import EVAL
from vitbench.protocols.fewshot import FEWSHOT
from vitbench.protocols.finetune import FINETUNE
from vitbench.protocols.knn import KNN
from vitbench.protocols.linear import LINEAR
from vitbench.protocols.options import Declared, declared
from vitbench.protocols.pretrain import PRETRAIN

log = logging.getLogger("vitbench")

BUILTIN: tuple[Protocol, ...] = (FEWSHOT, EVAL, FINETUNE, KNN, LINEAR, PRETRAIN)
BUILTIN_NAMES = frozenset(p.name for p in BUILTIN)
_registered: dict[str, Protocol] = {}


def register(protocol: Protocol | type[Protocol]) -> Protocol:
    """Make a protocol available by its name in this process, e.g. `register(MyProtocol())`."""
    instance = protocol() if isinstance(protocol, type) else protocol
    _registered[instance.name] = instance
    return instance


@cache
def _plugins() -> tuple[Protocol, ...]:
    return tuple(item for _, item in load_group(PROTOCOLS, "PROTOCOL", Protocol))


def protocols() -> dict[str, Protocol]:
    """Every known protocol by name, built-ins first; a plugin cannot replace a built-in."""
    found = {p.name: p for p in BUILTIN}
    for p in (*_plugins(), *_registered.values()):
        if p.name in BUILTIN_NAMES:
            log.warning("protocol %s: a plugin may not replace the built-in; keeping vitbench's", p.name)
            continue
        found[p.name] = p
    return found


def get_protocol(name: str) -> Protocol:
    known = protocols()
    if name not in known:
        raise UserError(f"--protocol {name}: expected {', '.join(known)}")
    return known[name]


def shots_protocol() -> str:
    """The protocol whose runs are labelled by shot count (the few-shot views and figure)."""
    return next(p.name for p in protocols().values() if p.has_shots)


def own_head_protocol() -> str:
    """The protocol that scores the checkpoint's own classifier (the robustness and calibration views)."""
    return next(p.name for p in protocols().values() if p.scores_own_head)


def weights_protocol() -> str:
    """The protocol that makes weights from random init (the pre-training views, Fig 4 and 5)."""
    return next(p.name for p in protocols().values() if p.from_random_init)


def transfer_training_protocol() -> str:
    """The protocol that trains on the transfer task itself (the default of the training-curves figure)."""
    return next(p.name for p in protocols().values() if p.trains and p.scores_transfer)


def option_table() -> dict[str, tuple[Declared, tuple[str, ...]]]:
    """Every protocol option by name, with the protocols that read it (built-ins' first). One name
    is one option: a plugin's declaration of a name already declared with another type is left
    out (said once), so `--steps` always means the same thing."""
    found: dict[str, tuple[Declared, tuple[str, ...]]] = {}
    for protocol in protocols().values():
        for d in declared(protocol.Options):
            if d.name not in found:
                found[d.name] = (d, (protocol.name,))
                continue
            first, owners = found[d.name]
            if (first.kind, first.many) != (d.kind, d.many):
                _warn_once(f"protocol {protocol.name}: option {d.flag} is declared by {owners[0]} with another "
                           "type; it keeps that one")  # fmt: skip
                continue
            found[d.name] = (first, (*owners, protocol.name))
    return found


@cache
def _warn_once(message: str) -> None:
    log.warning("%s", message)
