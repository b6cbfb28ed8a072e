#!/usr/bin/env bash
# Installs the Debian packages the browser and PostgreSQL tests need, when they
# are missing and this machine can install them (root + apt-get). Where it
# cannot, it says why; those tests then skip with that reason, except under
# CI=true where they must run (and fail loudly instead).
set -u
need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "note: cannot install ${need[*]} (needs root and apt-get); browser/PostgreSQL tests will skip unless CI=true" >&2
  exit 0
fi
echo "installing Debian packages for the tests: ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null && apt-get install -y -qq "${need[@]}" >/dev/null \
  || echo "note: apt-get install ${need[*]} failed; the tests that need them will say so" >&2
exit 0
