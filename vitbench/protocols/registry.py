"""Name -> protocol: the built-ins, those other packages register through the
`vitbench.protocols` entry-point group, and those registered at run time (`register`, for a
notebook or a test). Nothing outside a protocol's module needs to know its name."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache

from vitbench.catalog.entry_points import PROTOCOLS, Registry, load_group
from vitbench.errors import UserError
from vitbench.protocols.base import Protocol
from vitbench.protocols.eval import EVAL
from vitbench.protocols.fewshot import FEWSHOT
from vitbench.protocols.finetune import FINETUNE
from vitbench.protocols.knn import KNN
from vitbench.protocols.linear import LINEAR
from vitbench.protocols.measures import Metric
from vitbench.protocols.options import Declared, ProtocolOptions, declared
from vitbench.protocols.pretrain import PRETRAIN
from vitbench.store import row_checks

log = logging.getLogger("vitbench")

# in the order the tables' columns and the report's sections show them: frozen-feature few-shot,
# then fine-tuned, the checkpoint's own head, the other frozen-feature probes (a plugin's after)
BUILTIN: tuple[Protocol, ...] = (FEWSHOT, FINETUNE, EVAL, KNN, LINEAR, PRETRAIN)
# every known protocol by name, built-ins first, then the `vitbench.protocols` plugins' and those
# registered in this process; none may replace one already there
PROTOCOLS_BY_NAME: Registry[Protocol] = Registry(
    "protocol", lambda p: p.name, lambda: BUILTIN, lambda: load_group(PROTOCOLS, "PROTOCOL", Protocol),
    of_type=Protocol, unknown=lambda name, known: f"--protocol {name}: expected {', '.join(known)}",
)  # fmt: skip


def register(protocol: Protocol | type[Protocol]) -> Protocol:
    """Make a protocol available by its name in this process, e.g. `register(MyProtocol())`."""
    return PROTOCOLS_BY_NAME.register(protocol() if isinstance(protocol, type) else protocol)


def protocols() -> Registry[Protocol]:
    return PROTOCOLS_BY_NAME


def get_protocol(name: str) -> Protocol:
    return PROTOCOLS_BY_NAME.find(name)


def with_metric(test: Callable[[Metric], bool]) -> set[str]:
    """The protocols with a metric that passes `test`: `with_metric(lambda m: m.transfer)`."""
    return {p.name for p in protocols().values() if any(test(m) for m in p.metrics)}


def own_view(protocol: Protocol) -> str:
    """The table a protocol's runs are shown in (after `vitbench run`; `table --protocol NAME`): the
    view its metrics name."""
    return protocol.metrics[0].view


def declared_metric(name: str) -> Metric | None:
    """The first declaration of the metric stored under `name` (how to show it, which way is better)."""
    return next((m for p in protocols().values() for m in p.metrics if m.name == name), None)


def along(axis: str) -> set[str]:
    """The protocols whose runs vary along `axis` ("shots": the few-shot figure and columns)."""
    return {p.name for p in protocols().values() if p.axis is not None and p.axis.name == axis}


def option_classes() -> tuple[type[ProtocolOptions], ...]:
    """The options dataclass of every known protocol, once each (built-ins' first)."""
    return tuple(dict.fromkeys(p.Options for p in protocols().values()))


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


def fraction_metrics(name: str) -> frozenset[str]:
    """The metrics protocol `name` declares fractions (unit "%"); none for a protocol not known here."""
    try:
        return frozenset(m.name for m in get_protocol(name).metrics if m.unit == "%")
    except UserError:
        return frozenset()


# the store range-checks every stored fraction it reads, a shard's or the database's (store/row_checks.py)
row_checks.declare_fractions(fraction_metrics)
