"""Integrity commands: ``saga verify``, ``saga anchor``, ``saga export``."""

from __future__ import annotations

import sys
from itertools import islice
from pathlib import Path
from typing import Any

import click

from saga_store import keys
from saga_store.errors import AnchorMismatch, InvalidInput
from saga_store.ids import check_saga_id
from saga_store.log.chain import Chain
from saga_store.log.store import EventStore
from saga_store.verify.anchor import fits, read_anchor
from saga_store.verify.checker import Verifier, VerifyResult
from saga_store.verify.export import export as export_log
from saga_store.verify.export import verify_file

from .common import (
    EXIT_INTEGRITY,
    EXIT_OK,
    EXIT_USAGE,
    Context,
    emit_json,
    errors_to_exit,
    pass_ctx,
    progress_reporter,
)


@click.command("verify")
@click.option("--saga", "saga_id", envvar="SAGA_VERIFY_SAGA", help="Verify only this saga "
              "(and the ledger).")
@click.option("--anchor", "anchor_file", type=click.Path(dir_okay=False), envvar="SAGA_ANCHOR",
              help="Also check the ledger is not behind or forked from this anchor file.")
@click.option("--file", "export_file", type=click.Path(dir_okay=False), envvar="SAGA_VERIFY_FILE",
              help="Verify an exported JSONL file offline instead of Redis.")
@click.option("--archive", "archive_dir", type=click.Path(file_okay=False),
              envvar="SAGA_VERIFY_ARCHIVE", help="Verify an archive folder ('saga archive') "
              "offline instead of Redis.")
@click.option("--with-store", is_flag=True, envvar="SAGA_VERIFY_WITH_STORE",
              help="With --archive: also hold each archived saga to the store's ledger.")
@click.option("--json", "as_json", is_flag=True, envvar="SAGA_JSON",
              help="Machine-readable output.")
@pass_ctx
def verify(ctx: Context, saga_id: str | None, anchor_file: str | None,
           export_file: str | None, archive_dir: str | None, with_store: bool,
           as_json: bool) -> None:
    """Verify hash chains, the ledger and saga invariants.

    Exit codes: 0 intact, 1 integrity failure, 2 usage error, 3 could not verify.
    While Redis does not persist every write, a warning says so (the exit code
    is unchanged): what a crash took shows only against an --anchor.
    """
    with errors_to_exit():
        if export_file and (saga_id or anchor_file):
            click.echo("error: --file verifies a whole export; drop --saga/--anchor", err=True)
            sys.exit(EXIT_USAGE)
        if saga_id is not None:  # an empty --saga is a mistake, never "verify nothing"
            check_saga_id(saga_id)
        if archive_dir:
            _verify_archive(ctx, archive_dir, with_store, as_json,
                            bool(export_file or saga_id or anchor_file))
        anchor = read_anchor(_read(anchor_file)) if anchor_file else None
        if export_file:
            total = _count_lines(export_file) if sys.stderr.isatty() and not as_json else None
            update, close = progress_reporter(not as_json, total, "verifying")
            try:
                result = verify_file(export_file, Chain(ctx.settings.hmac_key), update)
            finally:
                close()
            _finish(result, None, as_json)
        store = ctx.store()
        if anchor is not None:
            fits(anchor, store.log.layout)
        if saga_id:
            store.require(saga_id)
        # no write: what is pending is read as it is and checked against the chains
        # (sealing is the workers' job, and a verifier never blesses what it checks)
        total = _count_events(store, saga_id) if sys.stderr.isatty() and not as_json else None
        update, close = progress_reporter(not as_json, total, "verifying")
        try:
            result = Verifier(store.log).verify(saga_id, update)
        finally:
            close()
        anchor_msg = None
        if anchor is not None:
            try:
                warnings = store.ledger.check_anchor(anchor)
                anchor_msg = {"ok": True, "seq": anchor.get("seq"), "warnings": warnings}
            except AnchorMismatch as exc:
                anchor_msg = {"ok": False, "seq": anchor.get("seq"), "reason": str(exc)}
        _finish(result, anchor_msg, as_json, _durability(store, anchor is not None))


