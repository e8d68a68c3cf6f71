"""test/bench/bench.py: the outbox benchmark suite (run through run-bench).

Every figure is measured in this run, on this machine, against the baseline
it is compared with:

  emit cost   pgbench, 8 clients: UPDATE a business row + outbox.emit() vs the
              same UPDATE + a plain INSERT into a table with the same columns
              and indexes (the hand-made, Debezium-style outbox)
  drain       a backlog of events (200-byte payloads, 10,000 aggregates)
              published to the 3-broker test cluster, vs the hand-written
              polling publisher (test/bench/baseline_relay.c: SELECT ... FOR
              UPDATE SKIP LOCKED LIMIT n, idempotent producer, wait for acks,
              UPDATE ... SET published_at) at its best batch size; and the
              machine's limit, the lower of the read limit (PostgreSQL
              returning the same rows) and the producer limit (a bare
              librdkafka producer sending the same messages from memory),
              with "outbox drain / limit" (test/bench/bench_drain.py)
  drain-kafka  the same drain and limits on the 3-broker Apache Kafka
              (test/kafka/apache), and the latency at 100 events/s there
  scaling     the drain for payloads of 100 B, 1 kB and 10 kB over 1, 100
              and 10,000 aggregates, each against its producer limit
  latency     commit to delivery as a kcat consumer sees it, at 100 events/s
              and at half the drain rate, timed from the emit's stamp inside
              the transaction (so its commit's WAL flush included) and from
              the moment the client's COMMIT returned; vs the baseline polling
              every 100 ms;
              and at 100 events/s with a streaming standby (physical slot, same
              machine), outbox.synchronized_standby_slots empty vs naming it
  idle        queries, WAL and CPU of the relay over an idle minute
  bigtx       one transaction emitting 300,000 events over 100 aggregates,
              with outbox.aggregate_sequence on vs off
  opentx      relay CPU per safety poll while a transaction holding 300,000
              uncommitted events stays open, vs none open
  held xmin   drain rate while another session holds a transaction open
  inbox       a subscription whose handler inserts one row: messages
              applied per second from a backlog in Kafka (against the
              20,000/s target), and the full loop at 100 events/s: commit in
              one database to the handler's row in another, beside the
              Kafka arrival of the same events as kcat sees it
  eos         (only when asked: --sections=eos) outbox.delivery =
              exactly_once against at_least_once on the same 3-broker Apache
              Kafka (test/kafka/apache): drain of the backlog, latency at 100
              events/s as a read_committed consumer sees it (beside a bare
              librdkafka producer's, idempotent and transactional: the
              floor), and the copies a read_committed consumer reads after
              kill -9 mid-drain
  avro        (only when asked: --sections=avro) the drain of the backlog
              as JSON against the same events encoded by the relay as Avro
              through a schema registry (the test tool's stand-in), in turns
              on the mock cluster (test/bench/bench_avro.py)
  debezium    (only when asked: --sections=debezium) the relay against
              Debezium Server's outbox EventRouter on the same server
              (wal_level = logical), the same 3-broker Apache Kafka
              cluster (test/kafka/apache) and the same Java consumer
              (test/debezium/): emit cost, drain, latency, idle, kill -9,
              a transaction held open, message compatibility
  retention   (only when asked: --sections=retention) a soak of the log's
              cleanup: two databases of one server under the same
              pgbench load at once (2,000 emit() transactions/s each, 20
              minutes, outbox.retention = 60 s), one at the current
              version (the log a ring of generations, emptied by
              TRUNCATE), one created at 1.7 (delivered rows past the
              retention removed by DELETE); every 10 s the log's size
              (tables, TOAST, indexes), its dead tuples, rows deleted,
              emit and drain rates; then the same load for a fifth of the
              time with outbox.retention = 7 days, the no-cleanup
              baseline of both (test/bench/bench_retention.py)
"""

import bisect
import json
import math
import os
import pwd
import re
import shutil
import signal
import subprocess
from statistics import median
import sys
import tempfile
import threading
import time

import psycopg2

import benchdoc
import bench_drain as bench_drain_limits
import bench_avro
import bench_eos
import bench_retention

QUICK = "--quick" in sys.argv
# --sections=emit,drain,latency,idle,held runs a subset; latency without
# drain takes the drain rate (and baseline batch) from --drain-rate=N,B
SECTIONS = next((a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--sections=")),
                ["emit", "drain", "drain-kafka", "scaling", "latency", "idle", "held", "bigtx",
                 "opentx", "inbox"])
GIVEN_DRAIN = next((a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--drain-rate=")),
                   None)
SMOKE = "--smoke" in sys.argv      # checks the script itself, in a minute
# the sections that ran to their end replace theirs on docs/benchmarks.md
WRITE_DOCS = "--write-docs" in sys.argv
BACKLOG = 20_000 if SMOKE else 200_000 if QUICK else 1_000_000
HELD_BACKLOG = 10_000 if SMOKE else 100_000 if QUICK else 200_000
AGGREGATES = 10_000
EMIT_SECS = 2 if SMOKE else 5 if QUICK else 8
EMIT_ROUNDS = 2 if SMOKE else 3 if QUICK else 5
LAT_SECS = 4 if SMOKE else 10 if QUICK else 20
IDLE_SECS = 5 if SMOKE else 20 if QUICK else 60
BIGTX_EVENTS = 30_000 if SMOKE else 300_000
OPENTX_SECS = 5 if SMOKE else 10 if QUICK else 20
# the test broker keeps about 5 MB per partition: the backlog must fit in its 4
INBOX_BACKLOG = 20_000 if SMOKE else 60_000
BASELINE_BATCHES = [1000] if SMOKE else [1000, 5000] if QUICK else [500, 2000, 10000]
PAD = "x" * 120            # with the other fields, about 200 bytes of JSON

BINDIR = subprocess.check_output(["pg_config", "--bindir"], text=True).strip()
ROOT = os.getcwd()
PG = pwd.getpwnam("postgres")


def as_postgres():
    os.setgid(PG.pw_gid)
    os.setuid(PG.pw_uid)


def run_pg(args, **kw):
    return subprocess.run(args, preexec_fn=as_postgres, check=True,
                          capture_output=True, text=True, **kw)


class Server:
    def __init__(self, brokers, logical=False):
        self.dir = tempfile.mkdtemp(prefix="outbox-bench.")
        os.chown(self.dir, PG.pw_uid, PG.pw_gid)
        self.port = int(os.environ.get("OUTBOX_BENCH_PORT", "5497"))
        self.data = os.path.join(self.dir, "data")
        run_pg([f"{BINDIR}/initdb", "-D", self.data, "-A", "trust", "-U", "postgres"])
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write(f"""
listen_addresses = ''
unix_socket_directories = '{self.dir}'
port = {self.port}
shared_preload_libraries = 'outbox,pg_stat_statements'
pg_stat_statements.track = all
shared_buffers = '1GB'
max_wal_size = '16GB'
checkpoint_timeout = '30min'
max_connections = 50
outbox.kafka_brokers = '{brokers}'
outbox.kafka_config = 'reconnect.backoff.max.ms=500'
outbox.enabled = off
""")
            if logical:
                # Debezium connects over TCP and reads the WAL through a slot
                f.write("listen_addresses = '127.0.0.1'\nwal_level = logical\n")
        run_pg([f"{BINDIR}/pg_ctl", "-D", self.data, "-l",
                os.path.join(self.dir, "server.log"), "-w", "start"])
        run_pg([f"{BINDIR}/createdb", "-h", self.dir, "-p", str(self.port), "-U", "postgres", "bench"])
        self.dsn = f"host={self.dir} port={self.port} user=postgres dbname=bench"

    def connect(self):
        c = psycopg2.connect(self.dsn)
        c.autocommit = True
        return c

    def stop(self):
        subprocess.run([f"{BINDIR}/pg_ctl", "-D", self.data, "-m", "fast", "stop"],
                       preexec_fn=as_postgres, capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


# bootstrap addresses of the mock clusters this run started (Broker)
MOCK_BOOTSTRAPS = set()


class Broker:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="outbox-broker.")
        boot = os.path.join(self.dir, "boot")
        self.proc = subprocess.Popen([os.path.join(ROOT, "test/broker/outbox_test_broker"),
                                      "-b", "3", "-f", boot],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     stdin=subprocess.PIPE)
        for _ in range(100):
            if os.path.exists(boot) and os.path.getsize(boot) > 0:
                break
            time.sleep(0.05)
        self.bootstrap = open(boot).read().strip()
        MOCK_BOOTSTRAPS.add(self.bootstrap)

    def create(self, topic, partitions):
        """creates a topic through the broker's command channel (stdin)"""
        self.proc.stdin.write(f"create {topic} {partitions}\n".encode())
        self.proc.stdin.flush()
        time.sleep(0.5)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def q(conn, sql, *args):
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall() if cur.description else None


def q1(conn, sql, *args):
    return q(conn, sql, *args)[0][0]


def set_conf(conn, setting, value):
    q(conn, f"ALTER SYSTEM SET {setting} = %s", value)
    q(conn, "SELECT pg_reload_conf()")
    time.sleep(0.3)


def published(conn):
    return q1(conn, "SELECT published FROM outbox.relay_progress")


def wait_published(conn, target, timeout=1800, poll=0.05):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if published(conn) >= target:
            return
        time.sleep(poll)
    raise RuntimeError(f"relay did not publish {target} events in {timeout} s")


def pgbench(server, script, secs, clients, rate=None, db="bench", ends=None):
    """pgbench's tps and p50/p99 latency in ms; with ends a dict, also each
    client's transaction ends (us since 1970, ascending) into it"""
    d = tempfile.mkdtemp(prefix="pgb.", dir=server.dir)
    os.chown(d, PG.pw_uid, PG.pw_gid)
    path = os.path.join(d, "script.sql")
    with open(path, "w") as f:
        f.write(script)
    args = [f"{BINDIR}/pgbench", "-h", server.dir, "-p", str(server.port), "-U", "postgres",
            "-n", "-M", "prepared", "-c", str(clients), "-j", "2", "-T", str(secs),
            "-l", "--log-prefix", os.path.join(d, "lat"), "-f", path, db]
    if rate:
        args[1:1] = ["-R", str(rate)]
    out = run_pg(args).stdout
    tps = float(re.search(r"^tps = ([0-9.]+)", out, re.M).group(1))
    lat = []
    for name in os.listdir(d):
        if name.startswith("lat"):
            with open(os.path.join(d, name)) as f:
                # client, transaction, latency in us (or "failed" or
                # "skipped"), script, then the end in s and us since 1970
                for line in f:
                    fields = line.split()
                    if not fields[2].isdigit():
                        continue
                    lat.append(int(fields[2]))
                    if ends is not None:
                        ends.setdefault(int(fields[0]), []).append(
                            int(fields[4]) * 1_000_000 + int(fields[5]))
    for mine in (ends or {}).values():
        mine.sort()
    lat.sort()
    return tps, pct(lat, 50) / 1000, pct(lat, 99) / 1000


def pct(values, p):
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(len(values) * p / 100))]


