# Shared by scripts/demo and scripts/test: make .venv, installing Debian's venv support
# first when this is a bare Debian/Ubuntu where `python3 -m venv` cannot work yet.
PY=${PYTHON:-python3}
make_venv() {
  [ -x .venv/bin/python ] && return 0
  if ! command -v "$PY" >/dev/null 2>&1; then
    echo "iqbridge: $PY not found; install Python 3.11+ (Debian: apt install python3)" >&2
    exit 1
  fi
  if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "iqbridge: needs Python 3.11 or newer; $PY is $("$PY" -V 2>&1)" >&2
    exit 1
  fi
  if "$PY" -m venv .venv 2>/dev/null; then return 0; fi
  rm -rf .venv
  ver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "iqbridge: installing python${ver}-venv (Debian) ..." >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python${ver}-venv" >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null 2>&1 \
           && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python${ver}-venv" >/dev/null; }
    "$PY" -m venv .venv && return 0
  fi
  echo "iqbridge: cannot create a virtualenv; on Debian/Ubuntu run: sudo apt install python${ver}-venv" >&2
  exit 1
}