def _verify_archive(ctx: Context, folder: str, with_store: bool, as_json: bool,
                    other: bool) -> None:
    from saga_store.verify.archive import verify_archive
    if other:
        click.echo("error: --archive verifies an archive folder; drop --file/--saga/--anchor",
                   err=True)
        sys.exit(EXIT_USAGE)
    log = ctx.store().log if with_store else None
    _finish(verify_archive(Path(folder), Chain(ctx.settings.hmac_key), log), None, as_json)


def _durability(store: EventStore, anchored: bool) -> dict[str, object]:
    """Whether Redis persists every write, with a warning if not: the chains can
    verify intact after a crash took their last appends, and only an anchor kept
    outside Redis shows that the ledger went back."""
    from saga_store.ops.doctor import aof_findings, aof_settings, persistent
    from saga_store.ops.durability import describe
    findings = aof_findings(aof_settings(store.redis))
    durable = persistent(findings)
    out: dict[str, object] = {"durable": durable,
                              **{f.setting: f.value for f in findings}}
    if not durable:
        then = ("" if anchored else "; without an anchor, verify cannot tell what a crash "
                "took: keep one outside Redis ('saga anchor --out FILE') and verify with "
                "--anchor FILE")
        out["warning"] = describe(False, findings) + then
    return out


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        click.echo(f"error: cannot read {path}: {exc.strerror}", err=True)
        sys.exit(EXIT_USAGE)


def _count_lines(path: str) -> int:
    with open(path, "rb") as fh:
        return sum(1 for _ in fh) - 1


def _count_events(store: EventStore, saga_id: str | None) -> int:
    """The events there are to verify, a thousand chains a round trip (a store's
    million saga ids are never held at once)."""
    ids = iter([saga_id] if saga_id else store.log.chain_ids())
    total = 0
    for batch in (store.ledger.chains(), *iter(lambda: list(islice(ids, 1000)), [])):
        pipe = store.redis.pipeline(transaction=False)
        for sid in batch:
            pipe.xlen(store.keys.chain_log(sid))
        total += sum(pipe.execute())
    return total


def _finish(result: VerifyResult, anchor: dict[str, object] | None, as_json: bool,
            durability: dict[str, object] | None = None) -> None:
    ok = result.ok and (anchor is None or bool(anchor["ok"]))
    not_durable = durability.get("warning") if durability is not None else None
    if as_json:
        out = result.to_dict()
        out["ok"] = ok
        if anchor is not None:
            out["anchor"] = anchor
        if durability is not None:
            out["redis"] = durability
        if not_durable is not None:
            out["warnings"].append(f"redis: {not_durable}")
        emit_json(out)
    else:
        for c in result.failures:
            click.echo(f"FAIL {c.chain_id}: first bad seq {c.first_bad_seq}: {c.reason}: "
                       f"{c.detail}")
        for c in result.chains:
            for w in c.warnings:
                click.echo(f"warning {c.chain_id}: {w}", err=True)
        if not_durable is not None:
            click.echo(f"warning: {not_durable}", err=True)
        if anchor is not None:
            if anchor["ok"]:
                click.echo(f"anchor at ledger seq {anchor['seq']}: consistent")
            else:
                click.echo(f"FAIL anchor: {anchor['reason']}")
        if ok and result.events == 0:
            click.echo("no sagas here yet, and an empty ledger: nothing to verify "
                       "(is SAGA_REDIS_URL the deployment's Redis?)")
            sys.exit(EXIT_OK)
        word = "intact" if ok else "INTEGRITY FAILURE"
        click.echo(f"{word}: {result.chain_count} chains, {result.events} events verified, "
                   f"{len(result.failures)} failed")
    sys.exit(EXIT_OK if ok else EXIT_INTEGRITY)


