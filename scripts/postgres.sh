#!/usr/bin/env bash
# Find or start a PostgreSQL for Astraeus and export DATABASE_URL.
#
#   . scripts/postgres.sh            # from bash: sets and exports DATABASE_URL
#   eval "$(scripts/postgres.sh)"    # prints `export DATABASE_URL=...`
#   scripts/postgres.sh stop         # stops the private instance, if one runs
#
# The role behind the URL may CREATE DATABASE (tests make one database per test). Order:
#   1. DATABASE_URL, when it is already set and answers;
#   2. postgres://postgres@127.0.0.1:5432/postgres, when it answers without a password;
#   3. a private instance started from the system's PostgreSQL binaries (installed with
#      apt-get when missing and running as root), under $ASTRAEUS_PG_DIR, by default
#      $ASTRAEUS_STATE_DIR/postgres, by default <repo>/.astraeus/postgres: data in data/, its
#      Unix socket in run/, TCP on 127.0.0.1:${ASTRAEUS_PG_PORT:-5433} (or the next free port
#      up to 5450), trust authentication, superuser `postgres`. As root it runs as the `postgres`
#      system user; when that user cannot reach the repository, it lives in /tmp/astraeus-pg-$UID.
#
# Settings:
#   ASTRAEUS_PG_PRIVATE=1    skip 1 and 2 and always use the private instance
#   ASTRAEUS_PG_PORT=N       preferred port of the private instance (default 5433)
#   ASTRAEUS_PG_DIR=DIR      where the private instance lives
#   ASTRAEUS_STATE_DIR=DIR   base state folder (default <repo>/.astraeus); the instance is in DIR/postgres
#   ASTRAEUS_PG_FSYNC=off    the private instance is a dev/test database and runs with fsync=off,
#                            synchronous_commit=off and full_page_writes=off by default: fast, but
#                            an OS crash or power loss can corrupt it. Set ASTRAEUS_PG_FSYNC=on for
#                            durable settings (takes effect the next time the instance starts).
#
# When sourced this file only defines and exports DATABASE_URL; it never exits the calling shell
# (on failure it prints why and returns 1) and it does not change the caller's shell options.

_astraeus_pg_log() { printf 'postgres.sh: %s\n' "$*" >&2; }

# A URL with its password, if any, masked.
_astraeus_pg_redact() { printf '%s' "$1" | sed -E 's#(://[^:/@]*):[^@/]*@#\1:***@#'; }

_astraeus_pg_repo() { (cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd); }

# _astraeus_pg_tool NAME [PREFERRED_BINDIR]: path of a PostgreSQL program, or fails.
_astraeus_pg_tool() {
  local name=$1 preferred=${2:-} dir p
  if [[ -n $preferred && -x $preferred/$name ]]; then
    printf '%s\n' "$preferred/$name"
    return 0
  fi
  if p=$(command -v "$name" 2>/dev/null) && [[ -n $p ]]; then
    printf '%s\n' "$p"
    return 0
  fi
  while IFS= read -r dir; do
    if [[ -x $dir/$name ]]; then
      printf '%s\n' "$dir/$name"
      return 0
    fi
  done < <(_astraeus_pg_bindirs)
  return 1
}

