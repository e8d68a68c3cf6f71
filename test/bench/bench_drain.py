"""test/bench/bench_drain.py: the drain's limits and how the drain scales.

The machine's limit for a drain is the lower of two rates, each measured
in the same run as the relay's drain of the same events:

  read limit      PostgreSQL returning the backlog's rows, the relay's
                  columns in the relay's pages (outbox.batch_size rows,
                  keyset by id), to a libpq client that throws them away
                  (test/bench/bare_reader.c)
  producer limit  a bare librdkafka producer (test/bench/bare_producer.c,
                  the relay's producer settings) sending the same messages,
                  with the same keys, values and headers, from memory into
                  the same cluster, each acknowledged

Each of ROUNDS rounds makes a backlog, measures its two limits and then
drains it, so that each drain has limits taken moments before it (on this
machine the limits move by a third between minutes, most on Apache Kafka,
whose brokers share the cores).  "outbox drain / limit" is the median over
the rounds of the round's drain over the lower of its two limits; the
relay's drain and each limit are also shown as the best of the rounds, and
their quotient beside them.
"outbox drain / one-process limit" is the best drain over 1 / (1/read + 1/producer), what
one process that reads and then sends each event could reach if nothing
overlapped (the relay overlaps the acknowledgements of one page with the
reading of the next).
The sections: drain (the mock cluster, in bench.py), drain-kafka (the
3-broker Apache Kafka of test/kafka/apache, and the latency at 100 ev/s
there) and scaling (the drain for payloads of 100 B, 1 kB and 10 kB over
1, 100 and 10,000 aggregates, each with its producer limit).
"""

import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from statistics import median

READER = "test/bench/bare_reader"
PRODUCER = "test/bench/bare_producer"

# the relay's header values, as src/store/store_event.c formats them
MESSAGE_SQL = """
COPY (SELECT {topic}, e.key, e.payload::text, e.event_id::text, e.event_type,
             e.aggregate_type, e.aggregate_id, e.seq::text, e.schema_version::text,
             to_char(e.occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
             e.traceparent, e.tenant, (SELECT o.origin::text FROM outbox.origin o)
        FROM outbox.events e WHERE e.aggregate_type = {agg} ORDER BY e.id) TO STDOUT
"""


def read_limit(b, server, conn, agg):
    """rows/s PostgreSQL returns the backlog of aggregate type agg at"""
    first = b.q1(conn, "SELECT min(id) - 1 FROM outbox.events WHERE aggregate_type = %s", agg)
    page = b.q1(conn, "SHOW outbox.batch_size")
    out = subprocess.run([os.path.join(b.ROOT, READER), server.dsn, page, str(first)],
                         check=True, capture_output=True, text=True, timeout=1800).stdout
    m = re.search(r"read (\d+) in ([0-9.]+) s", out)
    return int(m.group(1)) / float(m.group(2))


def message_file(b, conn, agg, topic):
    """the relay's messages for the backlog of agg, onto topic, in a file"""
    fd, path = tempfile.mkstemp(prefix="outbox-messages.", suffix=".tsv")
    with conn.cursor() as cur, os.fdopen(fd, "w") as f:
        sql = MESSAGE_SQL.format(topic=cur.mogrify("%s", (topic,)).decode(),
                                 agg=cur.mogrify("%s", (agg,)).decode())
        cur.copy_expert(sql, f)
    return path


def producer_limit(b, brokers, path):
    """messages/s a bare producer puts the file's messages into brokers at"""
    out = subprocess.run([os.path.join(b.ROOT, PRODUCER), brokers, "-", "messages", path],
                         check=True, capture_output=True, text=True, timeout=1800).stdout
    m = re.search(r"produced (\d+) in ([0-9.]+) s, 0 failed", out)
    if m is None:
        raise RuntimeError(f"bare_producer: {out.strip()}")
    return int(m.group(1)) / float(m.group(2))


ROUNDS = 3


def rounds(b, server, conn, brokers, aggs, topic):
    """for each aggregate type of aggs, one after the other: a backlog of
    b.BACKLOG events, its read limit, its producer limit (onto topic) and
    its drain from a paused relay; returns [(drain, read, producer)].  With
    --profile, perf samples the last drain."""
    out = []
    for i, agg in enumerate(aggs):
        b.make_backlog(conn, b.BACKLOG, agg)
        b.q(conn, "VACUUM ANALYZE outbox.events")
        path = message_file(b, conn, agg, topic)
        try:
            rd = read_limit(b, server, conn, agg)
            pr = producer_limit(b, brokers, path)
        finally:
            os.unlink(path)
        prof = profile_start(b, conn) if i == len(aggs) - 1 else None
        out.append((b.drain_outbox(conn, b.BACKLOG), rd, pr))
        profile_stop(b, prof)
    return out


