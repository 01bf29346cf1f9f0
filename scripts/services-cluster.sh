# shellcheck shell=bash
# The distributed setups of scripts/services (sourced by it; not run alone):
# an Elasticsearch cluster of OUTBOXD_ES_NODES nodes and a PostgreSQL
# streaming standby (OUTBOXD_PG_STANDBY=1). The single-node default does not
# touch anything here.
#
# Cluster nodes live in .dev/es/cluster/node-N/{config,data,logs,run,tmp},
# each with its own config directory (a copy of the distribution's, plus its
# elasticsearch.yml) and pid file. Node N listens on HTTP port
# OUTBOXD_ES_PORT+N-1 and transport port OUTBOXD_ES_TRANSPORT_PORT+N-1:
# explicit ports, never a range, so two checkouts' clusters cannot join each
# other by accident (nodes only ever seed to their own transport ports).
#
# The standby lives in .dev/pg-standby/, made by `pg_basebackup -R` from the
# primary (replication over 127.0.0.1, trust auth as initdb set it up), and
# listens on OUTBOXD_PG_STANDBY_PORT (primary port + 1).

ESC_DIR="$ES_DIR/cluster"
ESC_NAME=outboxd-cluster

esc_enabled() { ((ES_NODES > 1)); }
esn_dir() { echo "$ESC_DIR/node-$1"; }
esn_name() { echo "outboxd-node-$1"; }
esn_http() { echo $((ES_PORT + $1 - 1)); }
esn_transport() { echo $((ES_TRANSPORT_PORT + $1 - 1)); }
esn_url() { echo "http://127.0.0.1:$(esn_http "$1")"; }
esn_pid() { local f; f="$(esn_dir "$1")/run/es.pid"; [[ -f $f ]] && tr -dc '0-9' <"$f" || true; }
esn_alive() { proc_alive "$(esn_pid "$1")" "$(esn_dir "$1")/"; }

# esc_urls: every node's URL, comma-separated (what ELASTICSEARCH_URL gets).
esc_urls() {
	local i out=""
	for ((i = 1; i <= ES_NODES; i++)); do out+="${out:+,}$(esn_url "$i")"; done
	echo "$out"
}

esn_write_config() {
	local i=$1 d seeds="" masters="" j
	d="$(esn_dir "$i")"
	mkdir -p "$d/config" "$d/data/$ES_VERSION" "$d/logs" "$d/run" "$d/tmp"
	# The distribution's jvm.options, log4j2.properties etc., copied once.
	[[ -f $d/config/jvm.options ]] || cp -a "$ES_HOME/config/." "$d/config/"
	for ((j = 1; j <= ES_NODES; j++)); do
		seeds+="${seeds:+, }\"127.0.0.1:$(esn_transport "$j")\""
		masters+="${masters:+, }\"$(esn_name "$j")\""
	done
	cat >"$d/config/elasticsearch.yml" <<-YML
		# Written by scripts/services on every start: edit the script, not this file.
		cluster.name: $ESC_NAME
		node.name: $(esn_name "$i")
		network.host: 127.0.0.1
		http.port: $(esn_http "$i")
		transport.port: $(esn_transport "$i")
		discovery.seed_hosts: [$seeds]
		cluster.initial_master_nodes: [$masters]
		path.data: $d/data/$ES_VERSION
		path.logs: $d/logs
		xpack.security.enabled: false
		cluster.routing.allocation.disk.threshold_enabled: false
		action.destructive_requires_name: false
		indexing_pressure.memory.limit: 32mb
	YML
	es_chown "$d"
}

esn_launch() {
	local i=$1 java=$2 d
	d="$(esn_dir "$i")"
	rm -f "$d/run/es.pid"
	(cd "$d/logs" && run_as "$ES_USER" env \
		-u JAVA_HOME ES_JAVA_HOME="$java" \
		ES_JAVA_OPTS="$ES_NODE_JAVA_OPTS" \
		ES_PATH_CONF="$d/config" \
		ES_TMPDIR="$d/tmp" \
		"$ES_HOME/bin/elasticsearch" -d -p "$d/run/es.pid" \
		</dev/null >"$d/logs/startup.out" 2>&1 9>&-)
}

# esc_health SECONDS: wait for every node in one yellow (or green) cluster,
# asking each node in turn (any of them may be the one that is down).
esc_health() {
	local deadline=$(($(date +%s) + $1)) i
	while (($(date +%s) < deadline)); do
		for ((i = 1; i <= ES_NODES; i++)); do
			curl -fsS -o /dev/null --max-time 15 \
				"$(esn_url "$i")/_cluster/health?wait_for_status=yellow&wait_for_nodes=$ES_NODES&timeout=10s" 2>/dev/null && return 0
		done
		sleep 1
	done
	return 1
}

