# shellcheck shell=bash
# Shared helpers for the scripts in scripts/ and .ci/run.
#
# Source it (`source "$(dirname "$0")/lib.sh"`); it defines functions and
# REPO_ROOT only and does not change shell options of the caller.

# The repository root, resolved from this file's own location so that every
# script works no matter which directory it is started from.
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
export REPO_ROOT

# Progress and errors go to stderr, so that commands whose stdout is meant to
# be consumed (e.g. `scripts/services env`) stay clean.
log() { printf '[%s] %s\n' "${LOG_TAG:-outboxd}" "$*" >&2; }
warn() { log "WARNING: $*"; }
die() {
	log "ERROR: $*"
	exit 1
}

have() { command -v "$1" >/dev/null 2>&1; }

is_root() { [[ ${EUID:-$(id -u)} -eq 0 ]]; }

# run_as USER CMD... runs CMD as USER when we are root (PostgreSQL refuses to
# run as root, and Elasticsearch does too). When we are not root there is
# nobody to switch to, so CMD simply runs as the current user.
run_as() {
	local user=$1
	shift
	if is_root && [[ $user != root ]]; then
		runuser -u "$user" -- "$@"
	else
		"$@"
	fi
}

# apt_install PKG... installs Debian packages quietly. The package index is
# only refreshed (`apt-get update`, slow) when the first attempt fails, which
# is the common case on a machine that has never run it.
apt_install() {
	is_root || die "need root to install Debian packages: $*"
	have apt-get || die "apt-get not found; please install: $*"
	local -a apt=(apt-get -y -q -o Dpkg::Use-Pty=0 -o DPkg::Lock::Timeout=600)
	log "installing Debian packages: $*"
	if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" install --no-install-recommends "$@" >/dev/null 2>&1; then
		log "apt-get install failed; running apt-get update and retrying"
		DEBIAN_FRONTEND=noninteractive "${apt[@]}" update >/dev/null ||
			die "apt-get update failed"
		DEBIAN_FRONTEND=noninteractive "${apt[@]}" install --no-install-recommends "$@" >&2 ||
			die "apt-get install $* failed"
	fi
}

# need_cmds CMD:PACKAGE... makes sure each command exists, installing the
# Debian package that provides it when it does not (a fresh CI machine may
# lack any of them).
need_cmds() {
	local spec cmd pkg
	local -a missing=()
	for spec in "$@"; do
		cmd=${spec%%:*}
		pkg=${spec#*:}
		have "$cmd" || missing+=("$pkg")
	done
	((${#missing[@]} == 0)) || apt_install "${missing[@]}"
}

# shquote STRING prints STRING single-quoted for safe use with eval (URLs
# contain '?' and '&', which the shell would otherwise glob or interpret).
shquote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