def profile_start(b, conn):
    """with --profile: perf samples the relay process (every thread) until
    profile_stop; the report goes to test/bench/out/drain-profile.txt"""
    if "--profile" not in sys.argv:
        return None
    os.makedirs(os.path.join(b.ROOT, "test/bench/out"), exist_ok=True)
    data = os.path.join(b.ROOT, "test/bench/out/drain-perf.data")
    proc = subprocess.Popen(["perf", "record", "-F", "499", "--call-graph", "dwarf,8192", "-o", data, "-p",
                             str(b.relay_pid(conn))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)
    return proc, data


def profile_stop(b, prof):
    if prof is None:
        return
    proc, data = prof
    proc.send_signal(signal.SIGINT)
    proc.wait(60)
    out = os.path.join(b.ROOT, "test/bench/out/drain-profile.txt")
    with open(out, "w") as f:
        for sort in ("comm", "comm,dso", "comm,dso,sym"):
            f.write(f"==== perf report --sort {sort}\n")
            f.flush()
            subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", sort,
                            "--stdio", "-g", "none", "--percent-limit", "0.3"],
                           stdout=f, stderr=subprocess.DEVNULL)
    print(f"  (profile of the relay: {out})", flush=True)


def limit_rows(b, section, n, runs, kafka):
    """the relay's drain, the two limits, and the drain as a share of the
    lower: each round's, their median, and best over best; returns the
    best drain"""
    k = len(runs)
    ours = max(r[0] for r in runs)
    rd = max(r[1] for r in runs)
    pr = max(r[2] for r in runs)
    b.row(section, f"outbox relay, {n:,} events", b.fmt(ours), "ev/s", "",
          f"best of {k} backlogs, each drained from a paused relay")
    b.row(section, f"read limit: PostgreSQL returns the {n:,} rows", b.fmt(rd), "rows/s", "",
          "the relay's columns and pages, to a libpq client that discards them"
          f" (test/bench/bare_reader.c); best of {k}")
    b.row(section, f"producer limit: bare librdkafka, the same {n:,} messages", b.fmt(pr), "msg/s", "",
          f"keys, values and headers from memory into {kafka}, the relay's producer settings"
          f" (test/bench/bare_producer.c); best of {k}")
    each = sorted(r[0] / min(r[1], r[2]) for r in runs)
    lows = {"read" if r[1] < r[2] else "producer" for r in runs}
    b.row(section, "outbox drain / limit", b.fmt(median(r[0] for r in runs)), "ev/s",
          f"{median(each):.2f}",
          f"median over the {k} rounds of the drain over the lower limit ({' or '.join(sorted(lows))})"
          f" measured just before it; the rounds: {', '.join(f'{x:.2f}' for x in each)}")
    low = "read" if rd < pr else "producer"
    b.row(section, "outbox drain / limit, best over best", b.fmt(ours), "ev/s",
          f"{ours / min(rd, pr):.2f}", f"the best drain over the best of the lower limit ({low})")
    serial = 1 / (1 / rd + 1 / pr)
    b.row(section, "outbox drain / one-process limit", b.fmt(ours), "ev/s", f"{ours / serial:.2f}",
          f"ratio to {b.fmt(serial)} ev/s, one read and one send per event done one after"
          " the other (1 / (1/read + 1/producer)): the relay reads and sends in one process")
    return ours


# ------------------------------------------------------------ drain-kafka

def bench_drain_kafka(b, server, conn):
    """the relay's drain, its limits and its latency on Apache Kafka"""
    import bench_eos
    S = "drain-kafka"
    kdir = tempfile.mkdtemp(prefix="outbox-apache.")
    boot = subprocess.run([b.APACHE_TOOL, "up", kdir, "3"], check=True, capture_output=True,
                          text=True).stdout.strip().splitlines()[-1]
    mock = b.q1(conn, "SHOW outbox.kafka_brokers")
    try:
        b.set_conf(conn, "outbox.enabled", "off")
        b.set_conf(conn, "outbox.kafka_brokers", boot)
        bench_eos.create_topics(b, kdir, boot, ["outbox.event.kdrain", "outbox.event.kdrain2",
                                                "outbox.event.kbare", "outbox.event.ktick"])
        b.KAFKA[S] = "Apache Kafka 3.9.1 (test/kafka/apache), 3 brokers on the same machine"
        bench_eos.warm(b, conn, "kdrain")
        runs = rounds(b, server, conn, boot, [f"kdrain{i}" for i in range(ROUNDS)],
                      "outbox.event.kbare")
        limit_rows(b, S, b.BACKLOG, runs, "the same cluster")
        b.set_conf(conn, "outbox.enabled", "on")
        tick = ("SELECT outbox.emit('ktick', (:client_id * 100000 + (random() * 10000)::int)::text,"
                " 'tick', jsonb_build_object('t', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint,"
                f" 'c', (:client_id)::int, 'pad', '{b.PAD}'));\n")
        b.q(conn, "SELECT outbox.emit('ktick', '0', 'tick', '{}')")
        time.sleep(2)
        commit = []
        lat = b.latency_run(server, boot, "outbox.event.ktick", tick, b.LAT_SECS, 100, commit=commit)
        b.row(S, "outbox: p50/p95/p99 at 100 ev/s", b.ms3(lat), "ms", "",
              f"{len(lat)} events; from the emit's stamp inside the transaction to arrival at"
              " a kcat consumer")
        b.row(S, "outbox: p50/p95/p99 at 100 ev/s, from the commit",
              b.ms3(commit), "ms", "",
              f"the same {len(commit)} events, from the moment the client's COMMIT returned")
        b.set_conf(conn, "outbox.enabled", "off")
    finally:
        b.set_conf(conn, "outbox.kafka_brokers", mock)
        subprocess.run([b.APACHE_TOOL, "down", kdir], capture_output=True)