@click.command("anchor")
@click.option("--out", "out", type=click.Path(dir_okay=False), envvar="SAGA_ANCHOR_OUT",
              help="Write the anchor to this file (default: print it).")
@pass_ctx
def anchor(ctx: Context, out: str | None) -> None:
    """Print the ledger head (seq, hash, time; HMAC-signed with a key) to keep outside Redis."""
    with errors_to_exit():
        from saga_store.log.canonical import canonical
        doc = canonical(ctx.store().ledger.anchor())
        if out:
            _write_anchor(Path(out), doc + b"\n")
            click.echo(f"anchor written to {out}", err=True)
        else:
            click.echo(doc)


def _write_anchor(path: Path, doc: bytes) -> None:
    """A folder that is not there or not writable is the caller's to fix (exit 2)."""
    if not path.parent.is_dir():
        raise InvalidInput(f"--out {path}: the folder {path.parent} does not exist; create "
                           f"it (mkdir -p {path.parent}), or under systemd give the unit "
                           "StateDirectory=saga and write to /var/lib/saga/")
    try:
        path.write_bytes(doc)
    except OSError as exc:
        raise InvalidInput(f"--out {path}: cannot write it ({exc.strerror}); give a file "
                           "this user may write") from None


@click.command("export")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--saga", "saga_ids", multiple=True, envvar="SAGA_EXPORT_SAGA",
              help="Export only this saga (repeatable); the ledger is always included.")
@pass_ctx
def export(ctx: Context, file: str, saga_ids: tuple[str, ...]) -> None:
    """Export sagas and the ledger to a JSONL file that verifies offline
    (FILE '-' writes to standard output)."""
    with errors_to_exit():
        store = ctx.store()
        for sid in saga_ids:
            store.require(sid)
        if file == "-":
            n = export_log(store.log, sys.stdout.buffer, list(saga_ids) or None)
            sys.stdout.buffer.flush()
            click.echo(f"exported {n} events", err=True)
            return
        tmp = Path(file + ".partial")
        with open(tmp, "wb") as fh:
            n = export_log(store.log, fh, list(saga_ids) or None)
        tmp.replace(file)  # a reader never sees a half-written export
        click.echo(f"exported {n} events to {file}", err=True)




@click.command("migrate")
@click.option("--buckets", type=int, default=None,
              help="Ledger buckets of the new layout (default: SAGA_BUCKETS, else 1024).")
@click.option("--to", "to", type=click.Choice(["2", "3"]), default="2", show_default=True,
              help="The layout to move to: 2 (ledger buckets), or 3 (also every saga's "
                   "keys and indexes under its bucket's hash tag; offline).")
