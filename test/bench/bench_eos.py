"""test/bench/bench_eos.py: the eos section of bench.py (run through
run-bench --sections=eos).

outbox.delivery = exactly_once against at_least_once, on the same 3-broker
Apache Kafka cluster (test/kafka/apache), the same server and the same
events, measured in one run:

- drain: a backlog of 200-byte events over 10,000 aggregates, each mode on
  a topic of its own, twice each in turns (ALO, EOS, EOS, ALO), best kept;
- latency: commit to arrival at 100 events/s, as a kcat consumer reading
  read_committed sees it (in exactly_once an event is readable once its
  page's transaction commits); beside it, the same consumer's figures for
  a bare librdkafka producer sending from memory at 100 messages/s
  (test/bench/bare_producer.c), idempotent and transactional: what Kafka's
  protocol costs with no database, the floor under each mode;
- kill -9 of the relay halfway through a backlog: the messages a
  read_committed consumer finds beyond the backlog (resent copies).

bench.py passes itself in (b): its helpers and settings."""

import os
import signal
import subprocess
import tempfile
import time


def warm(b, conn, agg):
    """one event through the relay, so that its producer is built for the
    mode (transactions initialised, progress topic read) before a measure;
    then paused: a paused relay keeps its producer"""
    b.set_conf(conn, "outbox.enabled", "on")
    target = b.published(conn) + 1
    b.q(conn, f"SELECT outbox.emit('{agg}', 'warm', 'warm', '{{}}')")
    b.wait_published(conn, target)
    b.set_conf(conn, "outbox.enabled", "off")


def drain_once(b, conn, agg):
    """a backlog on the topic of aggregate type agg, published: events/s"""
    warm(b, conn, agg)
    b.make_backlog(conn, b.BACKLOG, agg)
    b.q(conn, "VACUUM ANALYZE outbox.events")
    return b.drain_outbox(conn, b.BACKLOG)


def count_committed(b, boot, topic):
    """messages a read_committed consumer reads in topic (the Java client:
    test/kafka/src/OutboxKafkaTool.java)"""
    out = subprocess.run([b.APACHE_TOOL, "client", "read", boot, topic,
                          "isolation.level=read_committed"], check=True, capture_output=True,
                         text=True, timeout=600).stdout
    return out.count("\n")


def create_topics(b, kdir, boot, topics):
    """the topics, 3 partitions, replication 3, before anything is measured"""
    for t in topics:
        subprocess.run([b.APACHE_TOOL, "tool", kdir, "org.apache.kafka.tools.TopicCommand",
                        "--bootstrap-server", boot, "--create", "--topic", t,
                        "--partitions", "3", "--replication-factor", "3"],
                       check=True, capture_output=True, timeout=120)


def kill_mid_drain(b, server, conn, boot, agg):
    """kill -9 of the relay at half a backlog: copies a read_committed
    consumer reads beyond it"""
    n = b.BACKLOG // 5
    topic = f"outbox.event.{agg}"
    warm(b, conn, agg)
    n0 = count_committed(b, boot, topic)
    b.make_backlog(conn, n, agg)
    b.set_conf(conn, "outbox.enabled", "on")
    start = b.published(conn)
    deadline = time.time() + 600
    while b.published(conn) - start < n // 2 and time.time() < deadline:
        time.sleep(0.01)
    os.kill(b.relay_pid(conn), signal.SIGKILL)
    time.sleep(3)
    for _ in range(100):
        try:
            conn = server.connect()
            b.q(conn, "SELECT 1")
            break
        except Exception:
            time.sleep(0.2)
    last, end = -1, time.time() + 600
    while time.time() < end:
        c = count_committed(b, boot, topic) - n0
        if c >= n and c == last:
            break
        last = c
        time.sleep(2)
    b.set_conf(conn, "outbox.enabled", "off")
    return conn, c - n


def bare_latency(b, boot, topic, mode, marker=None):
    """the floor: test/bench/bare_producer sending {"t": ...} at 100 ev/s
    from memory, with the relay's producer settings (transactional: every
    message due when a transaction begins goes in it, plus one record to
    marker, as the relay sends a page and its progress record), read by the
    same kcat consumer as the relay's events"""
    consumer = b.Consumer(boot, topic)
    time.sleep(3)
    subprocess.run([os.path.join(b.ROOT, "test/bench/bare_producer"), boot, topic, "tick", "100",
                    str(b.LAT_SECS), mode] + ([marker] if marker else []),
                   check=True, capture_output=True, timeout=b.LAT_SECS + 120)
    return consumer.stop()