rows = []


def row(section, case, value, unit, ratio="", note=""):
    rows.append((section, case, value, unit, ratio, note))
    print(f"  {section:10} {case:52} {value:>12} {unit:8} {ratio:>8} {note}", flush=True)


def fmt(x, digits=0):
    return f"{x:,.{digits}f}"


# ---------------------------------------------------------------- emit cost

def alternate(cases):
    """Runs every case once per round, EMIT_ROUNDS rounds, the order turned
    by one each round (a, b, c; b, c, a; ...): the cases of a round run
    within a minute of each other, so a ratio taken within a round is not
    moved by the drift of the machine over the section (tables that grow,
    autovacuum, checkpoints), and no case always runs first.  cases maps a
    name to a function returning pgbench()'s (tps, p50, p99); returns the
    name's results, one per round, in round order."""
    names = list(cases)
    res = {k: [] for k in names}
    for r in range(EMIT_ROUNDS):
        k0 = r % len(names)
        for k in names[k0:] + names[:k0]:
            res[k].append(cases[k]())
    return res


def round_ratios(a, b):
    """median, lowest and highest of the per-round TPS ratios a/b"""
    rs = [x[0] / y[0] for x, y in zip(a, b)]
    return median(rs), min(rs), max(rs)


def make_accounts(conn):
    """b.accounts, the business rows both emit comparisons update, each
    account with an event already, as in a live system: the runs measure
    the counter row's update, not its creation"""
    q(conn, """
        CREATE SCHEMA IF NOT EXISTS b;
        CREATE TABLE b.accounts (id int PRIMARY KEY, version bigint NOT NULL DEFAULT 0, filler text);
        INSERT INTO b.accounts SELECT g, 0, repeat('x', 100) FROM generate_series(1, 10000) g;
    """)
    q(conn, "VACUUM ANALYZE b.accounts")
    q(conn, "SELECT count(outbox.emit('account', g::text, 'account.opened', '{}')) FROM generate_series(1, 10000) g")


def bench_emit(server, conn):
    make_accounts(conn)
    q(conn, "CREATE TABLE b.plain_outbox (LIKE outbox.events INCLUDING ALL)")
    payload = json.dumps({"account": 1, "status": "updated", "amount": 12345, "pad": PAD})
    emit = f"""\\set aid random(1, 10000)
BEGIN;
UPDATE b.accounts SET version = version + 1 WHERE id = :aid;
SELECT outbox.emit('account', :aid::text, 'account.updated', '{payload}');
END;
"""
    plain = f"""\\set aid random(1, 10000)
BEGIN;
UPDATE b.accounts SET version = version + 1 WHERE id = :aid;
INSERT INTO b.plain_outbox (event_id, aggregate_type, aggregate_id, event_type, topic, key, payload, occurred_at)
  VALUES (gen_random_uuid(), 'account', :aid::text, 'account.updated', 'outbox.event.account', :aid::text, '{payload}', now());
END;
"""
    def case(seq, limits=False):
        def run():
            if seq is None:
                return pgbench(server, plain, EMIT_SECS, 8)
            set_conf(conn, "outbox.aggregate_sequence", seq)
            # backpressure's limits, set far above what the run reaches
            set_conf(conn, "outbox.max_backlog", "100000000" if limits else "0")
            set_conf(conn, "outbox.max_backlog_age", "3600" if limits else "0")
            return pgbench(server, emit, EMIT_SECS, 8)
        return run
    for relay in ("paused", "draining"):
        set_conf(conn, "outbox.enabled", "off" if relay == "paused" else "on")
        cases = {"plain": case(None), "off": case("off"), "on": case("on")}
        if relay == "draining":
            cases["limits"] = case("on", True)
        res = alternate(cases)
        ptps = median([r[0] for r in res["plain"]])
        pp99 = median([r[2] for r in res["plain"]])
        row("emit", f"plain INSERT TPS (relay {relay})", fmt(ptps), "tps", "",
            f"median of {EMIT_ROUNDS} rounds of {EMIT_SECS} s, 8 clients")
        for seq in ("off", "on"):
            etps = median([r[0] for r in res[seq]])
            ep99 = median([r[2] for r in res[seq]])
            mid, lo, hi = round_ratios(res[seq], res["plain"])
            row("emit", f"emit() TPS (sequence {seq}, relay {relay})", fmt(etps), "tps",
                f"{mid:.2f}", f"rounds {lo:.2f}..{hi:.2f}; p99 {ep99:.2f} ms vs {pp99:.2f} ms ({ep99 / pp99:.2f})")
        mid, lo, hi = round_ratios(res["on"], res["off"])
        row("emit", f"sequence on vs off: emit() TPS (relay {relay})", fmt(median([r[0] for r in res["on"]])),
            "tps", f"{mid:.2f}", f"rounds {lo:.2f}..{hi:.2f}; target 0.95")
        if "limits" in res:
            mid, lo, hi = round_ratios(res["limits"], res["on"])
            row("emit", f"backlog limits set vs none: emit() TPS (relay {relay})",
                fmt(median([r[0] for r in res["limits"]])), "tps", f"{mid:.2f}",
                f"rounds {lo:.2f}..{hi:.2f}; outbox.max_backlog and max_backlog_age set far above the backlog")
    set_conf(conn, "outbox.enabled", "off")
    set_conf(conn, "outbox.aggregate_sequence", "on")
    set_conf(conn, "outbox.max_backlog", "0")
    set_conf(conn, "outbox.max_backlog_age", "0")
    q(conn, "DROP SCHEMA b CASCADE")


# ------------------------------------------------------------------- drain

def make_backlog(conn, n, agg_type):
    """n events through emit(), in transactions of 50,000."""
    done = 0
    while done < n:
        k = min(50_000, n - done)
        q(conn, """SELECT count(outbox.emit(%s, (g %% %s)::text, 'account.updated',
                          jsonb_build_object('account', g %% %s, 'status', 'updated',
                                             'amount', g, 'pad', %s)))
                   FROM generate_series(%s, %s) g""",
          agg_type, AGGREGATES, AGGREGATES, PAD, done, done + k - 1)
        done += k


def make_plain_outbox(conn):
    """The hand-made outbox table the baseline publishes from."""
    q(conn, """
        CREATE SCHEMA bench;
        CREATE TABLE bench.plain_outbox (LIKE outbox.events INCLUDING DEFAULTS INCLUDING IDENTITY,
                                         published_at timestamptz);
        ALTER TABLE bench.plain_outbox ADD PRIMARY KEY (id);
        CREATE INDEX ON bench.plain_outbox (id) WHERE published_at IS NULL;
    """)


def drain_outbox(conn, n):
    """Publish a backlog of n events; returns events/s, timed from the
    reload that enables the relay to the progress that counts the last"""
    start_pub = published(conn)
    q(conn, "ALTER SYSTEM SET outbox.enabled = on")
    t0 = time.time()
    q(conn, "SELECT pg_reload_conf()")
    wait_published(conn, start_pub + n, poll=0.005)
    rate = n / (time.time() - t0)
    set_conf(conn, "outbox.enabled", "off")
    return rate


def bench_drain(server, conn, brokers):
    me = sys.modules[__name__]
    runs = bench_drain_limits.rounds(me, server, conn, brokers,
                                     ["account"] + [f"account{i}" for i in range(2, bench_drain_limits.ROUNDS + 1)],
                                     "outbox.event.bare")
    ours = bench_drain_limits.limit_rows(me, "drain", BACKLOG, runs, "the same mock cluster")

    # the same events, for the hand-written publisher
    make_plain_outbox(conn)
    q(conn, """INSERT INTO bench.plain_outbox (event_id, aggregate_type, aggregate_id, seq, event_type,
                   schema_version, topic, key, payload, occurred_at)
               SELECT event_id, aggregate_type, aggregate_id, seq, event_type, schema_version,
                      'bench.baseline', key, payload, occurred_at
                 FROM outbox.events WHERE aggregate_type = 'account' ORDER BY id""")
    best = (0, None)
    for batch in BASELINE_BATCHES:
        q(conn, "UPDATE bench.plain_outbox SET published_at = NULL")
        q(conn, "VACUUM ANALYZE bench.plain_outbox")
        out = subprocess.run([os.path.join(ROOT, "test/bench/baseline_relay"), server.dsn, brokers,
                              str(batch), "100", "drain"], check=True, capture_output=True,
                             text=True).stdout
        m = re.search(r"published (\d+) in ([0-9.]+) s", out)
        rate = int(m.group(1)) / float(m.group(2))
        row("drain", f"baseline, batch {batch}", fmt(rate), "ev/s")
        if rate > best[0]:
            best = (rate, batch)
    row("drain", f"outbox vs best baseline (batch {best[1]})", fmt(ours), "ev/s",
        f"{ours / best[0]:.2f}")
    return ours, best