# Candidate server bindirs: pg_config --bindir, then /usr/lib/postgresql/*/bin, newest first.
_astraeus_pg_bindirs() {
  local d
  if command -v pg_config >/dev/null 2>&1; then
    d=$(pg_config --bindir 2>/dev/null) && [[ -n $d ]] && printf '%s\n' "$d"
  fi
  if compgen -G '/usr/lib/postgresql/*/bin' >/dev/null; then
    printf '%s\n' /usr/lib/postgresql/*/bin | sort -t/ -k5,5 -V -r
  fi
  return 0
}

# A bindir holding initdb, pg_ctl and postgres: from PATH first (symlinks resolved), then
# pg_config --bindir, then the newest /usr/lib/postgresql/*/bin. $1: a version to prefer.
_astraeus_pg_server_bindir() {
  local want=${1:-} dir p
  local -a dirs=()
  [[ -n $want ]] && dirs+=("/usr/lib/postgresql/$want/bin")
  if p=$(command -v pg_ctl 2>/dev/null) && [[ -n $p ]]; then
    dirs+=("$(dirname "$(readlink -f "$p")")")
  fi
  while IFS= read -r dir; do dirs+=("$dir"); done < <(_astraeus_pg_bindirs)
  for dir in "${dirs[@]}"; do
    if [[ -x $dir/initdb && -x $dir/pg_ctl && -x $dir/postgres ]]; then
      printf '%s\n' "$dir"
      return 0
    fi
  done
  return 1
}

# _astraeus_pg_query URL SQL: runs SQL, prints the result, fails when it cannot connect.
_astraeus_pg_query() {
  local psql
  psql=$(_astraeus_pg_tool psql) || return 1
  PGCONNECT_TIMEOUT=5 "$psql" -X -w -q -A -t -d "$1" -c "$2" </dev/null 2>/dev/null
}

# _astraeus_pg_usable URL: the server answers and the role may create databases.
_astraeus_pg_usable() {
  local ok
  ok=$(_astraeus_pg_query "$1" \
    "select rolsuper or rolcreatedb from pg_roles where rolname = current_user") || return 1
  [[ $ok == t ]]
}

_astraeus_pg_is_root() { [[ $(id -u) == 0 ]]; }

# Runs a command as the user who owns the private instance (never as root), in a directory
# that user can read.
_astraeus_pg_as_owner() {
  if _astraeus_pg_is_root; then
    (cd / && runuser -u postgres -- "$@")
  else
    "$@"
  fi
}

# Starts the server as its owner. pg_ctl's children must not inherit the lock's descriptor
# (uses the caller's $lockfd), or the lock would be held as long as the server runs.
_astraeus_pg_start() {
  if [[ -n ${lockfd:-} ]]; then
    _astraeus_pg_as_owner "$@" </dev/null >/dev/null 2>&1 {lockfd}>&-
  else
    _astraeus_pg_as_owner "$@" </dev/null >/dev/null 2>&1
  fi
}

_astraeus_pg_port_in_use() {
  (: <"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

_astraeus_pg_install() {
  if ! _astraeus_pg_is_root || ! command -v apt-get >/dev/null 2>&1; then
    _astraeus_pg_log "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found."
    _astraeus_pg_log "install them (Debian/Ubuntu: sudo apt-get install postgresql) or set DATABASE_URL."
    return 1
  fi
  _astraeus_pg_log "installing PostgreSQL with apt-get (postgresql)..."
  {
    DEBIAN_FRONTEND=noninteractive apt-get update -q &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql
  } </dev/null >&2 || {
    _astraeus_pg_log "apt-get install postgresql failed"
    return 1
  }
}

# Prepares DIR for the instance's owner; fails when that user cannot write it.
_astraeus_pg_prepare_dir() {
  local dir=$1
  mkdir -p "$dir" 2>/dev/null || return 1
  if _astraeus_pg_is_root; then
    if [[ $(stat -c %U "$dir") != postgres ]]; then
      chown -R postgres:postgres "$dir" || return 1
    fi
    chmod 0700 "$dir" || return 1
    runuser -u postgres -- test -w "$dir" -a -x "$dir" 2>/dev/null || return 1
  else
    [[ -O $dir && -w $dir && -x $dir ]] || return 1
    chmod 0700 "$dir" || return 1
  fi
}

_astraeus_pg_ensure_user() {
  _astraeus_pg_is_root || return 0
  id -u postgres >/dev/null 2>&1 && return 0
  _astraeus_pg_log "creating the postgres system user (PostgreSQL refuses to run as root)"
  useradd --system --user-group --no-create-home --home-dir /var/lib/postgresql \
    --shell /usr/sbin/nologin postgres >&2
}

# Sets _astraeus_pg_url to a private instance, starting (and first creating) it when needed.
_astraeus_pg_private() {
  local base dir data run bindir port pidport want_version have_version fsync pref p lockfd=
  local -a ports=() opts=()

  if ! _astraeus_pg_server_bindir >/dev/null; then
    _astraeus_pg_install || return 1
  fi
  _astraeus_pg_ensure_user || return 1
  if _astraeus_pg_is_root && ! command -v runuser >/dev/null 2>&1; then
    _astraeus_pg_log "runuser (util-linux) is needed to run PostgreSQL as the postgres user"
    return 1
  fi

  base=${ASTRAEUS_STATE_DIR:-$(_astraeus_pg_repo)/.astraeus}
  dir=${ASTRAEUS_PG_DIR:-$base/postgres}
  if ! _astraeus_pg_prepare_dir "$dir"; then
    local fallback
    fallback=/tmp/astraeus-pg-$(id -u)
    local who
    who=$(id -un)
    _astraeus_pg_is_root && who=postgres
    _astraeus_pg_log "$dir is not writable by the $who user; using $fallback"
    dir=$fallback
    _astraeus_pg_prepare_dir "$dir" || {
      _astraeus_pg_log "cannot prepare $dir"
      return 1
    }
  fi
  data=$dir/data
  run=$dir/run
  # A Unix socket path must stay under 108 bytes, and postgres -o options are split on spaces.
  if ((${#run} > 90)) || [[ $run == *' '* ]]; then
    run=/tmp/astraeus-pg-$(id -u)-run
  fi
  _astraeus_pg_as_owner mkdir -p "$run" || return 1

  # One caller at a time creates or starts the instance.
  if command -v flock >/dev/null 2>&1; then
    exec {lockfd}>>"$dir/.lock" || return 1
    if ! flock -w 120 "$lockfd"; then
      _astraeus_pg_log "timed out waiting for $dir/.lock"
      exec {lockfd}>&-
      return 1
    fi
  fi
  _astraeus_pg_private_locked
  local rc=$?
  [[ -n $lockfd ]] && exec {lockfd}>&-
  return "$rc"
}

# The part of _astraeus_pg_private that runs under the lock (uses its locals).
_astraeus_pg_private_locked() {
  want_version=
  [[ -f $data/PG_VERSION ]] && want_version=$(<"$data/PG_VERSION")
  bindir=$(_astraeus_pg_server_bindir "$want_version") || {
    _astraeus_pg_log "no initdb/pg_ctl/postgres found"
    return 1
  }

  if [[ -n $want_version ]]; then
    have_version=$("$bindir/postgres" --version 2>/dev/null) || have_version=unknown
    have_version=${have_version##*(PostgreSQL) }
    have_version=${have_version%% *}
    if [[ $have_version != "$want_version" && $have_version != "$want_version".* ]]; then
      _astraeus_pg_log "$data was made by PostgreSQL $want_version but $bindir/postgres is $have_version; remove $dir to start over"
      return 1
    fi
  fi

  if [[ -z $want_version ]]; then
    _astraeus_pg_log "creating a private PostgreSQL in $data"
    if ! _astraeus_pg_as_owner "$bindir/initdb" -D "$data" -U postgres -A trust -E UTF8 --no-locale \
      </dev/null >"$dir/initdb.log" 2>&1; then
      _astraeus_pg_log "initdb failed; see $dir/initdb.log"
      tail -n 20 "$dir/initdb.log" >&2
      return 1
    fi
  fi

  if _astraeus_pg_as_owner "$bindir/pg_ctl" status -D "$data" >/dev/null 2>&1; then
    pidport=$(sed -n 4p "$data/postmaster.pid" 2>/dev/null)
    if [[ $pidport =~ ^[0-9]+$ ]]; then
      _astraeus_pg_url=postgres://postgres@127.0.0.1:$pidport/postgres
      if _astraeus_pg_usable "$_astraeus_pg_url"; then
        _astraeus_pg_log "using the private PostgreSQL in $dir (already running, port $pidport)"
        return 0
      fi
    fi
    _astraeus_pg_log "the private PostgreSQL in $data runs but does not answer on 127.0.0.1:${pidport:-?}; stop it with: $(_astraeus_pg_repo)/scripts/postgres.sh stop"
    return 1
  fi

  pref=${ASTRAEUS_PG_PORT:-}
  if [[ -z $pref && -f $dir/port ]]; then pref=$(<"$dir/port"); fi
  [[ -n $pref ]] && ports+=("$pref")
  for ((p = 5433; p <= 5450; p++)); do ports+=("$p"); done
  port=
  for p in "${ports[@]}"; do
    if ! _astraeus_pg_port_in_use "$p"; then
      port=$p
      break
    fi
  done
  if [[ -z $port ]]; then
    _astraeus_pg_log "no free port among ${ports[*]}"
    return 1
  fi

  fsync=${ASTRAEUS_PG_FSYNC:-off}
  case $fsync in
    on | off) ;;
    *)
      _astraeus_pg_log "ASTRAEUS_PG_FSYNC must be on or off, not '$fsync'"
      return 1
      ;;
  esac
  opts=(-p "$port" -k "$run" -c listen_addresses=127.0.0.1 -c max_connections=200
    -c fsync="$fsync" -c synchronous_commit="$fsync" -c full_page_writes="$fsync")

  if ! _astraeus_pg_start "$bindir/pg_ctl" start -D "$data" -l "$dir/postgres.log" -w -t 60 \
    -o "${opts[*]}"; then
    _astraeus_pg_log "the private PostgreSQL did not start; last lines of $dir/postgres.log:"
    tail -n 20 "$dir/postgres.log" >&2
    return 1
  fi
  printf '%s\n' "$port" >"$dir/port"

  _astraeus_pg_url=postgres://postgres@127.0.0.1:$port/postgres
  if ! _astraeus_pg_usable "$_astraeus_pg_url"; then
    _astraeus_pg_log "the private PostgreSQL started but $_astraeus_pg_url does not answer"
    return 1
  fi
  _astraeus_pg_log "using the private PostgreSQL in $dir (started, port $port, fsync=$fsync)"
}

# Sets _astraeus_pg_url, following the order at the top of this file.
_astraeus_pg_main() {
  local url=${DATABASE_URL:-}
  _astraeus_pg_url=
  if [[ ${ASTRAEUS_PG_PRIVATE:-0} != 1 ]]; then
    if [[ -n $url ]]; then
      if _astraeus_pg_tool psql >/dev/null; then
        if _astraeus_pg_query "$url" 'select 1' >/dev/null; then
          _astraeus_pg_usable "$url" ||
            _astraeus_pg_log "warning: the role in DATABASE_URL may not create databases; tests need that"
          _astraeus_pg_log "using DATABASE_URL from the environment ($(_astraeus_pg_redact "$url"))"
          _astraeus_pg_url=$url
          return 0
        fi
      elif _astraeus_pg_tool pg_isready >/dev/null &&
        "$(_astraeus_pg_tool pg_isready)" -q -t 5 -d "$url" </dev/null >/dev/null 2>&1; then
        _astraeus_pg_log "using DATABASE_URL from the environment ($(_astraeus_pg_redact "$url"))"
        _astraeus_pg_url=$url
        return 0
      fi
      _astraeus_pg_log "DATABASE_URL ($(_astraeus_pg_redact "$url")) does not answer; looking for another PostgreSQL"
    fi

    url=postgres://postgres@127.0.0.1:5432/postgres
    if _astraeus_pg_port_in_use 5432 && _astraeus_pg_usable "$url"; then
      _astraeus_pg_url=$url
      _astraeus_pg_log "using the PostgreSQL at 127.0.0.1:5432 ($url)"
      return 0
    fi
  fi
  _astraeus_pg_private
}

_astraeus_pg_stop() {
  local base dir bindir found=0 stopped=0
  base=${ASTRAEUS_STATE_DIR:-$(_astraeus_pg_repo)/.astraeus}
  for dir in "${ASTRAEUS_PG_DIR:-$base/postgres}" "/tmp/astraeus-pg-$(id -u)"; do
    [[ -f $dir/data/PG_VERSION ]] || continue
    found=1
    bindir=$(_astraeus_pg_server_bindir "$(<"$dir/data/PG_VERSION")") || {
      _astraeus_pg_log "no pg_ctl found"
      return 1
    }
    if _astraeus_pg_as_owner "$bindir/pg_ctl" status -D "$dir/data" >/dev/null 2>&1; then
      _astraeus_pg_as_owner "$bindir/pg_ctl" stop -D "$dir/data" -m fast -w </dev/null >/dev/null || return 1
      _astraeus_pg_log "stopped the private PostgreSQL in $dir"
      stopped=1
    fi
  done
  if ((!found)); then
    _astraeus_pg_log "no private PostgreSQL found"
  elif ((!stopped)); then
    _astraeus_pg_log "the private PostgreSQL is not running"
  fi
  return 0
}

_astraeus_pg_unset() {
  unset _astraeus_pg_url
  unset -f _astraeus_pg_log _astraeus_pg_redact _astraeus_pg_repo _astraeus_pg_tool \
    _astraeus_pg_bindirs _astraeus_pg_server_bindir _astraeus_pg_query _astraeus_pg_usable \
    _astraeus_pg_is_root _astraeus_pg_as_owner _astraeus_pg_start _astraeus_pg_port_in_use _astraeus_pg_install \
    _astraeus_pg_prepare_dir _astraeus_pg_ensure_user _astraeus_pg_private \
    _astraeus_pg_private_locked _astraeus_pg_main _astraeus_pg_stop _astraeus_pg_unset
}

if [[ ${BASH_SOURCE[0]} != "$0" ]]; then
  # Sourced.
  if _astraeus_pg_main; then
    export DATABASE_URL=$_astraeus_pg_url
    _astraeus_pg_unset
  else
    _astraeus_pg_log "no usable PostgreSQL; DATABASE_URL left unchanged"
    _astraeus_pg_unset
    return 1
  fi
else
  set -euo pipefail
  case ${1:-} in
    '' | env)
      _astraeus_pg_main || exit 1
      printf 'export DATABASE_URL=%q\n' "$_astraeus_pg_url"
      ;;
    stop) _astraeus_pg_stop ;;
    -h | --help | help)
      sed -n '2,/^$/s/^# \{0,1\}//p' "$0"
      ;;
    *)
      echo "usage: $0 [env|stop]" >&2
      exit 2
      ;;
  esac
fi
