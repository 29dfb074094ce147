#!/bin/sh
# `make bench`, the README's main job, as a student meets it: an unprivileged user, a fresh clone
# of this checkout in its home, npm, node and Chromium absent from PATH, and no root to install
# them. Must complete and print its table with Python >= 3.11 and pip only. The install path is
# the real one; the sample is small (2 prompts x 32 tokens): what is checked here is that it runs.
#
# Run as root (CI is root): creates the user $STUDENT (default: student) if it does not exist.
# The clone holds what is committed, as CI's own checkout does.
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
user=${STUDENT:-student}
[ "$(id -u)" = 0 ] || { echo "$0: run as root; it creates and uses the unprivileged user $user" >&2; exit 1; }
id "$user" >/dev/null 2>&1 || useradd --create-home --shell /bin/sh "$user"
home=$(getent passwd "$user" | cut -d: -f6)
clone="$home/specdec_learn"

# PATH: every command of /usr/local/bin, /usr/bin and /bin but npm, npx, node and Chromium
bin="$home/.fresh-clone-bin"
rm -rf "$bin" "$clone"
mkdir -p "$bin"
for dir in /usr/local/bin /usr/bin /bin; do
    for f in "$dir"/*; do
        name=${f##*/}
        case "$name" in npm|npx|node|nodejs|corepack|chromium*|chromedriver|google-chrome*) continue ;; esac
        [ -e "$bin/$name" ] || ln -s "$f" "$bin/$name"
    done
done
chown -R "$user": "$bin"

git clone --quiet --no-hardlinks "$repo" "$clone"
chown -R "$user": "$clone"

# The student's environment: a clean one, with this machine's pip settings (where pip finds the CPU
# torch on disk, its certificates, a proxy) and nothing else of root's
set -- HOME="$home" USER="$user" LOGNAME="$user" PATH="$bin" LANG=C.UTF-8 SHELL=/bin/sh
for var in $(env | sed -n 's/^\(PIP_[A-Z_]*\|[a-zA-Z_]*_proxy\|[A-Z_]*_PROXY\|SSL_CERT_[A-Z_]*\)=.*/\1/p'); do
    eval "set -- \"\$@\" $var=\"\${$var}\""
done

start=$(date +%s)
runuser -u "$user" -- env -i "$@" sh -c '
    set -eu
    cd "$HOME/specdec_learn"
    echo "as $(id -un) (uid $(id -u)) in $PWD with $(python3 --version)"
    for tool in npm node chromium; do
        if command -v "$tool" >/dev/null 2>&1; then echo "$tool is on PATH: this check needs it absent" >&2; exit 1; fi
    done
    [ ! -w /usr/bin ] || { echo "/usr/bin is writable: this check needs an unprivileged user" >&2; exit 1; }
    nice make bench BENCH_PROMPTS=2 BENCH_TOKENS=32
    test -s results/bench.json && test -s results/bench.png
    python3 -c "import json; r = json.load(open(\"results/bench.json\"))[\"results\"]; \
assert [x[\"method\"] for x in r] == [\"ar\", \"ngram\", \"ngram\", \"ngram\"], r; print(\"results/bench.json: 4 records\")"
'
echo "fresh clone, unprivileged make bench: $(( $(date +%s) - start )) s"
