"""test/bench/bench_retention.py: the retention section of bench.py (run
through run-bench --sections=retention).

A soak of the log's cleanup: two databases in the throwaway server under
the same load at the same time,

  rotation  CREATE EXTENSION outbox (the current version): the log is a
            ring of generations, a delivered one past outbox.retention
            emptied with TRUNCATE;
  delete    CREATE EXTENSION outbox VERSION '1.7': a plain log, from which
            the same library deletes delivered rows past outbox.retention
            with DELETE, in batches, when idle.

Each database has its own pgbench (rate-limited with -R, 8 clients, one
outbox.emit() of the emit section's 200-byte payload over 1,000 aggregates
per transaction) and its relay publishes to a topic of its own on the mock
cluster (outbox.event.rotation, outbox.event.delete).  outbox.retention is
short during the soak; every 10 s each log is sampled: its size
(pg_total_relation_size over its tables: heap, TOAST and indexes), dead
tuples, rows deleted, events emitted (the id sequence) and published (the
relay's counter).  One retention window's data is the bytes an event adds
to the log (its growth per event over the first window, when nothing can
be removed yet) times the rate emitted times the retention.  Then the
same load runs a fifth of the soak's time with outbox.retention = 7 days:
the no-cleanup baseline of both designs' emit and drain rates.

Options, beside bench.py's: --minutes=N (the soak, default 20; --quick 2,
--smoke 1), --rate=N (transactions/s per database, default 2,000),
--retention=S (outbox.retention in the soak, default 60; --quick 20,
--smoke 10: the first two windows are warm-up, left out of the figures).

Writes test/bench/out/retention.csv (one line per database per sample),
one gnuplot data file per design beside it, and two charts,
test/bench/out/retention-size.png and retention-dead.png, copied to
docs/img/ with --write-docs (linked beneath the section's table).

bench.py passes itself in (b): its helpers and settings."""

import csv
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import psycopg2

SECTION = "retention"
DESIGNS = ("rotation", "delete")
VERSION = {"rotation": None, "delete": "1.7"}
LABEL = {"rotation": "rotation (TRUNCATE)", "delete": "DELETE (database at 1.7)"}
CLIENTS = 8
AGGREGATES = 1000
SAMPLE_SECS = 10
NO_CLEANUP_RETENTION = 7 * 24 * 3600
SETTLE_SECS = 600
MIB = 2 ** 20
OUT = "test/bench/out"
IMAGES = (("retention-size.png", "Size of the log over time, rotation and DELETE"),
          ("retention-dead.png", "Dead tuples in the log over time, rotation and DELETE"))
COLUMNS = ("phase", "t", "db", "log_bytes", "live_rows", "dead_tuples", "deleted_rows",
           "emitted", "published", "backlog", "emit_rate", "drain_rate",
           "kept_generations", "log_waits_for")

# the log's tables: the partitions of a ring, or the table itself at 1.7
# (pg_partition_tree() lists nothing for a table that is not partitioned)
LOG_SQL = """
    WITH log AS (SELECT relid FROM pg_partition_tree('outbox.events') WHERE isleaf
                 UNION
                 SELECT oid FROM pg_class WHERE oid = 'outbox.events'::regclass AND relkind = 'r')
    SELECT coalesce(sum(pg_total_relation_size(l.relid)), 0)::bigint,
           coalesce(sum(s.n_live_tup), 0)::bigint,
           coalesce(sum(s.n_dead_tup), 0)::bigint,
           coalesce(sum(s.n_tup_del), 0)::bigint
      FROM log l
      LEFT JOIN pg_stat_user_tables s ON s.relid = l.relid"""
# ids come from one sequence in both designs: emitted = its last value
EMITTED_SQL = "SELECT coalesce(pg_sequence_last_value('outbox.events_id_seq'), 0)"
RING_SQL = "SELECT kept_generations, log_waits_for FROM outbox.status"


def option(name, default):
    """--name=N from the command line, an int, or default"""
    for a in sys.argv:
        if a.startswith(f"--{name}="):
            return int(a.split("=", 1)[1])
    return default


