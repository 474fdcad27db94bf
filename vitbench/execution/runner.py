"""Run the planned specs that are not stored yet: lease each, dispatch its group to its protocol,
record every result as it finishes."""

from __future__ import annotations

import logging
from collections.abc import Callable

from vitbench.devices import Runtime, resolve_device
from vitbench.engine.distributed import broadcast, setup
from vitbench.execution.lease import Lease, Leases
from vitbench.execution.recorder import Recorder
from vitbench.protocols.base import Group, Request, RunSpec
from vitbench.protocols.registry import get_protocol
from vitbench.store import shard_dir

log = logging.getLogger("vitbench")


def execute(
    groups: list[Group],
    req: Request,
    con,
    done: set[str],
    rerun: bool = False,
    on_result: Callable[[RunSpec, dict], None] | None = None,
) -> int:
    """Run every planned spec not yet done; each result is a shard and an ingest of its own, so an
    interruption loses at most the run in flight."""
    world, device = setup(resolve_device(req.device))
    with Leases(req.results) as leases:
        recorder = Recorder(req, con, device, on_result, world, leases)
        runtime = Runtime.of(req, device)  # resolved once: what protocols and the engine run with
        for group in groups:
            todo = _leased([s for s in group.specs if rerun or s.run_key not in done], req, leases, world, rerun)
            if todo:  # each result stored before the protocol goes on (a final run reads its sweep's)
                for result in get_protocol(group.protocol).run(group, todo, req, runtime, recorder):
                    if world.is_main:  # under torchrun every process may reach a result; one stores it
                        recorder.record(group, result)
    return recorder.count


def _leased(todo: list[RunSpec], req: Request, leases: Leases, world, rerun: bool) -> list[RunSpec]:
    """The runs of `todo` this process may execute: those whose lease it took (rank 0 takes them,
    the other ranks follow) and that nobody finished meanwhile (their shard appeared)."""
    if not todo:
        return []
    keys: list[str] = []
    if world.is_main:
        folder = shard_dir(req.results)
        pending = [s.run_key for s in todo if rerun or not (folder / f"{s.run_key}.json").exists()]
        keys, busy = leases.take(pending)
        for key in busy:
            holder = Lease(req.results, key).holder()
            where = f"{holder.get('host', '?')} pid {holder.get('pid', '?')}"
            if holder.get("slurm_job"):
                where += f", SLURM job {holder['slurm_job']}"
            log.warning("%s: skipped, running elsewhere (%s)", key[:12], where)
    keys = broadcast(keys, world)
    return [s for s in todo if s.run_key in keys]