# ----------------------------------------------------------------- latency

class Consumer:
    """kcat reading a topic from its end; stamps each message on arrival and
    takes the emit time from the payload's "t" (microseconds since 1970).

    Apache Kafka answers a fetch as soon as data arrives; the mock cluster
    only once the fetch's whole wait is out, which would add up to that wait
    to every arrival: against it kcat waits 1 ms, against Apache Kafka 5."""

    def __init__(self, brokers, topic):
        self.lat = []
        # (arrival in ms since 1970, the payload's "t" in us, its "c")
        self.seen = []
        wait = 1 if brokers in MOCK_BOOTSTRAPS else 5
        self.proc = subprocess.Popen(
            ["kcat", "-C", "-b", brokers, "-t", topic, "-o", "end", "-u", "-q", "-f", "%s\n",
             "-X", f"fetch.wait.max.ms={wait}", "-X", "fetch.error.backoff.ms=5"],
            stdout=subprocess.PIPE, text=True, bufsize=1)
        self.thread = threading.Thread(target=self.read, daemon=True)
        self.thread.start()

    def read(self):
        for line in self.proc.stdout:
            now = time.time()
            try:
                doc = json.loads(line)
                t = doc["t"]
            except (ValueError, KeyError, TypeError):
                continue
            self.lat.append(now * 1000 - t / 1000)
            self.seen.append((now * 1000, t, doc.get("c")))

    def stop(self):
        time.sleep(1.5)
        self.proc.terminate()
        self.thread.join(5)
        return sorted(self.lat)


def since_commit(seen, ends):
    """Latency from the commit, sorted: for each arrival (ms, t, client) of
    an event whose payload names its pgbench client, arrival minus the end
    of the client's transaction that emitted it, which is the first of that
    client's transaction ends at or after the emit's stamp t."""
    out = []
    for arrival, t, client in seen:
        mine = ends.get(client)
        if not mine:
            continue
        i = bisect.bisect_left(mine, t)
        if i < len(mine):
            out.append(arrival - mine[i] / 1000)
    return sorted(out)


def latency_run(server, brokers, topic, script, secs, rate, commit=None):
    """kcat's latencies from the emit's stamp, sorted; with commit a list,
    also those from the commit's return into it (since_commit): the
    script's payload then carries its client as "c"."""
    consumer = Consumer(brokers, topic)
    time.sleep(3)  # let kcat join every partition at its end
    ends = {} if commit is not None else None
    pgbench(server, script, secs, 4, rate=rate, ends=ends)
    lat = consumer.stop()
    if commit is not None:
        commit.extend(since_commit(consumer.seen, ends))
    return lat


