"""test/bench/test_benchdoc.py: checks the writer of docs/benchmarks.md
against made-up rows, without running a benchmark.

    python3 -m unittest discover -s test/bench -p 'test_*.py'
"""

import ast
import os
import re
import subprocess
import tempfile
import unittest

import benchdoc

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "bench.py")) as f:
    BENCH = f.read()
DOC = ast.get_docstring(ast.parse(BENCH))
FACTS = {"command": "test/bench/run-bench --quick --sections=emit --write-docs",
         "commit": "abc1234", "machine": "2 × Some CPU, 23.5 GiB RAM, Debian 12.11 (bookworm)",
         "software": "PostgreSQL 15.20, librdkafka 2.0.2"}
EMIT = [("emit", "plain INSERT TPS (relay paused)", "4,530", "tps", "", "median of 3 rounds"),
        ("emit", "emit() TPS (sequence off, relay paused)", "4,224", "tps", "0.93", "rounds 0.90..0.95")]
DRAIN = [("drain", "outbox relay, 200,000 events", "143,836", "ev/s", "", ""),
         ("drain", "outbox vs best baseline (batch 5000)", "143,836", "ev/s", "3.73", "a | b")]


def run(name, rows, date="2026-12-06 03:10 UTC", kafka=benchdoc.MOCK_KAFKA):
    return (name, kafka, date, rows)


class Sections(unittest.TestCase):
    def test_every_section_has_its_description(self):
        known = benchdoc.sections(DOC)
        default = re.search(r'\["emit", "drain"[^]]*\]', BENCH).group(0)
        # and those run only when asked
        names = ast.literal_eval(default) + ["eos", "avro", "debezium", "retention"]
        self.assertEqual(sorted(known), sorted(names))
        self.assertEqual(known["emit"][0], "emit cost")
        self.assertEqual(known["held"][0], "held xmin")
        self.assertIn("the same UPDATE + a plain INSERT", known["emit"][1])
        self.assertNotIn("  ", known["latency"][1])


class Page(unittest.TestCase):
    def setUp(self):
        self.known = benchdoc.sections(DOC)

    def blocks(self, *runs):
        return {name: benchdoc.block(name, self.known[name][0], dict(FACTS, kafka=kafka, date=date), rows)
                for name, kafka, date, rows in runs}

    def test_block_holds_provenance_and_rows(self):
        text = self.blocks(run("drain", DRAIN))["drain"]
        self.assertTrue(text.startswith("<!-- bench:drain -->\n## drain\n"))
        self.assertTrue(text.endswith("<!-- /bench:drain -->\n"))
        for fact in list(FACTS.values()) + ["2026-12-06 03:10 UTC", benchdoc.MOCK_KAFKA]:
            self.assertIn(fact, text)
        self.assertIn("| outbox vs best baseline (batch 5000) | 143,836 | ev/s | 3.73 | a \\| b |", text)
        table = [line for line in text.splitlines() if line.startswith("|")]
        self.assertEqual(len(table), 2 + len(DRAIN))
        self.assertEqual({len(re.split(r"(?<!\\)\|", line)) for line in table}, {7})

    def test_images_beneath_the_table(self):
        images = [("Size over time", "img/retention-size.png"), ("Dead tuples", "img/retention-dead.png")]
        text = benchdoc.block("retention", self.known["retention"][0], dict(FACTS, kafka="k", date="d"),
                              DRAIN, images)
        last_row = text.index("| outbox vs best baseline")
        size = text.index("\n\n![Size over time](img/retention-size.png)\n")
        dead = text.index("\n\n![Dead tuples](img/retention-dead.png)\n")
        self.assertLess(last_row, size)
        self.assertLess(size, dead)
        self.assertTrue(text.endswith("![Dead tuples](img/retention-dead.png)\n\n<!-- /bench:retention -->\n"))
        self.assertNotIn("![", self.blocks(run("drain", DRAIN))["drain"])

    def test_rerun_replaces_its_section_only(self):
        first = benchdoc.page("", self.known, self.blocks(run("drain", DRAIN), run("emit", EMIT)))
        self.assertTrue(first.startswith("# Benchmarks\n"))
        self.assertLess(first.index("<!-- bench:emit -->"), first.index("<!-- bench:drain -->"))
        again = benchdoc.page(first, self.known,
                              self.blocks(run("emit", EMIT[:1], date="2026-12-07 10:00 UTC")))
        self.assertEqual(again.count("<!-- bench:emit -->"), 1)
        self.assertIn("2026-12-07 10:00 UTC", again)
        self.assertNotIn("rounds 0.90..0.95", again)
        drain = self.blocks(run("drain", DRAIN))["drain"]
        self.assertIn(drain, again)
        self.assertEqual(benchdoc.page(again, self.known, {}), again)

    def test_unknown_block_kept_at_the_end(self):
        old = "# Benchmarks\n\n<!-- bench:gone -->\nold\n<!-- /bench:gone -->\n"
        text = benchdoc.page(old, self.known, self.blocks(run("idle", [])))
        self.assertTrue(text.endswith("<!-- bench:gone -->\nold\n<!-- /bench:gone -->\n"))
        self.assertLess(text.index("bench:idle"), text.index("bench:gone"))

    def test_intro_lists_sections_and_the_command(self):
        text = benchdoc.page("", self.known, {})
        for key, (title, _) in self.known.items():
            self.assertIn(f"- **{title}** (`--sections={key}`): ", text)
        self.assertIn("test/bench/run-bench --write-docs", text)
        self.assertNotIn("<!-- bench:", text)


class Machine(unittest.TestCase):
    def test_machine_names_cpu_ram_system(self):
        self.assertRegex(benchdoc.machine(), r"^\d+ × .+, \d+\.\d GiB RAM, \S.+$")

    def test_commit_dirty_but_not_for_the_page(self):
        with tempfile.TemporaryDirectory() as root:
            def git(*args):
                subprocess.run(["git", "-C", root, "-c", "user.name=t", "-c", "user.email=t@t", *args],
                               check=True, capture_output=True)
            git("init", "-q")
            os.mkdir(os.path.join(root, "docs"))
            for name in ("README", benchdoc.PAGE):
                with open(os.path.join(root, name), "w") as f:
                    f.write("x\n")
            git("add", ".")
            git("commit", "-q", "-m", "one")
            self.assertRegex(benchdoc.commit(root), r"^[0-9a-f]{7,}$")
            with open(os.path.join(root, benchdoc.PAGE), "a") as f:
                f.write("y\n")
            self.assertNotIn("-dirty", benchdoc.commit(root))
            with open(os.path.join(root, "new.c"), "w") as f:
                f.write("y\n")
            self.assertTrue(benchdoc.commit(root).endswith("-dirty"))

    def test_write_keeps_the_other_sections(self):
        with tempfile.TemporaryDirectory() as root:
            os.mkdir(os.path.join(root, "docs"))
            benchdoc.write(root, DOC, FACTS, [run("emit", EMIT)])
            path = benchdoc.write(root, DOC, FACTS, [run("drain", DRAIN)],
                                  {"drain": [("a chart", "img/drain.png")], "idle": [("not run", "img/x.png")]})
            with open(path) as f:
                text = f.read()
            self.assertIn("rounds 0.90..0.95", text)
            self.assertIn("outbox vs best baseline", text)
            self.assertIn("![a chart](img/drain.png)", text)
            self.assertNotIn("img/x.png", text)


if __name__ == "__main__":
    unittest.main()