class Config:
    """the soak's length, load and retention, from the options"""

    def __init__(self, b):
        self.minutes = option("minutes", 1 if b.SMOKE else 2 if b.QUICK else 20)
        self.rate = option("rate", 200 if b.SMOKE else 2000)
        self.retention = option("retention", 10 if b.SMOKE else 20 if b.QUICK else 60)
        self.secs = self.minutes * 60
        self.base_secs = max(2 * SAMPLE_SECS, self.secs // 5)
        self.warmup = 2 * self.retention
        if self.warmup + 3 * SAMPLE_SECS > self.secs:
            raise SystemExit(f"bench_retention: a {self.secs} s soak leaves too little after its warm-up"
                             f" of 2 retention windows ({self.warmup} s): give more --minutes= or"
                             " a shorter --retention=")


def connect(server, db):
    c = psycopg2.connect(server.dsn.replace("dbname=bench", f"dbname={db}"))
    c.autocommit = True
    return c


def own(b, path):
    """run-bench runs as root: what is written stays the checkout's owner's"""
    st = os.stat(b.ROOT)
    os.chown(path, st.st_uid, st.st_gid)


def emit_script(b, design):
    """one transaction: one emit() of the emit section's payload"""
    payload = json.dumps({"account": 1, "status": "updated", "amount": 12345, "pad": b.PAD})
    return (f"\\set aid random(1, {AGGREGATES})\n"
            f"SELECT outbox.emit('{design}', :aid::text, 'retention.tick', '{payload}');\n")


def make_databases(b, server, conn):
    """the two databases, each with its extension, its relay publishing
    (the topic made by a first event); returns design to connection"""
    conns = {}
    for design in DESIGNS:
        b.run_pg([f"{b.BINDIR}/createdb", "-h", server.dir, "-p", str(server.port),
                  "-U", "postgres", design])
        c = connect(server, design)
        version = VERSION[design]
        b.q(c, "CREATE EXTENSION outbox" + (f" VERSION '{version}'" if version else ""))
        conns[design] = c
    b.set_conf(conn, "outbox.enabled", "on")
    for design, c in conns.items():
        b.q(c, f"SELECT outbox.emit('{design}', '0', 'retention.warm', '{{}}')")
        b.wait_published(c, 1, timeout=120)
    return conns


def sample(b, c, design):
    """one database's figures now; cumulative counts, rates come later"""
    log_bytes, live, dead, deleted = b.q(c, LOG_SQL)[0]
    emitted = b.q1(c, EMITTED_SQL)
    published = b.published(c)
    kept, waits = b.q(c, RING_SQL)[0] if design == "rotation" else ("", "")
    return {"db": design, "at": time.time(), "log_bytes": log_bytes, "live_rows": live,
            "dead_tuples": dead, "deleted_rows": deleted, "emitted": emitted,
            "published": published, "backlog": emitted - published,
            "kept_generations": kept, "log_waits_for": waits or ""}


class Load:
    """pgbench() on one database, in a thread of its own"""

    def __init__(self, b, server, design, secs, rate):
        self.result = self.error = None
        self.thread = threading.Thread(target=self.run, daemon=True,
                                       args=(b, server, design, secs, rate))
        self.thread.start()

    def run(self, b, server, design, secs, rate):
        try:
            self.result = b.pgbench(server, emit_script(b, design), secs, CLIENTS, rate=rate, db=design)
        except Exception as e:          # raised again in the main thread
            self.error = e

    def alive(self):
        return self.thread.is_alive()

    def wait(self, until):
        self.thread.join(max(0.0, until - time.time()))

    def result_or_raise(self):
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.result


def run_load(b, server, conns, cfg, phase, secs):
    """the load on both databases at once for secs, both sampled every
    SAMPLE_SECS and once more when it ends; returns the samples (with the
    rates over the interval before each) and design to pgbench()'s
    (tps, p50, p99)"""
    samples, prev = [], {}
    t0 = time.time()
    loads = {d: Load(b, server, d, secs, cfg.rate) for d in DESIGNS}
    tick = t0
    while True:
        running = any(load.alive() for load in loads.values())
        for design in DESIGNS:
            s = sample(b, conns[design], design)
            s.update(phase=phase, t=round(s["at"] - t0, 1))
            p = prev.get(design)
            dt = s["at"] - p["at"] if p else 0
            s["emit_rate"] = round((s["emitted"] - p["emitted"]) / dt, 1) if dt else ""
            s["drain_rate"] = round((s["published"] - p["published"]) / dt, 1) if dt else ""
            samples.append(s)
            prev[design] = s
        if not running:
            break
        tick += SAMPLE_SECS
        for load in loads.values():
            load.wait(tick)
    print(f"  ({phase}: {len(samples) // len(DESIGNS)} samples a database over {time.time() - t0:.0f} s)",
          flush=True)
    return samples, {d: load.result_or_raise() for d, load in loads.items()}


def settle(b, conns):
    """waits until each relay has published all its database emitted"""
    end = time.time() + SETTLE_SECS
    for design, c in conns.items():
        while b.published(c) < b.q1(c, EMITTED_SQL) and time.time() < end:
            time.sleep(0.5)
        if time.time() >= end:
            print(f"  ({design}: backlog {b.q1(c, EMITTED_SQL) - b.published(c):,} events"
                  f" {SETTLE_SECS} s after the soak)", flush=True)


def write_csv(b, samples):
    path = os.path.join(b.ROOT, OUT, "retention.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for s in samples:
            w.writerow([s[k] for k in COLUMNS])
    own(b, path)
    return path


# ---------------------------------------------------------------- figures

def span_rate(samples, key):
    """events/s of the counter key from the first sample to the last"""
    first, last = samples[0], samples[-1]
    dt = last["at"] - first["at"]
    return (last[key] - first[key]) / dt if dt > 0 else float("nan")


def bytes_per_event(cfg, mine):
    """what one event adds to a log (heap, TOAST, indexes): its growth per
    event emitted over the soak's first retention window, when nothing in
    it can be past the retention yet, so nothing is removed or reused"""
    first = [s for s in mine if s["t"] <= cfg.retention]
    grown = first[-1]["log_bytes"] - first[0]["log_bytes"]
    events = first[-1]["emitted"] - first[0]["emitted"]
    return grown / events if events > 0 and grown > 0 else float("nan")


def figures(cfg, soak, base, pgb_soak, pgb_base):
    """per design: the soak's figures after warm-up and the baseline's"""
    out = {}
    for design in DESIGNS:
        mine = [s for s in soak if s["db"] == design]
        late = [s for s in mine if s["t"] >= cfg.warmup]
        rest = [s for s in base if s["db"] == design]
        emit = span_rate(late, "emitted")
        sizes = [s["log_bytes"] for s in late]
        bpe = bytes_per_event(cfg, mine)
        out[design] = {
            "bytes_per_event": bpe, "emit": emit, "drain": span_rate(late, "published"),
            "base_emit": span_rate(rest, "emitted"), "base_drain": span_rate(rest, "published"),
            "window": bpe * emit * cfg.retention,
            "max_size": max(sizes), "min_size": min(sizes), "samples": len(late),
            "max_dead": max(s["dead_tuples"] for s in mine),
            "deleted": mine[-1]["deleted_rows"] - mine[0]["deleted_rows"],
            "max_backlog": max(s["backlog"] for s in late),
            "p99": pgb_soak[design][2], "base_p99": pgb_base[design][2]}
    return out


def duration(secs):
    """secs as 4 min, 24 s or 1 min 12 s"""
    parts = ([f"{secs // 60} min"] if secs >= 60 else []) + ([f"{secs % 60} s"] if secs % 60 else [])
    return " ".join(parts)


def ratio(a, b):
    return f"{a / b:.2f}" if b and b == b else ""


def report(b, cfg, fig, versions):
    """the section's rows: the load, one retention window, then each
    measure for both designs"""
    S = SECTION
    b.row(S, "load on each database (pgbench -R)", b.fmt(cfg.rate), "tps", "",
          f"{CLIENTS} clients; one emit() of a 200-byte payload over {AGGREGATES:,} aggregates a "
          f"transaction; both databases at once for {cfg.minutes} min, each relay to its own topic on "
          f"the mock cluster; outbox.retention = {cfg.retention} s; extension {versions['rotation']}"
          f" (rotation) and {versions['delete']} (DELETE)")
    for d in DESIGNS:
        f = fig[d]
        b.row(S, f"{LABEL[d]}: one retention window of the log", f"{f['window'] / MIB:,.1f}", "MiB", "",
              f"{f['bytes_per_event']:,.0f} bytes/event × {f['emit']:,.0f} ev/s emitted after warm-up ×"
              f" {cfg.retention} s; bytes/event: the log's growth (heap, TOAST, indexes) per event emitted"
              " over the first retention window, before anything in it can be removed")
    warm = f"samples every {SAMPLE_SECS} s after the first {cfg.warmup} s (2 retention windows)"
    for d in DESIGNS:
        f = fig[d]
        b.row(S, f"{LABEL[d]}: largest log size after warm-up", f"{f['max_size'] / MIB:,.1f}", "MiB",
              ratio(f["max_size"], f["window"]),
              f"ratio to its retention window ({f['window'] / MIB:,.1f} MiB); target 2.00 or less;"
              " tables, TOAST and indexes")
    for d in DESIGNS:
        f = fig[d]
        b.row(S, f"{LABEL[d]}: log size after warm-up, lowest..highest",
              f"{f['min_size'] / MIB:,.1f}..{f['max_size'] / MIB:,.1f}", "MiB", "", f"{f['samples']} {warm}")
    for d in DESIGNS:
        b.row(S, f"{LABEL[d]}: most dead tuples in the log", b.fmt(fig[d]["max_dead"]), "tuples", "",
              "n_dead_tup summed over the log's tables, whole soak; target 0")
    for d in DESIGNS:
        b.row(S, f"{LABEL[d]}: rows deleted", b.fmt(fig[d]["deleted"]), "rows", "",
              "n_tup_del summed over the log's tables, whole soak")
    base = f"outbox.retention = 7 days, the same load for {duration(cfg.base_secs)} after the soak"
    for d in DESIGNS:
        f = fig[d]
        b.row(S, f"{LABEL[d]}: emit TPS vs no cleanup", b.fmt(f["emit"]), "tps", ratio(f["emit"], f["base_emit"]),
              f"after warm-up; no cleanup ({base}): {f['base_emit']:,.0f}; pgbench p99 over each run {f['p99']:.2f} ms"
              f" vs {f['base_p99']:.2f} ms; target 0.95 or more")
    for d in DESIGNS:
        f = fig[d]
        b.row(S, f"{LABEL[d]}: drain rate vs no cleanup", b.fmt(f["drain"]), "ev/s",
              ratio(f["drain"], f["base_drain"]),
              f"events published per second after warm-up; no cleanup: {f['base_drain']:,.0f};"
              f" largest backlog {f['max_backlog']:,} events; target 0.95 or more")


# ----------------------------------------------------------------- charts

def write_data(b, soak):
    """one gnuplot data file per design: minutes, MiB, dead tuples"""
    paths = {}
    for design in DESIGNS:
        path = os.path.join(b.ROOT, OUT, f"retention-{design}.dat")
        with open(path, "w") as f:
            f.write("# minutes since the soak began, log size in MiB, dead tuples\n")
            for s in soak:
                if s["db"] == design:
                    f.write(f"{s['t'] / 60:.3f} {s['log_bytes'] / MIB:.3f} {s['dead_tuples']}\n")
        own(b, path)
        paths[design] = path
    return paths


def gnuplot_script(cfg, data, window, out):
    """the two charts' gnuplot commands: size with a line at one retention
    window and one at twice it (the target), and dead tuples; both mark
    where the warm-up the figures leave out ends"""
    title = (f"{cfg.rate:,} events/s into each database, outbox.retention = {cfg.retention} s")
    common = ("set terminal pngcairo size 1080,480 font 'sans,10' noenhanced\n"
              "set grid\nset key outside right top\nset xlabel 'minutes since the load began'\n"
              "set xrange [0:*]\nset autoscale xfixmax\nset yrange [0:*]\nset offsets 0, 0, graph 0.05, 0\n"
              f"set arrow from {cfg.warmup / 60:.3f}, graph 0 to {cfg.warmup / 60:.3f}, graph 1 nohead dt 4\n"
              f"set label 'warm-up ends' at {cfg.warmup / 60:.3f}, graph 0.97 offset 0.5, 0\n")
    lines = {d: f"'{data[d]}' using 1:COL with lines lw 2 title '{LABEL[d]}'" for d in DESIGNS}
    size = (f"set output '{out['retention-size.png']}'\n"
            f"set title 'Size of outbox.events (tables, TOAST, indexes): {title}'\n"
            "set ylabel 'MiB'\n"
            "plot " + ", ".join(lines[d].replace("COL", "2") for d in DESIGNS)
            + f", {window / MIB:.3f} with lines dt 2 lc rgb 'gray40' title 'one retention window (rotation)'"
            + f", {2 * window / MIB:.3f} with lines dt 3 lc rgb 'red' title 'twice that (target)'\n")
    dead = (f"set output '{out['retention-dead.png']}'\n"
            f"set title 'Dead tuples in outbox.events (n_dead_tup): {title}'\n"
            "set ylabel 'dead tuples'\n"
            "plot " + ", ".join(lines[d].replace("COL", "3") for d in DESIGNS) + "\n")
    return common + size + "unset output\n" + dead + "unset output\n"


def charts(b, cfg, soak, window):
    """draws the charts into test/bench/out; with --write-docs copies them
    to docs/img and names them for the section's block"""
    data = write_data(b, soak)
    if shutil.which("gnuplot") is None:
        print("  (gnuplot not found: no charts; run-bench installs gnuplot-nox)", flush=True)
        return
    out = {name: os.path.join(b.ROOT, OUT, name) for name, _ in IMAGES}
    subprocess.run(["gnuplot"], input=gnuplot_script(cfg, data, window, out), text=True,
                   check=True, capture_output=True)
    for path in out.values():
        own(b, path)
    if not b.WRITE_DOCS:
        return
    img = os.path.join(b.ROOT, "docs", "img")
    os.makedirs(img, exist_ok=True)
    own(b, img)
    for name, _ in IMAGES:
        shutil.copyfile(out[name], os.path.join(img, name))
        own(b, os.path.join(img, name))
    b.IMAGES[SECTION] = [(alt, f"img/{name}") for name, alt in IMAGES]


# ------------------------------------------------------------------ section

def bench_retention(b, server, conn):
    cfg = Config(b)
    os.makedirs(os.path.join(b.ROOT, OUT), exist_ok=True)
    print(f"  (retention: {cfg.rate:,} tps a database for {cfg.minutes} min, outbox.retention ="
          f" {cfg.retention} s, then {cfg.base_secs} s with no cleanup)", flush=True)
    conns = make_databases(b, server, conn)
    try:
        versions = {d: b.q1(c, "SELECT extversion FROM pg_extension WHERE extname = 'outbox'")
                    for d, c in conns.items()}
        b.set_conf(conn, "outbox.retention", str(cfg.retention))
        soak, pgb_soak = run_load(b, server, conns, cfg, "soak", cfg.secs)
        settle(b, conns)
        # cleanup out of the way: nothing is past a week; the soak's dead
        # rows vacuumed first, so that autovacuum does not clean them up
        # during the baseline
        b.set_conf(conn, "outbox.retention", str(NO_CLEANUP_RETENTION))
        for c in conns.values():
            b.q(c, "VACUUM outbox.events")
        base, pgb_base = run_load(b, server, conns, cfg, "baseline", cfg.base_secs)
        print(f"  written: {write_csv(b, soak + base)}", flush=True)
        fig = figures(cfg, soak, base, pgb_soak, pgb_base)
        report(b, cfg, fig, versions)
        charts(b, cfg, soak, fig["rotation"]["window"])
    finally:
        b.set_conf(conn, "outbox.enabled", "off")
        b.q(conn, "ALTER SYSTEM RESET outbox.retention")
        b.q(conn, "SELECT pg_reload_conf()")
        for c in conns.values():
            c.close()
