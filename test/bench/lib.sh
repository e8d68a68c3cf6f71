# test/bench/lib.sh: shared by the benchmarks.  Starts a throwaway server
# (as postgres, outbox preloaded) and the test broker; stops them on exit.
# Sourced by a script running as root from the repository root.

bindir=$(pg_config --bindir)
bench_work=$(mktemp -d /tmp/outbox-bench.XXXXXX)
chown postgres: "$bench_work"
bench_port=${BENCH_PORT:-5498}
broker_pid=""
brokers=""

as_pg() { su postgres -c "$*"; }
psql_() { as_pg "psql -X -q -v ON_ERROR_STOP=1 -h '$bench_work' -p $bench_port -U postgres -d bench $*"; }
sql() { psql_ -At -c "$(printf '%q' "$1")"; }

bench_cleanup() {
	as_pg "$bindir/pg_ctl -D '$bench_work/data' -m fast stop" >/dev/null 2>&1 || true
	[ -n "$broker_pid" ] && kill "$broker_pid" 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$bench_work"
}
trap bench_cleanup EXIT

start_broker() {
	test/broker/outbox_test_broker -b "${1:-3}" -f "$bench_work/bootstrap" >"$bench_work/broker.log" 2>&1 &
	broker_pid=$!
	for _ in $(seq 50); do [ -s "$bench_work/bootstrap" ] && break; sleep 0.1; done
	brokers=$(cat "$bench_work/bootstrap")
}

# start_server [extra postgresql.conf lines]
start_server() {
	as_pg "$bindir/initdb -D '$bench_work/data' -A trust -U postgres" >/dev/null
	cat >>"$bench_work/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$bench_work'
port = $bench_port
shared_preload_libraries = 'outbox,pg_stat_statements'
shared_buffers = '1GB'
max_wal_size = '8GB'
checkpoint_timeout = '30min'
outbox.kafka_brokers = '$brokers'
outbox.kafka_config = 'reconnect.backoff.max.ms=500'
$1
CONF
	as_pg "$bindir/pg_ctl -D '$bench_work/data' -l '$bench_work/server.log' -w start" >/dev/null
	as_pg "$bindir/createdb -h '$bench_work' -p $bench_port -U postgres bench"
	sql "CREATE EXTENSION outbox" >/dev/null
}

set_conf() {
	sql "ALTER SYSTEM SET $1" >/dev/null
	sql "SELECT pg_reload_conf()" >/dev/null
}

# pgbench_run NAME SCRIPT SECONDS CLIENTS: prints "tps p50_ms p99_ms"
pgbench_run() {
	local name=$1 script=$2 secs=$3 clients=$4
	local dir="$bench_work/pgb_$name"
	mkdir -p "$dir"
	cp "$script" "$dir/script.sql"
	chown -R postgres: "$dir"
	as_pg "cd '$dir' && $bindir/pgbench -h '$bench_work' -p $bench_port -U postgres -n -M prepared \
		-c $clients -j 2 -T $secs -l --log-prefix=lat -f script.sql bench" >"$dir/out" 2>&1
	local tps
	tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$dir/out")
	# per-transaction log: field 3 is the latency in microseconds
	cat "$dir"/lat.* | awk '{print $3}' | sort -n >"$dir/lat.sorted"
	local n p50 p99
	n=$(wc -l <"$dir/lat.sorted")
	p50=$(sed -n "$(( (n + 1) / 2 ))p" "$dir/lat.sorted")
	p99=$(sed -n "$(( (n * 99 + 99) / 100 ))p" "$dir/lat.sorted")
	printf '%s %.3f %.3f\n' "$tps" "$(echo "$p50 / 1000" | bc -l)" "$(echo "$p99 / 1000" | bc -l)"
}