class Standby:
    """A streaming standby of server on a physical slot, on this machine."""

    def __init__(self, server, conn, slot="bench_standby"):
        self.conn, self.slot = conn, slot
        self.dir = tempfile.mkdtemp(prefix="outbox-standby.")
        os.chown(self.dir, PG.pw_uid, PG.pw_gid)
        self.data = os.path.join(self.dir, "data")
        q(conn, "SELECT pg_create_physical_replication_slot(%s, true)", slot)
        run_pg([f"{BINDIR}/pg_basebackup", "-h", server.dir, "-p", str(server.port),
                "-U", "postgres", "-D", self.data, "-R", "-S", slot, "-c", "fast"])
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write(f"\nport = {server.port + 1}\nunix_socket_directories = '{self.dir}'\n"
                    "shared_buffers = '128MB'\n")
        run_pg([f"{BINDIR}/pg_ctl", "-D", self.data, "-l",
                os.path.join(self.dir, "server.log"), "-w", "start"])
        for _ in range(600):
            if q1(conn, "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"):
                return
            time.sleep(0.05)
        raise RuntimeError("the standby does not stream")

    def stop(self):
        subprocess.run([f"{BINDIR}/pg_ctl", "-D", self.data, "-m", "fast", "stop"],
                       preexec_fn=as_postgres, capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        q(self.conn, "SELECT pg_drop_replication_slot(%s)", self.slot)


def bench_standby_latency(server, conn, brokers, tick):
    """100 ev/s with a standby streaming, the relay waiting for it or not"""
    standby = Standby(server, conn)
    res = {}
    try:
        for label, slots in ((" + standby", ""), (", standby waited for", standby.slot)):
            set_conf(conn, "outbox.synchronized_standby_slots", slots)
            lat = latency_run(server, brokers, "outbox.event.tick", "\\set n 1\n" + tick,
                              LAT_SECS, 100)
            res[label] = lat
            ratio, note = "", f"{len(lat)} events"
            if slots:
                plain = res[" + standby"]
                ratio = f"{pct(lat, 50) / pct(plain, 50):.2f}"
                note += (f"; outbox.synchronized_standby_slots names its slot: ratio of p50"
                         f" (p99: {pct(lat, 99) / pct(plain, 99):.2f}) to the standby not waited for")
            else:
                note += "; a streaming standby on a physical slot, not waited for"
            row("latency", f"outbox p50/p95/p99 at 100 ev/s{label}",
                f"{pct(lat, 50):.1f}/{pct(lat, 95):.1f}/{pct(lat, 99):.1f}", "ms", ratio, note)
    finally:
        set_conf(conn, "outbox.synchronized_standby_slots", "")
        standby.stop()


def bench_latency(server, conn, brokers, drain_rate, baseline_batch):
    # after the drains, autovacuum would compete for the 2 cores meanwhile
    q(conn, "VACUUM ANALYZE outbox.events")
    q(conn, "VACUUM ANALYZE bench.plain_outbox")
    set_conf(conn, "outbox.enabled", "on")
    # each client its own aggregates: transactions of many emits must not
    # deadlock on the per-aggregate counters
    tick = ("SELECT outbox.emit('tick', (:client_id * 100000 + (random() * 10000)::int)::text, 'tick', "
            "jsonb_build_object('t', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, "
            f"'c', (:client_id)::int, 'pad', '{PAD}')) FROM generate_series(1, :n);\n")
    results = {}
    # the topic exists before anything is measured, as in production
    q(conn, "SELECT outbox.emit('tick', '0', 'tick', '{}')")
    time.sleep(2)
    half = max(int(drain_rate / 2), 100)
    per_txn = max(1, half // 1000)
    for label, rate, n in (("100 ev/s", 100, 1), (f"{half:,} ev/s (half the drain rate)", half // per_txn, per_txn)):
        commit = []
        lat = latency_run(server, brokers, "outbox.event.tick",
                          f"\\set n {n}\n" + tick, LAT_SECS, rate, commit=commit)
        results[label] = lat
        row("latency", f"outbox p50/p95/p99 at {label}", ms3(lat), "ms", "",
            f"{len(lat)} events, {len(lat) / LAT_SECS:,.0f} ev/s reached; from the emit's"
            " clock_timestamp() inside the transaction, so its commit (the WAL flush) included")
        row("latency", f"outbox p50/p95/p99 at {label}, from the commit",
            ms3(commit), "ms", "",
            f"the same {len(commit)} events, from the moment the client's COMMIT returned"
            " (pgbench's log of each transaction's end)")
    bench_standby_latency(server, conn, brokers, tick)
    set_conf(conn, "outbox.enabled", "off")

    # the baseline at its usual 100 ms poll, same load into its table
    base = subprocess.Popen([os.path.join(ROOT, "test/bench/baseline_relay"), server.dsn, brokers,
                             str(baseline_batch), "100", str(LAT_SECS + 10)],
                            stdout=subprocess.DEVNULL)
    plain = ("INSERT INTO bench.plain_outbox (event_id, aggregate_type, aggregate_id, event_type, topic, key, payload, occurred_at) "
             "SELECT gen_random_uuid(), 'tick', k, 'tick', 'bench.tick', k, "
             "jsonb_build_object('t', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, "
             f"'pad', '{PAD}'), now() FROM (SELECT (random() * 10000)::int::text AS k FROM generate_series(1, 1)) s;\n")
    q(conn, plain)       # creates the topic while the baseline runs
    time.sleep(2)
    lat = latency_run(server, brokers, "bench.tick", plain, LAT_SECS, 100)
    base.wait()
    ours = results["100 ev/s"]
    row("latency", "baseline (100 ms poll) p50/p95/p99 at 100 ev/s",
        f"{pct(lat, 50):.1f}/{pct(lat, 95):.1f}/{pct(lat, 99):.1f}", "ms",
        f"{pct(ours, 50) / pct(lat, 50):.2f}", "ratio of p50")


# -------------------------------------------------------------------- idle

def relay_pid(conn):
    return q1(conn, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox relay'")


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def thread_ms(pid):
    """CPU ms of each live thread of pid (schedstat, in ns: finer than the
    10 ms ticks of stat), by thread name (librdkafka's are rdk:...)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except FileNotFoundError:
            continue
        out[name] = out.get(name, 0) + ns / 1e6
    return out


def wakeups(pid):
    """Voluntary context switches of all live threads of pid: each one a
    sleep, so the wake-ups that follow."""
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                n += next(int(l.split()[1]) for l in f if l.startswith("voluntary_ctxt_switches"))
        except FileNotFoundError:
            continue
    return n


def threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def idle_cpu(pid, secs):
    """CPU of pid over secs idle seconds, in ms (schedstat, all threads),
    with the share of librdkafka's threads and the busiest of them."""
    threads0 = thread_ms(pid)
    wakes0 = wakeups(pid)
    time.sleep(secs)
    threads1 = thread_ms(pid)
    wakes = wakeups(pid) - wakes0
    # the sum over the threads alive at both ends: none starts or ends
    # while the producer stays open, or stays closed
    per = {n: threads1[n] - threads0.get(n, 0) for n in threads1}
    rdk = sum(v for n, v in per.items() if n.startswith("rdk:"))
    busiest = max((n for n in per if n.startswith("rdk:")), key=lambda n: per[n], default="none")
    mine = sum(v for n, v in per.items() if not n.startswith("rdk:"))
    # what a wake-up costs differs between machines (virtual ones most):
    # the count of them is what the relay decides
    return (sum(per.values()),
            f"relay thread {mine:.0f} ms, librdkafka threads {rdk:.0f} ms"
            + (f" ({busiest} {per[busiest]:.0f} ms)" if rdk else "")
            + f"; {wakes} wake-ups, {sum(per.values()) / max(wakes, 1):.2f} ms each")


# waits in epoll, a second at a time, until killed
BARE_WAKER = "import select\ne = select.epoll()\nwhile True:\n    e.poll(1.0)\n"


def bench_idle(conn, brokers):
    set_conf(conn, "outbox.enabled", "on")
    # the first minute with the producer kept open
    set_conf(conn, "outbox.kafka_idle_timeout", "0")
    q(conn, "SELECT outbox.emit('tick', '0', 'tick', '{}')")
    # the minute starts once the relay has published what earlier sections
    # left and settled: idle, nothing pending, nothing sent for 5 s
    for _ in range(600):
        st = q(conn, "SELECT state, backlog, last_delivery_at FROM outbox.status()")[0]
        if st[0] == "running" and st[1] == 0 and (st[2] is None or q1(conn, "SELECT now() - %s > interval '5 s'", st[2])):
            break
        time.sleep(1)
    pid = relay_pid(conn)
    # autovacuum would still be cleaning up after the drains: WAL counts
    # the whole server, so keep it out of the idle minute
    set_conf(conn, "autovacuum", "off")
    q(conn, "CHECKPOINT")
    q(conn, "SELECT pg_stat_statements_reset()")
    q(conn, "SELECT pg_stat_reset_shared('wal')")
    wal0 = q1(conn, "SELECT wal_bytes FROM pg_stat_wal")
    cpu_open, note_open = idle_cpu(pid, IDLE_SECS)
    wal1 = q1(conn, "SELECT wal_bytes FROM pg_stat_wal")
    calls = q(conn, """SELECT coalesce(sum(calls), 0), count(*) FROM pg_stat_statements s
                        JOIN pg_database d ON d.oid = s.dbid
                       WHERE d.datname = 'bench' AND query !~* 'pg_stat_|pg_reload_conf|ALTER SYSTEM'""")[0]
    polls = IDLE_SECS * 1000 / int(q1(conn, "SELECT setting FROM pg_settings WHERE name = 'outbox.poll_interval'"))
    row("idle", f"relay statements over {IDLE_SECS} s idle", fmt(calls[0]), "calls", "",
        f"{calls[1]} distinct; {polls:.0f} safety polls")
    row("idle", f"WAL written over {IDLE_SECS} s idle", fmt(wal1 - wal0), "bytes")
    row("idle", f"relay CPU over {IDLE_SECS} s idle, producer open", f"{cpu_open:.1f}", "ms",
        "", f"outbox.kafka_idle_timeout = 0; the process: {note_open}")

    # the default: the producer is closed after outbox.kafka_idle_timeout
    q(conn, "ALTER SYSTEM RESET outbox.kafka_idle_timeout")
    q(conn, "SELECT pg_reload_conf()")
    time.sleep(0.5)
    timeout = q1(conn, "SHOW outbox.kafka_idle_timeout")
    t0 = time.time()
    while threads(pid) > 1 and time.time() - t0 < 300:
        time.sleep(0.2)
    closed_after = time.time() - t0
    # beside it, a bare process waking once a second: what a wake-up
    # costs on this machine, whoever wakes
    bare = subprocess.Popen([sys.executable, "-c", BARE_WAKER])
    time.sleep(0.5)
    bare0, bare_wakes0 = thread_ms(bare.pid), wakeups(bare.pid)
    cpu_closed, note_closed = idle_cpu(pid, IDLE_SECS)
    bare_ms = sum(thread_ms(bare.pid).values()) - sum(bare0.values())
    bare_wakes = wakeups(bare.pid) - bare_wakes0
    bare.kill()
    bare.wait()
    row("idle", f"relay CPU over {IDLE_SECS} s idle, producer closed", f"{cpu_closed:.1f}", "ms",
        f"{cpu_closed / cpu_open:.2f}" if cpu_open else "",
        f"the default, outbox.kafka_idle_timeout = {timeout} (closed {closed_after:.0f} s after the reset, idle since the minute above began);"
        f" {note_closed}; ratio to producer open")
    row("idle", "a bare process waking once a second, same minute", f"{bare_ms:.1f}", "ms", "",
        f"{bare_wakes:.0f} wake-ups, {bare_ms / max(bare_wakes, 1):.2f} ms each: the machine's cost of a wake-up")

    # what closing costs: the first event after it opens the producer again
    consumer = Consumer(brokers, "outbox.event.tick")
    time.sleep(3)
    tick = ("SELECT outbox.emit('tick', '1', 'tick', jsonb_build_object('t', "
            "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint))")
    q(conn, tick)
    time.sleep(2)
    q(conn, tick)
    time.sleep(1)
    consumer.stop()
    lat = consumer.lat           # in arrival order
    if len(lat) == 2:
        row("idle", "first event after the close, commit to kcat", f"{lat[0]:.1f}", "ms", "",
            f"opens the producer; the next event, producer open: {lat[1]:.1f} ms")
    else:
        row("idle", "first event after the close, commit to kcat", "?", "ms", "",
            f"kcat saw {len(lat)} of 2 events")
    set_conf(conn, "outbox.enabled", "off")
    set_conf(conn, "autovacuum", "on")


def bench_bigtx(conn):
    """One transaction emitting many events over 100 aggregates, with the
    per-aggregate sequence off and on (relay paused: emit() alone)."""
    set_conf(conn, "outbox.enabled", "off")
    secs = {}
    for seq in ("off", "on"):
        set_conf(conn, "outbox.aggregate_sequence", seq)
        q(conn, "VACUUM ANALYZE outbox.events")
        t0 = time.time()
        q(conn, f"""SELECT count(outbox.emit('bigtx', mod(g, 100)::text, 'bigtx.e',
                       jsonb_build_object('n', g, 'pad', '{PAD}')))
                     FROM generate_series(1, {BIGTX_EVENTS}) g""")
        secs[seq] = time.time() - t0
        row("bigtx", f"one transaction of {BIGTX_EVENTS:,} events, 100 aggregates, sequence {seq}",
            f"{secs[seq]:.2f}", "s", "" if seq == "off" else f"{secs['on'] / secs['off']:.2f}")
    set_conf(conn, "outbox.aggregate_sequence", "on")
    target = published(conn) + 2 * BIGTX_EVENTS
    set_conf(conn, "outbox.enabled", "on")
    wait_published(conn, target)
    set_conf(conn, "outbox.enabled", "off")


# ----------------------------------------------------------------- opentx

def bench_opentx(conn):
    """The relay thread's CPU per safety poll (schedstat) with no
    transaction open and with one holding many uncommitted events, each
    alone and while small unrelated transactions commit at every poll (each
    poll then looks for a batch).  The producer stays open throughout, so
    that librdkafka's threads weigh alike on every row (their share is in
    the notes)."""
    set_conf(conn, "outbox.kafka_idle_timeout", "0")
    set_conf(conn, "outbox.enabled", "on")
    # a 100 ms safety poll: enough polls to average over
    set_conf(conn, "outbox.poll_interval", "100ms")
    q(conn, "CREATE TABLE IF NOT EXISTS bench_ticks (n int)")
    time.sleep(3)
    pid = relay_pid(conn)
    poll_ms = int(q1(conn, "SELECT setting FROM pg_settings WHERE name = 'outbox.poll_interval'"))
    polls = OPENTX_SECS * 1000 / poll_ms

    def main_ms():
        with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e6

    def measure(ticking):
        main0, all0 = main_ms(), sum(thread_ms(pid).values())
        end = time.time() + OPENTX_SECS
        while time.time() < end:
            if ticking:
                q(conn, "INSERT INTO bench_ticks VALUES (1)")
            time.sleep(poll_ms / 1000)
        return (main_ms() - main0) / polls, (sum(thread_ms(pid).values()) - all0) / polls

    def note(m):
        return f"all threads {m[1]:.2f} ms"

    free = measure(False)
    row("opentx", f"relay thread CPU per poll, no transaction open ({OPENTX_SECS} s)",
        f"{free[0]:.3f}", "ms", "", note(free))
    free_ticking = measure(True)
    row("opentx", "same, other transactions committing at every poll", f"{free_ticking[0]:.3f}", "ms",
        "", note(free_ticking) + "; each poll then looks for a batch")
    holder = psycopg2.connect(conn.dsn)
    hc = holder.cursor()
    hc.execute(f"""SELECT count(outbox.emit('opentx', mod(g, 100)::text, 'opentx.e',
                      jsonb_build_object('n', g, 'pad', '{PAD}')))
                    FROM generate_series(1, {BIGTX_EVENTS}) g""")
    time.sleep(2)
    held = measure(False)
    row("opentx", f"relay thread CPU per poll, {BIGTX_EVENTS:,} uncommitted events open", f"{held[0]:.3f}",
        "ms", f"{held[0] / free[0]:.2f}" if free[0] > 0 else "", note(held) + "; ratio to none open")
    ticking = measure(True)
    row("opentx", f"{BIGTX_EVENTS:,} open, other transactions committing at every poll", f"{ticking[0]:.3f}",
        "ms", f"{ticking[0] / free_ticking[0]:.2f}" if free_ticking[0] > 0 else "",
        note(ticking) + "; ratio to the same with none open")
    holder.rollback()
    holder.close()
    q(conn, "DROP TABLE bench_ticks")
    set_conf(conn, "outbox.poll_interval", "1s")
    q(conn, "ALTER SYSTEM RESET outbox.kafka_idle_timeout")
    set_conf(conn, "outbox.enabled", "off")


# --------------------------------------------------------------- held xmin

def bench_held_xmin(conn):
    """Drain with no open transaction, with one held open, and without again
    (the mean of the two free runs is the baseline: the table and autovacuum
    change between runs)."""
    def one(held):
        q(conn, "VACUUM ANALYZE outbox.events")
        holder = None
        if held:
            holder = psycopg2.connect(conn.dsn)
            hc = holder.cursor()
            hc.execute("SELECT pg_current_xact_id()")  # holds an xid and the xmin
        make_backlog(conn, HELD_BACKLOG, "held")
        rate = drain_outbox(conn, HELD_BACKLOG)
        if holder is not None:
            holder.rollback()
            holder.close()
        return rate

    free1 = one(False)
    held = one(True)
    free2 = one(False)
    free = (free1 + free2) / 2
    row("held xmin", f"drain {HELD_BACKLOG:,} events, no open transaction (mean of 2)", fmt(free), "ev/s",
        "", f"{free1:,.0f} and {free2:,.0f}")
    row("held xmin", f"drain {HELD_BACKLOG:,} events, one transaction held open", fmt(held), "ev/s",
        f"{held / free:.2f}")


# ---------------------------------------------------------------- debezium

DBZ_TOOL = os.path.join(ROOT, "test/debezium/debezium")
APACHE_TOOL = os.path.join(ROOT, "test/kafka/apache")
DBZ_BACKLOG = 20_000 if SMOKE else 200_000 if QUICK else 1_000_000
DBZ_KILL_BACKLOG = max(20_000, DBZ_BACKLOG // 5)
DBZ_HELD_BACKLOG = HELD_BACKLOG
COMPAT_EVENTS = 2_000 if SMOKE else 10_000
# Debezium's outbox table, the shape its documentation prescribes
DBZ_TABLE = """
    CREATE SCHEMA dbz;
    CREATE TABLE dbz.outbox (
        id            uuid PRIMARY KEY,
        aggregatetype varchar(255) NOT NULL,
        aggregateid   varchar(255) NOT NULL,
        type          varchar(255) NOT NULL,
        payload       jsonb
    );
"""


def tool(*args, timeout=300):
    return subprocess.run([DBZ_TOOL, "consumer", *args], check=True, capture_output=True,
                          text=True, timeout=timeout).stdout


class Watch:
    """Messages written to a topic from now on, as (epoch s, count) steps."""

    def __init__(self, boot, topic, target, secs):
        self.steps = []
        self.proc = subprocess.Popen([DBZ_TOOL, "consumer", "watch", boot, topic, str(target), str(secs)],
                                     stdout=subprocess.PIPE, text=True)
        self.first = self.proc.stdout.readline()   # "T 0": the start is known
        self.thread = threading.Thread(target=self.read, daemon=True)
        self.thread.start()

    def read(self):
        for line in self.proc.stdout:
            ms, n = line.split()
            self.steps.append((int(ms) / 1000, int(n)))

    def count(self):
        return self.steps[-1][1] if self.steps else 0

    def wait_count(self, n, timeout):
        end = time.time() + timeout
        while self.count() < n and time.time() < end:
            time.sleep(0.01)
        return self.count() >= n

    def finish(self, timeout):
        self.proc.wait(timeout)
        self.thread.join(5)

    def rate(self, n):
        """events/s from the first message to the n-th; and the first's time"""
        t_first = next(t for t, c in self.steps if c > 0)
        t_last = next(t for t, c in self.steps if c >= n)
        return n / max(t_last - t_first, 1e-3), t_first

    def resumed_after(self, t_kill):
        """the end of the longest pause in writes within 120 s after t_kill
        (acknowledgements in flight can still land just after the kill)"""
        ts = [t_kill] + [t for t, c in self.steps if t_kill < t < t_kill + 120]
        if len(ts) < 2:
            return float("nan")
        return max(zip(ts, ts[1:]), key=lambda p: p[1] - p[0])[1]


class Debezium:
    def __init__(self, server, boot):
        self.dir = tempfile.mkdtemp(prefix="outbox-debezium.")
        self.server, self.boot, self.pid = server, boot, None

    def start(self, *props):
        out = subprocess.run([DBZ_TOOL, "start", self.dir, str(self.server.port), "bench", "dbz.outbox",
                              self.boot, *props], check=True, capture_output=True, text=True).stdout
        self.pid = int(out.split()[-1])
        return time.time()

    def wait_streaming(self, conn, timeout=120):
        end = time.time() + timeout
        while time.time() < end:
            if q(conn, "SELECT 1 FROM pg_replication_slots WHERE slot_name = 'debezium' AND active"):
                return
            if self.pid and not os.path.exists(f"/proc/{self.pid}"):
                log = open(os.path.join(self.dir, "debezium.out")).read()[-1500:]
                log += "".join(re.findall(r'"level":"ERROR","message":"[^"]*', open(os.path.join(self.dir, "debezium.log")).read())[-3:])
                raise RuntimeError(f"Debezium exited: {log}")
            time.sleep(0.2)
        raise RuntimeError("Debezium did not start streaming")

    def stop(self):
        subprocess.run([DBZ_TOOL, "stop", self.dir], check=True)
        self.pid = None

    def kill(self):
        os.kill(self.pid, signal.SIGKILL)
        t = time.time()
        subprocess.run([DBZ_TOOL, "kill", self.dir], check=True)
        self.pid = None
        return t

    def cleanup(self):
        if self.pid:
            self.stop()
        # OUTBOX_BENCH_KEEP=1 keeps Debezium's directory (its logs) for a look
        if not os.environ.get("OUTBOX_BENCH_KEEP"):
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            print(f"  (Debezium's directory kept: {self.dir})", flush=True)


def dbz_backlog(conn, n, agg_type):
    """n rows in Debezium's table, in transactions of 50,000, the payload of
    make_backlog()"""
    done = 0
    while done < n:
        k = min(50_000, n - done)
        q(conn, """INSERT INTO dbz.outbox (id, aggregatetype, aggregateid, type, payload)
                   SELECT gen_random_uuid(), %s, (g %% %s)::text, 'account.updated',
                          jsonb_build_object('account', g %% %s, 'status', 'updated', 'amount', g, 'pad', %s)
                     FROM generate_series(%s, %s) g""",
          agg_type, AGGREGATES, AGGREGATES, PAD, done, done + k - 1)
        done += k


def settle(boot, topic, n, timeout=600):
    """the topic's message count once it has reached n and stopped growing"""
    last, end = -1, time.time() + timeout
    while time.time() < end:
        c = int(tool("count", boot, topic))
        if c >= n and c == last:
            return c
        last = c
        time.sleep(2)
    return last


def relay_catch_up(conn):
    set_conf(conn, "outbox.enabled", "on")
    wait_published(conn, q1(conn, "SELECT count(*) FROM outbox.events"))


def ms3(lat):
    return f"{pct(lat, 50):.1f}/{pct(lat, 95):.1f}/{pct(lat, 99):.1f}"


def dbz_latency(boot, topic, load, secs):
    proc = subprocess.Popen([DBZ_TOOL, "consumer", "latency", boot, topic, str(secs + 6)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while "ready" not in proc.stderr.readline():
        if proc.poll() is not None:
            raise RuntimeError("latency consumer failed")
    time.sleep(1)
    load()
    out, _ = proc.communicate(timeout=secs + 60)
    return sorted(float(x) for x in out.split())


def bench_debezium(server, conn):
    kdir = tempfile.mkdtemp(prefix="outbox-apache.")
    boot = subprocess.run([APACHE_TOOL, "up", kdir, "3"], check=True, capture_output=True,
                          text=True).stdout.strip().splitlines()[-1]
    mock = q1(conn, "SHOW outbox.kafka_brokers")
    dbz = Debezium(server, boot)
    S = "debezium"
    try:
        set_conf(conn, "outbox.kafka_brokers", boot)
        q(conn, DBZ_TABLE)
        tool("topics", boot, "3", *[f"outbox.event.{t}" for t in
             ("rdrain", "ddrain", "rtick", "dtick", "rkill", "dkill", "rheld", "dheld",
              "dprobe", "daccount", "compat", "compat2")])
        dbz_version = subprocess.run([DBZ_TOOL, "version"], check=True, capture_output=True,
                                     text=True).stdout.strip()
        print(f"  (Apache Kafka 3.9.1, 3 brokers: {boot}; Debezium Server {dbz_version})", flush=True)
        KAFKA["debezium"] = ("Apache Kafka 3.9.1 (test/kafka/apache), 3 brokers on the same machine; "
                             f"Debezium Server {dbz_version}")
        dbz.start()
        dbz.wait_streaming(conn)
        w = Watch(boot, "outbox.event.dprobe", 1, 120)
        q(conn, "INSERT INTO dbz.outbox VALUES (gen_random_uuid(), 'dprobe', '1', 'probe', '{}')")
        w.finish(130)
        dbz.stop()
        set_conf(conn, "outbox.enabled", "off")

        # -- emit cost: both publishers stopped, wal_level = logical
        make_accounts(conn)
        payload = json.dumps({"account": 1, "status": "updated", "amount": 12345, "pad": PAD})
        upd = "\\set aid random(1, 10000)\nBEGIN;\nUPDATE b.accounts SET version = version + 1 WHERE id = :aid;\n"
        scripts = {
            "emit": upd + f"SELECT outbox.emit('account', :aid::text, 'account.updated', '{payload}');\nEND;\n",
            "insert": upd + "INSERT INTO dbz.outbox (id, aggregatetype, aggregateid, type, payload) VALUES "
                      f"(gen_random_uuid(), 'daccount', :aid::text, 'account.updated', '{payload}');\nEND;\n"}
        counts = {"emit": "SELECT count(*) FROM outbox.events", "insert": "SELECT count(*) FROM dbz.outbox"}

        def case(k, seq=None):
            def run():
                if seq is not None:
                    set_conf(conn, "outbox.aggregate_sequence", seq)
                n0, lsn0 = q1(conn, counts[k]), q1(conn, "SELECT pg_current_wal_lsn()")
                tps, p50, p99 = pgbench(server, scripts[k], EMIT_SECS, 8)
                wal = q1(conn, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", lsn0)
                return tps, p50, p99, float(wal) / max(1, q1(conn, counts[k]) - n0)
            return run
        res = alternate({"insert": case("insert"), "on": case("emit", "on"), "off": case("emit", "off")})
        set_conf(conn, "outbox.aggregate_sequence", "on")
        med = {k: [median([r[i] for r in v]) for i in range(4)] for k, v in res.items()}
        itps, _, ip99, iwal = med["insert"]
        row(S, "Debezium: UPDATE + INSERT into its outbox table TPS", fmt(itps), "tps", "",
            f"p99 {ip99:.2f} ms; median of {EMIT_ROUNDS} rounds of {EMIT_SECS} s, 8 clients, publishers stopped")
        for seq, what in (("on", "the default: aggregate_sequence on"),
                          ("off", "aggregate_sequence off: no seq, as Debezium has none")):
            etps, _, ep99, _ = med[seq]
            mid, lo, hi = round_ratios(res[seq], res["insert"])
            row(S, f"outbox vs Debezium: emit TPS (UPDATE + emit(), sequence {seq})", fmt(etps), "tps",
                f"{mid:.2f}", f"{what}; rounds {lo:.2f}..{hi:.2f}; p99 {ep99:.2f} ms vs {ip99:.2f} ms ({ep99 / ip99:.2f})")
        for seq in ("on", "off"):
            ewal = med[seq][3]
            row(S, f"outbox vs Debezium: WAL bytes per event (sequence {seq})", fmt(ewal), "bytes",
                f"{ewal / iwal:.2f}", f"{iwal:,.0f} for Debezium's INSERT; each with its UPDATE")
        q(conn, "DROP SCHEMA b CASCADE")
        relay_catch_up(conn)
        set_conf(conn, "outbox.enabled", "off")
        n = q1(conn, "SELECT count(*) FROM dbz.outbox WHERE aggregatetype = 'daccount'")
        w = Watch(boot, "outbox.event.daccount", n, 600)
        dbz.start()
        w.finish(700)

        # -- drain
        dbz.stop()
        make_backlog(conn, DBZ_BACKLOG, "rdrain")
        q(conn, "VACUUM ANALYZE outbox.events")
        w = Watch(boot, "outbox.event.rdrain", DBZ_BACKLOG, 1800)
        t0 = time.time()
        set_conf(conn, "outbox.enabled", "on")
        w.finish(1900)
        ours, t_first = w.rate(DBZ_BACKLOG)
        set_conf(conn, "outbox.enabled", "off")
        dbz_backlog(conn, DBZ_BACKLOG, "ddrain")
        w = Watch(boot, "outbox.event.ddrain", DBZ_BACKLOG, 3600)
        d0 = dbz.start()
        w.finish(3700)
        theirs, d_first = w.rate(DBZ_BACKLOG)
        row(S, f"Debezium drain, {DBZ_BACKLOG:,} events into Apache Kafka", fmt(theirs), "ev/s", "",
            f"first to last message; its first came {d_first - d0:.1f} s after the start")
        row(S, "outbox vs Debezium: drain", fmt(ours), "ev/s", f"{ours / theirs:.2f}",
            f"relay's first message {t_first - t0:.2f} s after enabling")
        # the relay's own figure on the mock cluster, same backlog, same run
        set_conf(conn, "outbox.kafka_brokers", mock)
        make_backlog(conn, DBZ_BACKLOG, "mdrain")
        q(conn, "VACUUM ANALYZE outbox.events")
        mrate = drain_outbox(conn, DBZ_BACKLOG)
        set_conf(conn, "outbox.kafka_brokers", boot)
        row(S, f"outbox drain, Apache Kafka vs mock cluster", fmt(ours), "ev/s", f"{ours / mrate:.2f}",
            f"mock cluster: {mrate:,.0f} ev/s (enable to last acknowledgement)")

        # -- latency, the same consumer for both; one publisher at a time
        dbz.stop()
        q(conn, "VACUUM ANALYZE outbox.events")
        q(conn, "VACUUM ANALYZE dbz.outbox")
        half = max(int(min(ours, theirs) / 2), 100)
        per_txn = max(1, half // 1000)
        tstamp = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
        r_tick = ("SELECT outbox.emit('rtick', (:client_id * 100000 + (random() * 10000)::int)::text, 'tick', "
                  f"jsonb_build_object('t', {tstamp}, 'pad', '{PAD}')) FROM generate_series(1, :n);\n")
        d_tick = ("INSERT INTO dbz.outbox (id, aggregatetype, aggregateid, type, payload) "
                  "SELECT gen_random_uuid(), 'dtick', (random() * 10000)::int::text, 'tick', "
                  f"jsonb_build_object('t', {tstamp}, 'pad', '{PAD}') FROM generate_series(1, :n);\n")
        loads = (("100 ev/s", 100, 1), (f"{half:,} ev/s (half the slower drain)", half // per_txn, per_txn))
        for label, rate, k in loads:
            set_conf(conn, "outbox.enabled", "on")
            time.sleep(2)
            # 3 s of the same load first: a fresh JVM (and relay) warms up
            pgbench(server, f"\\set n {k}\n" + r_tick, 3, 4, rate=rate)
            mine = dbz_latency(boot, "outbox.event.rtick",
                               lambda: pgbench(server, f"\\set n {k}\n" + r_tick, LAT_SECS, 4, rate=rate),
                               LAT_SECS)
            set_conf(conn, "outbox.enabled", "off")
            dbz.start()
            dbz.wait_streaming(conn)
            time.sleep(3)
            pgbench(server, f"\\set n {k}\n" + d_tick, 3, 4, rate=rate)
            other = dbz_latency(boot, "outbox.event.dtick",
                                lambda: pgbench(server, f"\\set n {k}\n" + d_tick, LAT_SECS, 4, rate=rate),
                                LAT_SECS)
            dbz.stop()
            row(S, f"Debezium p50/p95/p99 at {label}", ms3(other), "ms", "",
                f"{len(other)} events in {LAT_SECS} s")
            row(S, f"outbox vs Debezium: p50 latency at {label}", ms3(mine), "ms",
                f"{pct(mine, 50) / pct(other, 50):.2f}", f"{len(mine)} events; ratio of p50")

        # the relay's own latency, Apache Kafka beside the mock cluster, the
        # same loads, both read by the same kcat consumer as the latency
        # section's (a short fetch wait, which the mock cluster always waits
        # out)
        set_conf(conn, "outbox.enabled", "on")
        for label, rate, k in loads:
            lat = {}
            for name, brokers in (("apache", boot), ("mock", mock)):
                set_conf(conn, "outbox.kafka_brokers", brokers)
                pgbench(server, f"\\set n {k}\n" + r_tick, 3, 4, rate=rate)
                lat[name] = latency_run(server, brokers, "outbox.event.rtick", f"\\set n {k}\n" + r_tick,
                                        LAT_SECS, rate)
            row(S, f"outbox p50/p95/p99 at {label}, Apache Kafka vs mock cluster", ms3(lat["apache"]), "ms",
                f"{pct(lat['apache'], 50) / pct(lat['mock'], 50):.2f}",
                f"mock cluster {ms3(lat['mock'])} ms; {len(lat['apache'])} and {len(lat['mock'])} events, read by kcat")
        set_conf(conn, "outbox.kafka_brokers", boot)
        set_conf(conn, "outbox.enabled", "off")

        # -- idle: each publisher alone over the same idle time; the relay
        # with its producer kept open, then closed as by default after
        # outbox.kafka_idle_timeout
        set_conf(conn, "outbox.kafka_idle_timeout", "0")
        set_conf(conn, "outbox.enabled", "on")
        set_conf(conn, "autovacuum", "off")
        time.sleep(5)
        hz = os.sysconf("SC_CLK_TCK")

        def idle(pid):
            """the JVM's CPU from stat (its threads come and go), the relay's
            from schedstat (finer; its threads stay over each minute)"""
            q(conn, "CHECKPOINT")
            lsn0, c0, t0 = q1(conn, "SELECT pg_current_wal_lsn()"), cpu_ticks(pid), thread_ms(pid)
            time.sleep(IDLE_SECS)
            t1 = thread_ms(pid)
            cpu = (sum(t1[n] - t0.get(n, 0) for n in t1) if pid != dbz.pid
                   else (cpu_ticks(pid) - c0) * 1000 / hz)
            return cpu, q1(conn, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", lsn0)
        rpid = relay_pid(conn)
        r_cpu, r_wal = idle(rpid)
        q(conn, "ALTER SYSTEM RESET outbox.kafka_idle_timeout")
        q(conn, "SELECT pg_reload_conf()")
        t0 = time.time()
        while threads(rpid) > 1 and time.time() - t0 < 300:
            time.sleep(0.2)
        rc_cpu, rc_wal = idle(rpid)
        set_conf(conn, "outbox.enabled", "off")
        dbz.start()
        dbz.wait_streaming(conn)
        time.sleep(10)
        d_cpu, d_wal = idle(dbz.pid)
        set_conf(conn, "autovacuum", "on")
        row(S, f"Debezium CPU over {IDLE_SECS} s idle (the JVM)", f"{d_cpu:.0f}", "ms", "",
            f"WAL written meanwhile {d_wal:,.0f} bytes")
        row(S, f"outbox vs Debezium: idle CPU ({IDLE_SECS} s), producer open", f"{r_cpu:.1f}", "ms",
            f"{r_cpu / d_cpu:.3f}" if d_cpu else "",
            f"outbox.kafka_idle_timeout = 0; WAL written meanwhile {r_wal:,.0f} bytes")
        row(S, f"outbox vs Debezium: idle CPU ({IDLE_SECS} s), producer closed", f"{rc_cpu:.1f}", "ms",
            f"{rc_cpu / d_cpu:.3f}" if d_cpu else "",
            f"the default: closed after outbox.kafka_idle_timeout ({q1(conn, 'SHOW outbox.kafka_idle_timeout')});"
            f" WAL written meanwhile {rc_wal:,.0f} bytes")

        # -- kill -9 mid-drain; Debezium is started again at once, the relay
        # by the postmaster (its death is a crash restart of the server)
        dbz.stop()
        n = DBZ_KILL_BACKLOG
        make_backlog(conn, n, "rkill")
        w = Watch(boot, "outbox.event.rkill", n, 1800)
        set_conf(conn, "outbox.enabled", "on")
        w.wait_count(n // 2, 1800)
        t_kill = time.time()
        os.kill(relay_pid(conn), signal.SIGKILL)
        w.finish(1900)
        r_resume = w.resumed_after(t_kill) - t_kill
        w_r, t_kill_r = w, t_kill
        time.sleep(3)
        for _ in range(100):
            try:
                conn = server.connect()
                q(conn, "SELECT 1")
                break
            except psycopg2.Error:
                time.sleep(0.2)
        r_resent = settle(boot, "outbox.event.rkill", n) - n
        set_conf(conn, "outbox.enabled", "off")
        dbz_backlog(conn, n, "dkill")
        w = Watch(boot, "outbox.event.dkill", n, 1800)
        dbz.start()
        w.wait_count(n // 2, 1800)
        t_kill = dbz.kill()
        dbz.start()
        w.finish(1900)
        d_resume = w.resumed_after(t_kill) - t_kill
        d_resent = settle(boot, "outbox.event.dkill", n) - n

        def late(watch, t):
            # a drain faster than the kill lands (a small backlog): the
            # watch saw all n before the kill and ended, no resumption seen
            seen = max((c for ts, c in watch.steps if ts <= t), default=0)
            return (f"no message seen after the kill ({seen:,} of {n:,} before it"
                    + (": the drain had ended)" if seen >= n else ")"))
        d_late, r_late = late(w, t_kill), late(w_r, t_kill_r)
        row(S, f"Debezium kill -9 at half of {n:,}: resent", fmt(d_resent), "events", "",
            d_late if math.isnan(d_resume) else f"resumed {d_resume:.1f} s after the kill (restarted at once)")
        row(S, "outbox vs Debezium: kill -9 mid-drain, resent", fmt(r_resent), "events",
            f"{r_resent / d_resent:.3f}" if d_resent else "",
            r_late if math.isnan(r_resume) else
            f"resumed {r_resume:.1f} s after the kill (vs {d_resume:.1f} s: {r_resume / d_resume:.2f})")

        # -- a transaction held open for the whole drain
        dbz.stop()
        holder = psycopg2.connect(server.dsn)
        hc = holder.cursor()
        hc.execute("SELECT pg_current_xact_id()")
        n = DBZ_HELD_BACKLOG
        prog0 = q1(conn, "SELECT pg_total_relation_size('outbox.relay_progress')")
        make_backlog(conn, n, "rheld")
        w = Watch(boot, "outbox.event.rheld", n, 1800)
        set_conf(conn, "outbox.enabled", "on")
        w.finish(1900)
        r_rate, _ = w.rate(n)
        set_conf(conn, "outbox.enabled", "off")
        prog = q1(conn, "SELECT pg_total_relation_size('outbox.relay_progress')") - prog0
        dbz_backlog(conn, n, "dheld")
        w = Watch(boot, "outbox.event.dheld", n, 1800)
        dbz.start()
        w.finish(1900)
        d_rate, _ = w.rate(n)
        time.sleep(2)
        retained = q1(conn, """SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)
                                 FROM pg_replication_slots WHERE slot_name = 'debezium'""")
        holder.rollback()
        holder.close()
        row(S, f"Debezium drain of {n:,}, a transaction held open", fmt(d_rate), "ev/s", "",
            f"WAL retained by its slot at the end: {float(retained) / 2**20:,.0f} MiB")
        row(S, "outbox vs Debezium: drain, transaction held open", fmt(r_rate), "ev/s",
            f"{r_rate / d_rate:.2f}", f"relay's own table (relay_progress) grew {prog / 1024:,.0f} kB; "
            "its events stay until outbox.retention, held or not")

        # -- message compatibility: the same events through both, with
        # Debezium's default header format (json), then with the setting
        # that sends header values as they are
        def compat(agg_type, label):
            m = COMPAT_EVENTS
            topic = f"outbox.event.{agg_type}"
            q(conn, f"""CREATE TABLE bench_compat AS
                        SELECT gen_random_uuid() AS id, (g %% 500)::text AS agg,
                               jsonb_build_object('n', g, 'price', g * 1.25, 'name', 'é ü "q" \\ ' || g,
                                                  'tags', jsonb_build_array('a', g %% 3, null, true),
                                                  'nested', jsonb_build_object('x', g %% 10, 'e', '{{}}'::jsonb))
                                 AS payload
                          FROM generate_series(1, {m}) g""")
            w = Watch(boot, topic, 2 * m, 1800)
            set_conf(conn, "outbox.enabled", "on")
            q(conn, "SELECT count(outbox.emit(%s, agg, 'compat.e', payload, event_id => id)) FROM bench_compat",
              agg_type)
            w.wait_count(m, 600)
            set_conf(conn, "outbox.enabled", "off")
            q(conn, "INSERT INTO dbz.outbox SELECT id, %s, agg, 'compat.e', payload FROM bench_compat", agg_type)
            w.finish(1900)
            out = subprocess.run([APACHE_TOOL, "client", "read", boot, topic], check=True,
                                 capture_output=True, text=True).stdout
            msgs = [json.loads(line) for line in out.splitlines()]
            relay_ids = set(str(r[0]) for r in q(conn, "SELECT id FROM bench_compat"))
            mine, other = {}, {}
            for msg in msgs:
                headers = dict(msg["headers"])
                raw = headers.get("id")
                # the relay's carry event_type; Debezium's only the id, and
                # with clientprovided its own __debezium.context.* headers
                if raw in relay_ids and "event_type" in headers:
                    mine[raw] = msg
                else:
                    # json quotes the UUID; a bare one is not JSON at all
                    try:
                        eid = json.loads(raw)
                    except (TypeError, ValueError):
                        eid = raw
                    other[eid if isinstance(eid, str) else raw] = dict(msg, raw_id=raw)
            fields = {"key": 0, "partition": 0, "value": 0, "id header bytes": 0}
            match = exact = 0
            for eid in relay_ids:
                a, b = mine.get(eid), other.get(eid)
                if a is None or b is None:
                    continue
                ok = True
                for f in ("key", "partition", "value"):
                    if a[f] != b[f]:
                        fields[f] += 1
                        ok = False
                same_bytes = dict(a["headers"])["id"] == b["raw_id"]
                fields["id header bytes"] += not same_bytes
                match += ok
                exact += ok and same_bytes
            missing = m - len(set(mine) & set(other))
            row(S, f"Debezium messages of the {m:,} events found ({label})", fmt(len(other)), "msgs", "",
                f"the relay's {len(mine):,}; both on topic {topic}")
            row(S, f"outbox vs Debezium: message match, id decoded ({label})", f"{100 * match / m:.2f}",
                "%", f"{match / m:.3f}", "topic, key, partition, value, id; mismatches: "
                + ", ".join(f"{k} {v}" for k, v in fields.items()) + f", missing {missing}")
            row(S, f"outbox vs Debezium: message match, id header bytes ({label})", f"{100 * exact / m:.2f}",
                "%", f"{exact / m:.3f}", "the same, and the id header byte for byte")
            q(conn, "DROP TABLE bench_compat")

        compat("compat", "header format json, the default")
        dbz.stop()
        dbz.start("debezium.format.header=clientprovided",
                  "debezium.format.header.class=org.apache.kafka.connect.storage.SimpleHeaderConverter")
        dbz.wait_streaming(conn)
        time.sleep(5)
        compat("compat2", "header format clientprovided, SimpleHeaderConverter")
    finally:
        dbz.cleanup()
        subprocess.run([APACHE_TOOL, "down", kdir], capture_output=True)
        shutil.rmtree(kdir, ignore_errors=True)
        try:
            set_conf(server.connect(), "outbox.kafka_brokers", mock)
        except psycopg2.Error:
            pass


# ------------------------------------------------------------------- inbox

def bench_inbox(server, conn, broker):
    """The consumer side: a subscription in database sink applies what the
    relay of database bench publishes."""
    # The mock cluster keeps about 5 MB per partition and drops the oldest
    # beyond it: 16 partitions hold the whole backlog (about 2 MB each)
    broker.create("outbox.event.sink", 16)
    run_pg([f"{BINDIR}/createdb", "-h", server.dir, "-p", str(server.port), "-U", "postgres", "sink"])
    sink = psycopg2.connect(server.dsn.replace("dbname=bench", "dbname=sink"))
    sink.autocommit = True
    q(sink, "CREATE EXTENSION outbox")
    q(sink, """CREATE TABLE applied (t bigint, applied_at timestamptz DEFAULT clock_timestamp())""")
    q(sink, """CREATE FUNCTION apply(m outbox.inbound_message) RETURNS void LANGUAGE plpgsql AS $$
               BEGIN
                   INSERT INTO public.applied (t) VALUES ((m.payload->>'t')::bigint);
               END $$""")

    # The mock cluster answers a fetch only after its whole wait (Apache
    # Kafka answers as soon as data arrives): a short wait, as kcat's below
    set_conf(conn, "outbox.kafka_config", "reconnect.backoff.max.ms=500;fetch.wait.max.ms=5")

    # 1. a backlog already in Kafka, applied by a new subscription
    set_conf(conn, "outbox.enabled", "on")
    q(conn, "SELECT outbox.emit('sink', '0', 'warm', '{}')")
    base = published(conn)
    q(conn, f"""SELECT outbox.emit('sink', mod(i, {AGGREGATES})::text, 'sunk',
                       jsonb_build_object('t', i, 'pad', '{PAD}'))
                  FROM generate_series(1, {INBOX_BACKLOG}) i""")
    wait_published(conn, base + INBOX_BACKLOG)
    set_conf(conn, "outbox.enabled", "off")
    total = INBOX_BACKLOG + 1
    t0 = time.time()
    q(sink, "SELECT outbox.subscribe('sink', ARRAY['outbox.event.sink'], 'public.apply(outbox.inbound_message)')")
    while q1(sink, "SELECT count(*) FROM applied") < total:
        if time.time() - t0 > 1800:
            raise RuntimeError("the subscription did not apply the backlog")
        time.sleep(0.2)
    wall = time.time() - t0
    first, last = q(sink, "SELECT extract(epoch FROM min(applied_at)), extract(epoch FROM max(applied_at)) FROM applied")[0]
    rate = (total - 1) / float(last - first)
    row("inbox", f"subscription applies {INBOX_BACKLOG:,} messages", fmt(rate), "msg/s",
        f"{rate / 20000:.2f}", f"vs the 20,000/s target; {wall:.1f} s with the group join")

    # 2. the full loop at 100 events/s: commit in bench, row in sink
    q(sink, "TRUNCATE applied")
    set_conf(conn, "outbox.enabled", "on")
    time.sleep(2)
    consumer = Consumer(server_brokers(conn), "outbox.event.sink")
    time.sleep(3)
    tick = ("SELECT outbox.emit('sink', (:client_id * 100000 + (random() * 10000)::int)::text, 'tick', "
            "jsonb_build_object('t', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, "
            f"'pad', '{PAD}'));\n")
    pgbench(server, tick, LAT_SECS, 4, rate=100)
    kafka = consumer.stop()
    time.sleep(1)
    loop = sorted(float(r[0]) for r in q(sink, """
        SELECT extract(epoch FROM applied_at) * 1000 - t / 1000.0 FROM applied WHERE t > 1000000000000"""))
    set_conf(conn, "outbox.enabled", "off")
    set_conf(conn, "outbox.kafka_config", "reconnect.backoff.max.ms=500")
    row("inbox", "full loop p50/p95/p99 at 100 ev/s (commit to row)",
        f"{pct(loop, 50):.1f}/{pct(loop, 95):.1f}/{pct(loop, 99):.1f}", "ms",
        f"{pct(loop, 50) / 20:.2f}", f"p50 vs the 20 ms target; {len(loop)} events")
    row("inbox", "of which commit to Kafka arrival (kcat) p50/p95/p99",
        f"{pct(kafka, 50):.1f}/{pct(kafka, 95):.1f}/{pct(kafka, 99):.1f}", "ms",
        f"{pct(loop, 50) / max(pct(kafka, 50), 0.001):.2f}", "loop p50 / arrival p50")
    st = q(sink, "SELECT state, processed, deduplicated, failed, last_error, lag FROM outbox.subscription_status()") + q(sink, "SELECT * FROM outbox.subscription_lag()") + q(sink, "SELECT * FROM outbox.inbox_offsets")
    if not loop:
        print(f"  inbox: no loop events applied; subscription status {st}", flush=True)
        print(subprocess.run(["tail", "-30", os.path.join(server.dir, "server.log")],
                             capture_output=True, text=True).stdout)
    q(sink, "SELECT outbox.unsubscribe('sink')")
    sink.close()


def server_brokers(conn):
    return q1(conn, "SHOW outbox.kafka_brokers")


# the Kafka each section publishes to, where not the mock cluster
KAFKA = {}
# the charts each section drew, shown beneath its table: (alt text, path
# from docs/)
IMAGES = {}


def main():
    if WRITE_DOCS and SMOKE:
        sys.exit("bench.py: --smoke checks the script; its figures are not for docs/benchmarks.md")
    broker = Broker()
    server = Server(broker.bootstrap, logical="debezium" in SECTIONS)
    ran = []

    def section(name, fn, *args):
        """runs one section, and keeps its rows for the page once it ends"""
        first = len(rows)
        result = fn(*args)
        ran.append((name, KAFKA.get(name, benchdoc.MOCK_KAFKA),
                    time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), rows[first:]))
        return result

    try:
        conn = server.connect()
        q(conn, "CREATE EXTENSION outbox")
        q(conn, "CREATE EXTENSION pg_stat_statements")
        pkglibdir = subprocess.check_output(["pg_config", "--pkglibdir"], text=True).strip()
        facts = {"command": " ".join(["test/bench/run-bench"] + sys.argv[1:]),
                 "commit": benchdoc.commit(ROOT), "machine": benchdoc.machine(),
                 "software": benchdoc.software(q1(conn, "SHOW server_version"), pkglibdir)}
        print(f"machine: {facts['machine']}; {facts['software']}; {benchdoc.MOCK_KAFKA}"
              f"{'; --quick' if QUICK else ''}", flush=True)
        print(f"  {'section':10} {'case':52} {'value':>12} {'unit':8} {'ratio':>8} note")
        if "emit" in SECTIONS:
            section("emit", bench_emit, server, conn)
        if "drain" in SECTIONS:
            drain_rate, best = section("drain", bench_drain, server, conn, broker.bootstrap)
        elif GIVEN_DRAIN:
            drain_rate, best = float(GIVEN_DRAIN[0]), (0, int(GIVEN_DRAIN[1]))
            make_plain_outbox(conn)
        if "drain-kafka" in SECTIONS:
            section("drain-kafka", bench_drain_limits.bench_drain_kafka, sys.modules[__name__], server, conn)
        if "scaling" in SECTIONS:
            section("scaling", bench_drain_limits.bench_scaling, sys.modules[__name__], server, conn,
                    broker.bootstrap)
        if "latency" in SECTIONS:
            section("latency", bench_latency, server, conn, broker.bootstrap, drain_rate, best[1])
        if "idle" in SECTIONS:
            section("idle", bench_idle, conn, broker.bootstrap)
        if "held" in SECTIONS:
            section("held", bench_held_xmin, conn)
        if "bigtx" in SECTIONS:
            section("bigtx", bench_bigtx, conn)
        if "opentx" in SECTIONS:
            section("opentx", bench_opentx, conn)
        if "inbox" in SECTIONS:
            section("inbox", bench_inbox, server, conn, broker)
        if "eos" in SECTIONS:
            section("eos", bench_eos.bench_eos, sys.modules[__name__], server, conn)
        if "avro" in SECTIONS:
            section("avro", bench_avro.bench_avro, sys.modules[__name__], server, conn,
                    broker.bootstrap)
        if "debezium" in SECTIONS:
            section("debezium", bench_debezium, server, conn)
        if "retention" in SECTIONS:
            section("retention", bench_retention.bench_retention, sys.modules[__name__], server, conn)
    finally:
        server.stop()
        broker.stop()
        if WRITE_DOCS and ran:
            print(f"written: {benchdoc.write(ROOT, __doc__, facts, ran, IMAGES)}", flush=True)


if __name__ == "__main__":
    main()