@click.option("--dry-run", is_flag=True, help="Say what would change; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@pass_ctx
def migrate(ctx: Context, buckets: int | None, to: str, dry_run: bool, as_json: bool) -> None:
    """Move a store to a newer layout.

    To layout 2 (a store written before ledger buckets): nothing is rewritten;
    the old ledger chain is sealed and kept, and the root chain's first entry
    records its head. Safe while workers run (those started before keep writing
    to the old chain, which stays sealed); restart them afterwards so they use
    the buckets. Running it again changes nothing.

    To layout 3 (--to 3, from layout 2; a store of layout 1 goes to 2 first):
    every saga's keys are renamed under its bucket's hash tag and the shared
    indexes split by bucket; no event changes, so every chain and anchor still
    verifies. Stop every worker, gateway and client first (it refuses while a
    worker is alive); a run killed part-way is finished by the next one."""
    with errors_to_exit():
        from saga_store.log.layout import check_buckets
        from saga_store.log.ledger import migrate as run_migration
        n = check_buckets(buckets if buckets is not None else ctx.settings.buckets,
                          "--buckets")
        store = ctx.store()
        if to == "3":
            _migrate_to_3(ctx, store, n, dry_run, as_json)
            return
        done = run_migration(store.ledger, n, dry_run=dry_run)
        if as_json:
            emit_json(done)
        elif done["from"] is None:
            click.echo("no store here (no ledger, no layout): nothing to migrate; a new store "
                       "records its layout when it is first written (check SAGA_REDIS_URL)")
        elif done.get("unfinished"):
            click.echo(f"layout {done['to']}, but an earlier migration stopped before the "
                       "root chain recorded the old ledger chain; run 'saga migrate' to "
                       "finish it; nothing changed")
        elif done.get("finished"):
            click.echo(f"finished an earlier migration to layout {done['to']}: the root chain "
                       f"now records the old ledger chain (head seq {done['legacy_head']}, "
                       f"root seq {done['root_seq']}); take a new anchor ('saga anchor')")
        elif done["dry_run"] and done["to"] != done["from"]:
            click.echo(f"would move layout {done['from']} to {done['to']} (layout version, "
                       "buckets); nothing changed")
        elif not done["changed"]:
            click.echo(f"already layout {done['to']}: nothing to do")
        else:
            click.echo(f"migrated: layout {done['from']} -> {done['to']}; the old ledger "
                       f"chain is kept (head seq {done['legacy_head']}) and the root chain "
                       f"records it (root seq {done['root_seq']}); restart workers so they "
                       "write to the buckets, and take a new anchor ('saga anchor')")


def _migrate_to_3(ctx: Context, store: Any, buckets: int, dry_run: bool,
                  as_json: bool) -> None:
    from saga_store.errors import InvalidInput
    from saga_store.log.ledger import migrate as run_migration
    from saga_store.log.rekey import move_to_3
    from saga_store.ops import fleet
    first = None
    if store.redis.get(keys.LAYOUT) is None:  # read, not created (a dry run writes nothing)
        first = run_migration(store.ledger, buckets, dry_run=dry_run)  # to layout 2 first
        if first["from"] is None:
            raise InvalidInput("no store here (no ledger, no layout): nothing to migrate; "
                               "a new store is created with layout 3 (check SAGA_REDIS_URL)")
        if dry_run:
            if as_json:
                emit_json({**first, "then": "3"})
            else:
                click.echo(f"would move layout {first['from']} to {first['to']}, then to "
                           "layout 3 (every saga's keys under its bucket's tag); nothing "
                           "changed")
            return
    alive = [w.name for w in fleet.registered(ctx.queues(), work=False) if w.live]
    if alive and not dry_run:
        raise InvalidInput(f"{len(alive)} worker(s) alive ({', '.join(alive[:3])}): a "
                           "process of layout 2 would go on writing the old key names; stop "
                           "every worker, gateway and client, then run it again")
    done = move_to_3(store.log, dry_run=dry_run)
    if first is not None:
        done["before"] = first
    moved = (f"{done['keys']} keys of {done['sagas']} sagas under their buckets' tags, "
             f"{done['indexed']} index entries moved")
    if as_json:
        emit_json(done)
    elif dry_run and done["from"] == done["to"] and not (done["keys"] or done["indexed"]):
        click.echo(f"already layout {done['to']}: nothing to do")
    elif dry_run:
        click.echo(f"would move layout {done['from']} to {done['to']}: {moved}; nothing "
                   "changed")
    elif not done["changed"]:
        click.echo(f"already layout {done['to']}: nothing to do")
    elif done["from"] == done["to"]:
        click.echo(f"layout {done['to']}: moved what processes still running with layout 2 "
                   f"wrote: {moved}")
    else:
        click.echo(f"migrated: layout {done['from']} -> {done['to']}: {moved}; every chain "
                   "is as it was (start the workers again; 'saga verify' checks it)")
    if done.get("kept"):
        click.echo(f"kept under their old names, as their new names exist (a saga written "
                   f"under both layouts: look at it by hand): {', '.join(done['kept'][:10])}",
                   err=True)


COMMANDS = [verify, anchor, export, migrate]
