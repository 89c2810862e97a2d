#!/usr/bin/env bash
# The system programs `make test`, `make demo` and `make bench` use, installed from Debian's
# packages when missing. Run by the Makefile before anything else; as root it installs what
# is missing, otherwise it names each missing program and the package that provides it and
# exits 2 (nothing is installed behind a user's back).
#
#   devtools/system-packages.sh test|demo|cluster|bench|image
#
# The PostgreSQL server binaries, PgBouncer, Prometheus (for promtool), the Pushgateway and
# Chromium with its driver; for the image, a builder without a Docker engine: each row is
# "check  package  what needs it". A check is a command name or an absolute path glob.
set -euo pipefail

want=${1:-test}

rows_demo=(
  "/usr/lib/postgresql/*/bin/initdb  postgresql  the throwaway PostgreSQL server"
)
rows_image=(
  "buildah                          buildah                builds the image where no Docker engine answers"
  "runc                             runc                   the builder's runtime (Debian's crun refuses hybrid cgroups)"
  "debootstrap                      debootstrap            the local Python base where python:3.11-slim cannot be pulled"
  "catatonit                        catatonit              the local cluster's pause image"
)
# The local cluster's node runs the image: containerd and runc run its pods, the CNI
# plugins give them a bridge in the cluster's network namespace.
rows_cluster=(
  "${rows_demo[@]}"
  "${rows_image[@]}"
  "containerd                       containerd             the local cluster's container runtime"
  "/usr/lib/cni/bridge              containernetworking-plugins  the pods' network"
)
rows_test=(
  "${rows_cluster[@]}"
  "pgbouncer                        pgbouncer              the tests run through PgBouncer in transaction mode"
  "promtool                         prometheus             the alert rules' unit tests and a real scrape"
  "prometheus-pushgateway           prometheus-pushgateway the metrics push test"
  "chromium                         chromium               the console's browser tests"
  "chromedriver                     chromium-driver        the console's browser tests"
)
rows_bench=(
  "${rows_test[@]}"
  "pgbench                          postgresql-contrib     the reference every throughput is measured against"
)

case "$want" in
  demo) rows=("${rows_demo[@]}") ;;
  cluster) rows=("${rows_cluster[@]}") ;;
  test) rows=("${rows_test[@]}") ;;
  bench) rows=("${rows_bench[@]}") ;;
  image) rows=("${rows_image[@]}") ;;
  *) echo "usage: $0 demo|cluster|test|bench|image" >&2; exit 2 ;;
esac

present() {
  local check=$1
  if [[ $check == /* ]]; then
    compgen -G "$check" >/dev/null
  else
    command -v "$check" >/dev/null 2>&1 || [[ -x /usr/sbin/$check || -x /usr/bin/$check ]]
  fi
}

missing=() packages=()
for row in "${rows[@]}"; do
  read -r check package why <<<"$row"
  # A test database given from outside needs no local server.
  if [[ $package == postgresql && -n ${JOBFENCE_TEST_DATABASE_URL:-} ]]; then continue; fi
  if ! present "$check"; then
    missing+=("$check (Debian package $package: $why)")
    [[ " ${packages[*]} " == *" $package "* ]] || packages+=("$package")
  fi
done
((${#packages[@]})) || exit 0

if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "system-packages: missing, and this user cannot install them:" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  echo "install them as root (apt-get install -y ${packages[*]}), then run make again" >&2
  exit 2
fi

echo "system-packages: installing ${packages[*]} (first run on this machine)"
start=$SECONDS
export DEBIAN_FRONTEND=noninteractive
# Another apt run (a second make, an administrator) holds the lock for a while: wait for it.
apt=(apt-get -o DPkg::Lock::Timeout=600)
"${apt[@]}" install -y -qq --no-install-recommends "${packages[@]}" >/dev/null 2>&1 \
  || { "${apt[@]}" update -qq && "${apt[@]}" install -y -qq --no-install-recommends "${packages[@]}" >/dev/null; }
# Debian starts the services it installs; jobfence's tests and demo start their own.
if command -v systemctl >/dev/null 2>&1; then
  for service in prometheus prometheus-pushgateway pgbouncer postgresql containerd; do
    systemctl stop "$service" >/dev/null 2>&1 || true
  done
fi
for service in prometheus prometheus-pushgateway pgbouncer; do
  pkill -x "$service" >/dev/null 2>&1 || true
done
echo "system-packages: done in $((SECONDS - start)) s"
