"""Run the planned specs that are not stored yet: lease each, dispatch its group to its protocol,
record every result as it finishes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from vitbench.engine import stopping
from vitbench.engine.distributed import broadcast, setup
from vitbench.errors import UserError, one_line
from vitbench.execution.lease import Lease, Leases
from vitbench.execution.recorder import Recorder, RefusedResult
from vitbench.host.devices import Runtime, resolve_device
from vitbench.protocols.base import Group, Request, RunSpec
from vitbench.protocols.registry import get_protocol, protocols
from vitbench.store.shards import shard_path

log = logging.getLogger("vitbench")


@dataclass
class Executed:
    """What `execute` did: runs stored, one line per group whose protocol failed (its other runs
    went on), and why the database could not take results, where it could not (kept as shards)."""

    ran: int = 0
    failed: list[str] = field(default_factory=list)
    store_problem: str | None = None


def execute(
    groups: list[Group],
    req: Request,
    con,
    done: set[str],
    rerun: bool | frozenset[str] = False,
    on_result: Callable[[RunSpec, dict], None] | None = None,
) -> Executed:
    """Run every planned spec not yet done, and those `rerun` names (True: every one); each result is
    a shard and an ingest of its own, so an interruption loses at most the run in flight. A plugin's
    protocol that fails (raises, or yields a metric the store refuses) costs its own runs only: one
    line names it, the rest go on."""
    again = frozenset(s.run_key for g in groups for s in g.specs) if rerun is True else rerun or frozenset()
    world, device = setup(resolve_device(req.device))
    failed: list[str] = []
    with Leases(req.results) as leases:
        if world.is_main:
            leases.clear_stored(done)
        recorder = Recorder(req, con, device, on_result, world, leases)
        runtime = Runtime.of(req, device)  # resolved once: what protocols and the engine run with
        for group in groups:
            todo = _leased([s for s in group.specs if s.run_key in again or s.run_key not in done], req, leases, world,
                           again)  # fmt: skip
            if not todo:
                continue
            try:  # each result stored before the protocol goes on (a final run reads its sweep's)
                for result in get_protocol(group.protocol).run(group, todo, req, runtime, recorder):
                    if world.is_main:  # under torchrun every process may reach a result; one stores it
                        recorder.record(group, result)
                    if world.size == 1:  # a cluster job told to stop: after a stored run, nothing is lost
                        stopping.reached(f"after storing {result.spec.run_key[:12]}")
            except Exception as e:
                line = _failure(group, e, world)
                if line is None:
                    raise
                log.error("failed: %s", line)
                failed.append(line)
                for spec in todo:  # its runs without a result are free for the next command at once
                    leases.release(spec.run_key)
    return Executed(recorder.count, failed, recorder.store_problem)


def _failure(group: Group, error: Exception, world) -> str | None:
    """The one line for a failed group, where the failure is the protocol's own: a plugin's
    protocol that raised, or a result the store refused (RefusedResult). None: a failure of
    vitbench or of the user's input, which ends the command as before."""
    plugin = protocols().source(group.protocol)
    if world.size > 1 or not (plugin is not None or isinstance(error, RefusedResult)):
        return None
    by = "" if plugin is None else " (registered in this process)" if plugin == "register()" else f" (plugin {plugin})"
    said = str(error) if isinstance(error, UserError) else f"{type(error).__name__}: {one_line(error, 160)}"
    return f"{group.protocol}{by} on {group.model.name}, {group.dataset.name}: {' '.join(said.split())}"


def _leased(todo: list[RunSpec], req: Request, leases: Leases, world, again: frozenset[str]) -> list[RunSpec]:
    """The runs of `todo` this process may execute: those whose lease it took (rank 0 takes them,
    the other ranks follow) and that nobody finished meanwhile (their shard appeared), but for those
    to run `again`."""
    if not todo:
        return []
    keys: list[str] = []
    if world.is_main:
        pending = [s.run_key for s in todo if s.run_key in again or not shard_path(req.results, s.run_key).exists()]
        keys, busy = leases.take(pending)
        for key in busy:
            holder = Lease(req.results, key).holder()
            where = f"{holder.get('host', '?')} pid {holder.get('pid', '?')}"
            if holder.get("slurm_job"):
                where += f", SLURM job {holder['slurm_job']}"
            log.warning("%s: skipped, running elsewhere (%s)", key[:12], where)
    keys = broadcast(keys, world)
    return [s for s in todo if s.run_key in keys]
