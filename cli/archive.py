"""``saga archive``: move closed sagas out of Redis into verifiable segments."""

from __future__ import annotations

import time
from pathlib import Path

import click

from saga_store.log.archive import BATCH, PER_SEGMENT, Archiver, ArchiveReport, parse_duration

from .common import Context, emit_json, errors_to_exit, pass_ctx


@click.command("archive")
@click.option("--closed-before", "closed_before", envvar="SAGA_RETENTION", required=True,
              metavar="DURATION", help="Archive sagas whose ledger close is older than this "
              "(7d, 12h, 30m, 45s).")
@click.option("--to", "folder", envvar="SAGA_ARCHIVE_DIR", required=True,
              type=click.Path(file_okay=False), help="The archive folder (created if absent).")
@click.option("--batch", type=int, default=BATCH, show_default=True,
              envvar="SAGA_ARCHIVE_BATCH", help="Sagas read, or removed, per round trip.")
@click.option("--per-segment", type=int, default=PER_SEGMENT, show_default=True,
              envvar="SAGA_ARCHIVE_PER_SEGMENT", help="Sagas per segment file.")
@click.option("--every", "every", envvar="SAGA_ARCHIVE_EVERY", metavar="DURATION",
              default=None, help="Run again every DURATION until SIGTERM or Ctrl-C "
              "(an operator's service; workers do not archive).")
@click.option("--metrics-port", type=int, default=None, envvar="SAGA_ARCHIVE_METRICS_PORT",
              help="With --every: serve saga_archived_sagas_total and "
              "saga_archived_bytes_total on this port (127.0.0.1).")
@click.option("--dry-run", is_flag=True, help="Count what would be archived; change nothing.")
@click.option("--json", "as_json", is_flag=True, envvar="SAGA_JSON",
              help="Machine-readable output.")
@pass_ctx
def archive(ctx: Context, closed_before: str, folder: str, batch: int, per_segment: int,
            every: str | None, metrics_port: int | None, dry_run: bool, as_json: bool) -> None:
    """Move closed sagas (committed, compensated, needs_attention) out of Redis into
    gzip'd JSONL segments and a signed manifest in FOLDER, leaving a tombstone in
    each saga's ledger chain. Needs an admin Redis user (it deletes keys).

    A run killed part-way is finished by the next one. 'saga verify --archive
    FOLDER' checks the archive offline. Exit codes: 0 done, 1 an archive file does
    not verify, 2 usage error, 3 Redis unreachable.
    """
    with errors_to_exit():
        retention = parse_duration(closed_before)
        if every is not None:
            _every(ctx, retention, parse_duration(every, "--every"), Path(folder), batch,
                   per_segment, metrics_port)
            return
        cutoff = time.time_ns() // 1_000_000 - retention
        done = Archiver(ctx.store().log, Path(folder), batch=batch,
                        per_segment=per_segment).run(cutoff, dry_run=dry_run)
        if as_json:
            emit_json(done.to_dict())
            return
        if dry_run:
            click.echo(f"would archive {done.due} sagas to {folder}, and finish removing "
                       f"{done.unfinished} an earlier run archived; nothing changed")
            return
        if done.cleared:
            click.echo(f"cleared {len(done.cleared)} files a killed run left (in no manifest)",
                       err=True)
        if done.resumed:
            click.echo(f"finished an earlier run: removed {done.resumed} sagas it had archived")
        click.echo(f"archived {done.written} sagas ({done.events} events, {done.bytes} bytes "
                   f"in {len(done.segments)} segments) to {folder}"
                   + (f", manifest {done.manifest}" if done.manifest else "")
                   + f"; removed {done.removed - done.resumed} from Redis")
        if done.ledger_cuts:
            click.echo(f"moved {done.ledger_entries} ledger entries of archived sagas out of "
                       f"Redis ({done.ledger_cuts} chains cut)")
        if done.context_events:
            click.echo(f"trimmed {done.context_events} context events older than the "
                       "cut-off from the agents' context streams")
        for sid, why in sorted(done.skipped.items())[:20]:
            click.echo(f"left {sid}: {why}", err=True)


def _every(ctx: Context, retention_ms: int, every_ms: int, folder: Path, batch: int,
           per_segment: int, metrics_port: int | None) -> None:
    import signal
    import threading

    from prometheus_client import CollectorRegistry, start_http_server

    from saga_store.ops.retention import ArchiveMetrics
    from saga_store.ops.retention import every as run_every
    registry = CollectorRegistry()
    metrics = ArchiveMetrics(registry)
    if metrics_port is not None:
        start_http_server(metrics_port, addr="127.0.0.1", registry=registry)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log = ctx.store().log

    def once(cutoff: int) -> ArchiveReport:
        done = Archiver(log, folder, batch=batch, per_segment=per_segment).run(cutoff)
        if done.removed or done.skipped:
            click.echo(f"archived {done.written} sagas, removed {done.removed}, left "
                       f"{len(done.skipped)}", err=True)
        return done
    runs = run_every(once, retention_ms, every_ms / 1000, metrics, stop)
    click.echo(f"stopped after {runs} runs", err=True)


COMMANDS = [archive]