# esc_start: start every node that is not running (all at once: a node
# waits for the others to elect a master), then wait for the whole cluster.
esc_start() {
	need_cmds curl:curl
	prepare_dev
	mkdir -p "$ESC_DIR"
	es_ensure_user
	es_install
	local -a javas
	mapfile -t javas < <(es_java_homes)
	if ((${#javas[@]} == 0)); then
		apt_install openjdk-17-jre-headless
		javas=(/usr/lib/jvm/java-17-openjdk-amd64)
	fi
	local i t0 started=() pids=() rc=0
	t0=$(date +%s)
	for ((i = 1; i <= ES_NODES; i++)); do
		esn_alive "$i" && continue
		port_open "$(esn_http "$i")" &&
			die "port $(esn_http "$i") (node $i) is in use by a server this checkout did not start; set OUTBOXD_ES_PORT"
		port_open "$(esn_transport "$i")" &&
			die "transport port $(esn_transport "$i") (node $i) is in use; set OUTBOXD_ES_TRANSPORT_PORT"
		esn_write_config "$i"
		log "starting Elasticsearch node $i ($(esn_name "$i")) on $(esn_url "$i"), transport $(esn_transport "$i") (log: $(esn_dir "$i")/logs/$ESC_NAME.log)"
		esn_launch "$i" "${javas[0]}" &
		pids+=($!)
		started+=("$i")
	done
	for i in "${!pids[@]}"; do
		wait "${pids[$i]}" || {
			rc=1
			log "node ${started[$i]} failed to start:"
			tail -n 20 "$(esn_dir "${started[$i]}")/logs/startup.out" >&2 || true
		}
	done
	((rc == 0)) || die "Elasticsearch cluster did not start"
	echo "$ES_VERSION" >"$ESC_DIR/version"
	if ! esc_health "$ES_TIMEOUT"; then
		for i in "${started[@]}"; do tail_log "$(esn_dir "$i")/logs/$ESC_NAME.log"; done
		die "the $ES_NODES-node Elasticsearch cluster did not form (yellow, $ES_NODES nodes) within ${ES_TIMEOUT}s"
	fi
	log "Elasticsearch cluster of $ES_NODES nodes is up after $(($(date +%s) - t0))s: $(esc_urls)"
}

# esn_stop N [SIGNAL]: TERM (graceful) or KILL one node.
esn_stop() {
	local i=$1 sig=${2:-TERM} pid n
	if ! esn_alive "$i"; then
		rm -f "$(esn_dir "$i")/run/es.pid"
		return 0
	fi
	pid="$(esn_pid "$i")"
	log "stopping Elasticsearch node $i (pid $pid, SIG$sig)"
	kill "-$sig" "$pid" 2>/dev/null || true
	for ((n = 0; n < 120; n++)); do
		proc_alive "$pid" "$(esn_dir "$i")/" || break
		sleep 0.5
	done
	if proc_alive "$pid" "$(esn_dir "$i")/"; then
		warn "node $i (pid $pid) did not stop within 60s; killing it"
		kill -KILL "$pid" 2>/dev/null || true
		while proc_alive "$pid" "$(esn_dir "$i")/"; do sleep 0.2; done
	fi
	rm -f "$(esn_dir "$i")/run/es.pid"
}

esc_stop() {
	local i
	for ((i = 1; i <= ES_NODES; i++)); do esn_stop "$i" TERM & done
	wait
}

esc_status() {
	local i rc=0 master="" url
	for ((i = 1; i <= ES_NODES; i++)); do
		esn_alive "$i" || continue
		master="$(curl -fsS --max-time 5 "$(esn_url "$i")/_cat/master?h=node" 2>/dev/null)" && break
	done
	for ((i = 1; i <= ES_NODES; i++)); do
		url="$(esn_url "$i")"
		if esn_alive "$i"; then
			if curl -fsS -o /dev/null --max-time 5 "$url/_cluster/health" 2>/dev/null; then
				local role=""
				[[ ${master// /} == "$(esn_name "$i")" ]] && role=", elected master"
				echo "elasticsearch node $i: running (pid $(esn_pid "$i")$role)  $url"
			else
				echo "elasticsearch node $i: running (pid $(esn_pid "$i")) but not answering  $url"
				rc=1
			fi
		else
			echo "elasticsearch node $i: stopped  $url"
			rc=1
		fi
	done
	return $rc
}

esn_arg() {
	[[ ${1:-} =~ ^[0-9]+$ ]] && (($1 >= 1 && $1 <= ES_NODES)) ||
		die "node: want a number from 1 to $ES_NODES (OUTBOXD_ES_NODES), got '${1:-}'"
}

# ---------------------------------------------------------- PG standby --

PGS_DIR="$DEV/pg-standby"
PGS_DATA="$PGS_DIR/data"
PGS_SOCK="$PGS_DIR/run"
PGS_LOG="$PGS_DIR/postgres.log"
PGS_URL="postgres://postgres@127.0.0.1:$PGS_PORT/$PG_DB?sslmode=disable"

pgs_enabled() { [[ $PG_STANDBY == 1 ]]; }
pgs_ctl() { (cd "$PGS_DIR" && run_as "$PG_USER" "$PG_BIN/pg_ctl" -D "$PGS_DATA" "$@"); }
pgs_pid() { [[ -f $PGS_DATA/postmaster.pid ]] && head -n 1 "$PGS_DATA/postmaster.pid" || true; }
pgs_running() { [[ -s $PGS_DATA/postmaster.pid ]] && proc_alive "$(pgs_pid)" "-D $PGS_DATA"; }
pgs_ready() { "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PGS_PORT" -U postgres -d postgres -t 2; }
# pgs_promoted: the standby's data directory no longer asks for recovery.
pgs_promoted() { [[ -s $PGS_DATA/PG_VERSION && ! -e $PGS_DATA/standby.signal ]]; }

# pg_multi_url: what DATABASE_URL is with a standby: both hosts, and only a
# server that accepts writes will do, so clients follow a promotion.
pg_multi_url() {
	echo "postgres://postgres@127.0.0.1:$PG_PORT,127.0.0.1:$PGS_PORT/$PG_DB?sslmode=disable&target_session_attrs=read-write"
}

pgs_start() {
	pg_find_bin
	mkdir -p "$PGS_DIR" "$PGS_SOCK"
	is_root && chown "$PG_USER:" "$PGS_DIR" "$PGS_SOCK"
	if pgs_promoted; then
		die "the standby in $PGS_DATA was promoted (failover): run scripts/services reset-standby to discard it and take a new base backup of the primary"
	fi
	if [[ ! -s $PGS_DATA/PG_VERSION ]]; then
		rm -rf "$PGS_DATA"
		log "taking a base backup of the primary (127.0.0.1:$PG_PORT) into $PGS_DATA"
		(cd "$PGS_DIR" && run_as "$PG_USER" "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$PG_PORT" -U postgres \
			-D "$PGS_DATA" -R -X stream -c fast >"$PGS_DIR/basebackup.log" 2>&1) || {
			tail_log "$PGS_DIR/basebackup.log"
			die "pg_basebackup failed"
		}
	fi
	pg_write_conf "$PGS_DATA" "$PGS_PORT" "$PGS_SOCK"
	if ! pgs_running; then
		port_open "$PGS_PORT" && die "port $PGS_PORT is in use; set OUTBOXD_PG_STANDBY_PORT"
		log "starting the PostgreSQL standby on 127.0.0.1:$PGS_PORT (log: $PGS_LOG)"
		pgs_ctl start -w -t 120 -l "$PGS_LOG" </dev/null >/dev/null 2>&1 9>&- || {
			tail_log "$PGS_LOG"
			die "the PostgreSQL standby failed to start"
		}
	fi
	local i
	for ((i = 0; i < 60; i++)); do
		pgs_ready && return 0
		sleep 1
	done
	tail_log "$PGS_LOG"
	die "the PostgreSQL standby does not accept connections on port $PGS_PORT"
}

pgs_stop() {
	pgs_running || return 0
	pg_find_bin
	log "stopping the PostgreSQL standby (pid $(pgs_pid))"
	pgs_ctl stop -m fast -w -t 60 >/dev/null 2>&1 || pgs_ctl stop -m immediate -w -t 30 >/dev/null 2>&1 ||
		die "could not stop the PostgreSQL standby"
}

pgs_status() {
	pg_find_bin
	if ! pgs_running; then
		echo "postgres standby: stopped  $PGS_URL"
		return 1
	fi
	local rec
	rec="$(PGCONNECT_TIMEOUT=5 "$PG_BIN/psql" -X -q -At -w "$PGS_URL" -c 'select pg_is_in_recovery()' 2>/dev/null)" || {
		echo "postgres standby: running (pid $(pgs_pid)) but not answering  $PGS_URL"
		return 1
	}
	if [[ $rec == t ]]; then
		echo "postgres standby: running (pid $(pgs_pid), streaming standby)  $PGS_URL"
	else
		echo "postgres standby: running (pid $(pgs_pid), PROMOTED: now a primary)  $PGS_URL"
	fi
}

# pgs_promote: make the standby a primary. Stop (or lose) the old primary
# first: the script does not fence it.
pgs_promote() {
	pgs_running || die "the standby is not running"
	log "promoting the standby on 127.0.0.1:$PGS_PORT"
	pgs_ctl promote -w -t 60 >/dev/null || die "pg_ctl promote failed; see $PGS_LOG"
}

# pgs_reset: discard the standby (promoted or not) and build it again from
# the primary, which must be running.
pgs_reset() {
	pgs_stop
	log "discarding $PGS_DATA"
	rm -rf "$PGS_DATA"
	pgs_start
}