# ---------------------------------------------------------------- scaling

PAYLOADS = (100, 1000, 10000)
AGGREGATES = (1, 100, 10000)


def scaling_count(b, payload):
    """events per case: about 200 MB of payload at most"""
    if b.SMOKE:
        return 2_000
    n = 200_000 if payload <= 1000 else 20_000
    return n // 4 if b.QUICK else n


def backlog(b, conn, agg, n, payload, aggregates):
    """n events of about payload bytes of JSON over aggregates ids; the pad
    is random hex, which pglz does not shrink, as real payloads of that size
    seldom shrink much"""
    rnd = random.Random(payload * 7 + aggregates)
    pad = "".join(rnd.choice("0123456789abcdef") for _ in range(max(0, payload - 45)))
    done = 0
    while done < n:
        k = min(20_000, n - done)
        b.q(conn, """SELECT count(outbox.emit(%s, (g %% %s)::text, 'account.updated',
                            jsonb_build_object('account', g %% %s, 'amount', g, 'pad', %s)))
                     FROM generate_series(%s, %s) g""",
            agg, aggregates, aggregates, pad, done, done + k - 1)
        done += k


def bench_scaling(b, server, conn, brokers):
    """the relay's drain and the producer limit over payload size and
    aggregate count, on the mock cluster"""
    S = "scaling"
    for payload in PAYLOADS:
        for aggs in AGGREGATES:
            agg = f"s{payload}a{aggs}"
            n = scaling_count(b, payload)
            backlog(b, conn, agg, n, payload, aggs)
            b.q(conn, "VACUUM ANALYZE outbox.events")
            size = b.q1(conn, "SELECT avg(octet_length(payload::text))::int FROM outbox.events"
                        " WHERE aggregate_type = %s", agg)
            path = message_file(b, conn, agg, f"outbox.event.{agg}bare")
            try:
                pr = max(producer_limit(b, brokers, path) for _ in range(2))
            finally:
                os.unlink(path)
            ours = b.drain_outbox(conn, n)
            # best of 2, as the producer limit
            backlog(b, conn, agg + "b", n, payload, aggs)
            b.q(conn, "VACUUM ANALYZE outbox.events")
            ours = max(ours, b.drain_outbox(conn, n))
            b.row(S, f"payload {payload:,} B, {aggs:,} aggregate{'s' if aggs > 1 else ''}",
                  b.fmt(ours), "ev/s", f"{ours / pr:.2f}",
                  f"{n:,} events of {size:,} B JSON, {ours * size / 1e6:.0f} MB/s of payload;"
                  f" ratio to the producer limit ({b.fmt(pr)} msg/s); each best of 2")
    compression(b, conn)


def compression(b, conn):
    """the 1 kB, 10,000-aggregate drain with librdkafka compressing, as
    outbox.kafka_config may ask (compression.type): drains and the relay's
    CPU per event, the codecs taken in turn, twice"""
    config = b.q1(conn, "SHOW outbox.kafka_config")
    n = scaling_count(b, 1000) // 2
    res = {c: [] for c in ("none", "lz4", "zstd")}
    try:
        for r in range(2):
            for codec in (res if r == 0 else list(res)[::-1]):
                agg = f"s1000{codec}{r}"
                b.set_conf(conn, "outbox.kafka_config", f"{config};compression.type={codec}")
                backlog(b, conn, agg, n, 1000, 10000)
                b.q(conn, "VACUUM ANALYZE outbox.events")
                pid = b.relay_pid(conn)
                t0 = b.cpu_ticks(pid)
                rate = b.drain_outbox(conn, n)
                cpu_us = (b.cpu_ticks(pid) - t0) * 1e6 / os.sysconf("SC_CLK_TCK") / n
                res[codec].append((rate, cpu_us))
    finally:
        b.set_conf(conn, "outbox.kafka_config", config)
    base = max(r for r, _ in res["none"])
    base_cpu = min(c for _, c in res["none"])
    for codec, runs in res.items():
        rate, cpu = max(r for r, _ in runs), min(c for _, c in runs)
        b.row("scaling", f"payload 1,000 B, 10,000 aggregates, compression.type={codec}",
              b.fmt(rate), "ev/s", f"{rate / base:.2f}",
              f"{n:,} events, best of 2; relay CPU {cpu:.1f} us/event ({cpu / base_cpu:.2f} of none);"
              " ratio to none; the payload's pad is random hex digits")
