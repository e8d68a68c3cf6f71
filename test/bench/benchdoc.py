"""test/bench/benchdoc.py: docs/benchmarks.md, as run-bench --write-docs writes it.

The page is an introduction made here (what each section measures, taken
from bench.py's docstring, and how to run them), then one block per
section, kept between <!-- bench:NAME --> and <!-- /bench:NAME -->.  A run
replaces the blocks of the sections it ran and keeps the others, so
sections can be run apart; blocks follow the suite's order of sections.
A block holds what produced it (command, commit, date, machine, software,
Kafka) and the rows bench.py's row() printed, in a markdown table, then
the charts the section drew (images under docs/img), if any.

Everything that reads the machine or git is in machine(), software() and
commit(); the rest are pure functions of their arguments (checked by
test/bench/test_benchdoc.py).
"""

import ctypes
import os
import re
import subprocess

PAGE = "docs/benchmarks.md"
BLOCK = re.compile(r"<!-- bench:([\w-]+) -->\n.*?<!-- /bench:\1 -->\n", re.S)
MOCK_KAFKA = "librdkafka mock cluster (test/broker), 3 brokers on the same machine"


def sections(docstring):
    """bench.py's list of sections, from its docstring: an ordered dict of
    section name (the first word, as --sections takes it) to (title,
    description).  An entry starts two spaces in, its title ends at two
    spaces or more; it goes on over the lines indented to its text."""
    out = {}
    key = None
    for line in docstring.splitlines():
        start = re.match(r"  (\S+(?: \S+)*)  +(\S.*)$", line)
        if start and not line.startswith("   "):
            title = start.group(1)
            key = title.split()[0]
            out[key] = (title, start.group(2))
        elif key and re.match(r" {4,}\S", line):
            title, text = out[key]
            out[key] = (title, text + " " + line.strip())
        else:
            key = None
    return out


def commit(root):
    """HEAD's short hash, with "-dirty" when the tree differs from it (files
    changed or not tracked; the page itself does not count)"""
    git = ["git", "-c", f"safe.directory={root}", "-C", root]
    head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    changes = subprocess.run(git + ["status", "--porcelain", "--", ".", f":(exclude){PAGE}"],
                             check=True, capture_output=True, text=True).stdout
    return head + ("-dirty" if changes.strip() else "")


def machine():
    """CPU count and model, RAM and distribution of this machine"""
    with open("/proc/cpuinfo") as f:
        cpu = f.read()
    model = re.search(r"^model name\s*:\s*(.*)$", cpu, re.M)
    count = len(re.findall(r"^processor\s*:", cpu, re.M))
    with open("/proc/meminfo") as f:
        kb = int(re.search(r"^MemTotal:\s*(\d+) kB", f.read(), re.M).group(1))
    release = {}
    if os.path.exists("/etc/os-release"):
        with open("/etc/os-release") as f:
            release = dict(re.findall(r'^(\w+)="?([^"\n]*)"?$', f.read(), re.M))
    if os.path.exists("/etc/debian_version"):
        with open("/etc/debian_version") as f:
            system = f"Debian {f.read().strip()}"
        if release.get("VERSION_CODENAME"):
            system += f" ({release['VERSION_CODENAME']})"
    else:
        system = release.get("PRETTY_NAME", "unknown system")
    return (f"{count} × {model.group(1) if model else 'unknown CPU'}, "
            f"{kb / 2**20:.1f} GiB RAM, {system}")


def librdkafka(pkglibdir):
    """the version of the librdkafka the installed extension loads"""
    path = "librdkafka.so.1"
    try:
        ldd = subprocess.run(["ldd", os.path.join(pkglibdir, "outbox.so")],
                             capture_output=True, text=True).stdout
        path = re.search(r"librdkafka\S* => (\S+)", ldd).group(1)
    except (OSError, AttributeError):
        pass
    lib = ctypes.CDLL(path)
    lib.rd_kafka_version_str.restype = ctypes.c_char_p
    return lib.rd_kafka_version_str().decode()


def software(server_version, pkglibdir):
    return f"PostgreSQL {server_version}, librdkafka {librdkafka(pkglibdir)}"