def bench_eos(b, server, conn):
    kdir = tempfile.mkdtemp(prefix="outbox-apache.")
    boot = subprocess.run([b.APACHE_TOOL, "up", kdir, "3"], check=True, capture_output=True,
                          text=True).stdout.strip().splitlines()[-1]
    mock = b.q1(conn, "SHOW outbox.kafka_brokers")
    S = "eos"
    modes = {"alo": "at_least_once", "eos": "exactly_once"}
    try:
        b.set_conf(conn, "outbox.enabled", "off")
        b.set_conf(conn, "outbox.kafka_brokers", boot)
        create_topics(b, kdir, boot, [f"outbox.event.{m}{k}" for m in modes
                                      for k in ("drain", "tick", "kill")]
                      + ["outbox.event.barealotick", "outbox.event.bareeostick",
                         "outbox.event.baremarker"])
        b.KAFKA[S] = "Apache Kafka 3.9.1 (test/kafka/apache), 3 brokers on the same machine"
        drains = {m: [] for m in modes}
        for m in ("alo", "eos", "eos", "alo"):
            b.set_conf(conn, "outbox.delivery", modes[m])
            drains[m].append(drain_once(b, conn, f"{m}drain"))
        best = {m: max(v) for m, v in drains.items()}
        for m in modes:
            b.row(S, f"{modes[m]}: drain of {b.BACKLOG:,} events", b.fmt(best[m]), "ev/s",
                  f"{best['eos'] / best['alo']:.2f}" if m == "eos" else "",
                  "best of 2 runs" + ("; ratio to at_least_once" if m == "eos" else ""))
        b.set_conf(conn, "outbox.enabled", "on")
        lat = {}
        for m in modes:
            b.set_conf(conn, "outbox.delivery", modes[m])
            tick = (f"SELECT outbox.emit('{m}tick', (:client_id * 100000 + (random() * 10000)::int)::text,"
                    " 'tick', jsonb_build_object('t', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint,"
                    f" 'pad', '{b.PAD}'));\n")
            b.q(conn, f"SELECT outbox.emit('{m}tick', '0', 'tick', '{{}}')")
            time.sleep(2)
            lat[m] = b.latency_run(server, boot, f"outbox.event.{m}tick", tick, b.LAT_SECS, 100)
        bare = {"alo": bare_latency(b, boot, "outbox.event.barealotick", "idempotent"),
                "eos": bare_latency(b, boot, "outbox.event.bareeostick", "transactional",
                                    "outbox.event.baremarker")}
        for m in modes:
            p50, p99 = b.pct(lat[m], 50), b.pct(lat[m], 99)
            ratio = (f"{p99 / b.pct(lat['alo'], 99):.2f}" if m == "eos" else "")
            b.row(S, f"{modes[m]}: p50/p95/p99 at 100 ev/s",
                  f"{p50:.1f}/{b.pct(lat[m], 95):.1f}/{p99:.1f}", "ms", ratio,
                  f"{len(lat[m])} events, read_committed" + ("; ratio of p99" if m == "eos" else ""))
        for m in modes:
            p99 = b.pct(bare[m], 99)
            b.row(S, f"bare librdkafka producer, {'transactional' if m == 'eos' else 'idempotent'}:"
                  " p50/p95/p99 at 100 ev/s",
                  f"{b.pct(bare[m], 50):.1f}/{b.pct(bare[m], 95):.1f}/{p99:.1f}", "ms",
                  f"{b.pct(lat[m], 99) / p99:.2f}",
                  f"{len(bare[m])} messages from memory, no database (test/bench/bare_producer.c);"
                  f" ratio: {modes[m]}'s p99 to this one's")
        b.set_conf(conn, "outbox.enabled", "off")
        resent = {}
        for m in modes:
            b.set_conf(conn, "outbox.delivery", modes[m])
            conn, resent[m] = kill_mid_drain(b, server, conn, boot, f"{m}kill")
            b.row(S, f"{modes[m]}: kill -9 at half of {b.BACKLOG // 5:,}, copies read", b.fmt(resent[m]),
                  "events", "", "what a read_committed consumer reads beyond the backlog")
    finally:
        b.set_conf(conn, "outbox.delivery", "at_least_once")
        b.set_conf(conn, "outbox.kafka_brokers", mock)
        subprocess.run([b.APACHE_TOOL, "down", kdir], capture_output=True)
