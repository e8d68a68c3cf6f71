"""test/bench/bench_avro.py: the avro section of bench.py (run through
run-bench --sections=avro).

The cost of Avro through a schema registry: the drain of the same backlog
(bench.py's 200-byte events over 10,000 aggregates) on the mock cluster,
once as JSON and once encoded by the relay as Avro with a registered
schema (outbox.avro_topics), measured in one run, in turns (JSON, Avro,
Avro, JSON), best of two each.  The registry is the test tool's stand-in
(test/kafka/src/OutboxKafkaTool.java, registry-stand-in): the relay asks
it once per topic, so its speed is not in the figures.

bench.py passes itself in (b): its helpers and settings."""

import json
import socket
import subprocess
import time
import urllib.request

# bench.py's make_backlog payload, as a record
SCHEMA = {"type": "record", "name": "Account", "namespace": "bench", "fields": [
    {"name": "account", "type": "long"}, {"name": "status", "type": "string"},
    {"name": "amount", "type": "long"}, {"name": "pad", "type": "string"}]}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    """the registry stand-in, on loopback"""

    def __init__(self, b):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([b.APACHE_TOOL, "client", "registry-stand-in", str(self.port)],
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        if "listening" not in self.proc.stdout.readline():
            raise RuntimeError("the registry stand-in did not start")

    def register(self, subject, schema):
        req = urllib.request.Request(f"{self.url}/subjects/{subject}/versions", method="POST",
                                     data=json.dumps({"schema": json.dumps(schema)}).encode(),
                                     headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.load(r)["id"]

    def stop(self):
        import os
        import signal
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=30)


def drain(b, conn, agg):
    """a backlog on aggregate type agg's topic, published: events/s"""
    b.set_conf(conn, "outbox.enabled", "on")
    target = b.published(conn) + 1
    b.q(conn, f"SELECT outbox.emit('{agg}', 'warm', 'warm', "
              "'{\"account\": 0, \"status\": \"w\", \"amount\": 0, \"pad\": \"\"}')")
    b.wait_published(conn, target)
    b.set_conf(conn, "outbox.enabled", "off")
    b.make_backlog(conn, b.BACKLOG, agg)
    b.q(conn, "VACUUM ANALYZE outbox.events")
    return b.drain_outbox(conn, b.BACKLOG)


def framed(brokers, topic):
    """whether topic's first message is in the registries' wire format"""
    out = subprocess.run(["kcat", "-b", brokers, "-C", "-t", topic, "-o", "beginning", "-c", "1",
                          "-e", "-q", "-f", "%s"], check=True, capture_output=True,
                         timeout=60).stdout
    return len(out) > 5 and out[0] == 0


def bench_avro(b, server, conn, brokers):
    registry = Registry(b)
    try:
        for agg in ("avro1", "avro2"):
            registry.register(f"outbox.event.{agg}-value", SCHEMA)
        b.set_conf(conn, "outbox.schema_registry_url", registry.url)
        b.set_conf(conn, "outbox.avro_topics", "outbox.event.avro1, outbox.event.avro2")
        json1 = drain(b, conn, "json1")
        avro1 = drain(b, conn, "avro1")
        avro2 = drain(b, conn, "avro2")
        json2 = drain(b, conn, "json2")
        bad = b.q1(conn, "SELECT count(*) FROM outbox.dead_letters")
        if bad:
            raise RuntimeError(f"{bad} events quarantined during the Avro drains")
        if not all(framed(brokers, f"outbox.event.{agg}") for agg in ("avro1", "avro2")) or \
                framed(brokers, "outbox.event.json1"):
            raise RuntimeError("the Avro topics' messages are not framed Avro, or the JSON topic's are")
    finally:
        b.set_conf(conn, "outbox.avro_topics", "")
        registry.stop()
    as_json, as_avro = max(json1, json2), max(avro1, avro2)
    b.row("avro", f"drain as JSON, {b.BACKLOG:,} events", b.fmt(as_json), "ev/s", "",
          "best of 2, in turns with Avro")
    b.row("avro", f"drain as Avro, {b.BACKLOG:,} events", b.fmt(as_avro), "ev/s",
          f"{as_avro / as_json:.2f}", "encoded by the relay; ratio to JSON")
    return as_avro / as_json