def cell(text):
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def block(name, title, facts, rows, images=()):
    """the markdown of one section: facts maps command, commit, date,
    machine, software and kafka to text; rows are row()'s tuples (section
    label, case, value, unit, ratio, note); images are (alt text, path
    from docs/) pairs, shown beneath the table"""
    lines = [f"<!-- bench:{name} -->", f"## {title}", "",
             f"- command: `{facts['command']}`",
             f"- commit: `{facts['commit']}`",
             f"- date: {facts['date']}",
             f"- machine: {facts['machine']}",
             f"- software: {facts['software']}",
             f"- Kafka: {facts['kafka']}",
             "",
             "| case | value | unit | ratio | note |",
             "|---|--:|---|--:|---|"]
    for _label, case, value, unit, ratio, note in rows:
        lines.append("| " + " | ".join(cell(x) for x in (case, value, unit, ratio, note)) + " |")
    for alt, path in images:
        lines += ["", f"![{alt}]({path})"]
    lines += ["", f"<!-- /bench:{name} -->"]
    return "\n".join(lines) + "\n"


def intro(known):
    """the top of the page: known is sections()'s answer"""
    lines = [
        "# Benchmarks",
        "",
        "<!-- Written by test/bench/run-bench --write-docs (test/bench/benchdoc.py): rerun it, do not edit. -->",
        "",
        "Each table below comes from one run of `test/bench/run-bench`, with the",
        "command, commit, date and machine that produced it. Each figure stands",
        "beside a baseline measured in the same run on the same machine, and the",
        "ratio column divides the one by the other (the case or the note names",
        "the baseline).",
        "",
        "## What each section measures",
        ""]
    for key, (title, text) in known.items():
        lines.append(f"- **{title}** (`--sections={key}`): {text}")
    lines += [
        "",
        "## Running it",
        "",
        "As root, from a checkout. It installs the packages it needs, builds and",
        "installs the extension into the system's PostgreSQL, and runs each",
        "section against a throwaway server and the test broker:",
        "",
        "```sh",
        "test/bench/run-bench --write-docs                          # every section but eos, avro, debezium and retention, about 35 minutes",
        "test/bench/run-bench --quick --sections=emit --write-docs  # one section, smaller and shorter runs",
        "test/bench/run-bench --sections=avro --write-docs          # JSON against Avro through a schema registry, about 10 minutes",
        "test/bench/run-bench --sections=debezium --write-docs      # Apache Kafka and Debezium Server (downloads them)",
        "test/bench/run-bench --sections=retention --write-docs     # the log's cleanup under load, about 25 minutes",
        "```",
        "",
        "`--sections=` takes a comma-separated list; `latency` without `drain`",
        "needs `--drain-rate=RATE,BATCH` (the relay's drain rate and the baseline's",
        "best batch). A run replaces the tables of the sections it ran and keeps",
        "the others."]
    return "\n".join(lines) + "\n"


def page(old, known, new_blocks):
    """the page: the introduction, then every block of old, replaced by
    new_blocks (name to markdown) where those hold one; in the order of
    known, then any other block old had"""
    blocks = {m.group(1): m.group(0) for m in BLOCK.finditer(old)}
    blocks.update(new_blocks)
    order = [k for k in known if k in blocks] + [k for k in blocks if k not in known]
    return intro(known) + "".join("\n" + blocks[k] for k in order)


def write(root, docstring, facts, ran, images=None):
    """rewrites root/docs/benchmarks.md with the sections of ran, a list of
    (name, kafka, date, rows); facts holds what every section shares;
    images maps a section's name to the charts shown beneath its table
    (block()'s images)"""
    images = images or {}
    known = sections(docstring)
    path = os.path.join(root, PAGE)
    old = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
    new = {name: block(name, known.get(name, (name, ""))[0],
                       dict(facts, kafka=kafka, date=date), rows, images.get(name, ()))
           for name, kafka, date, rows in ran}
    with open(path, "w") as f:
        f.write(page(old, known, new))
    # run-bench runs as root: the page stays the checkout's owner's
    owner = os.stat(os.path.dirname(path))
    os.chown(path, owner.st_uid, owner.st_gid)
    return path
