#!/bin/sh
# npm and Chromium, for `make test` and `make book` only (`make bench` needs neither).
#   npm       book/build.py fetches MathJax, require.js and the widget embed script with it
#   Chromium  tests/test_book.py and tests/test_jupyterlab.py drive it through Playwright
#             ($CHROMIUM, else Debian's /usr/bin/chromium)
# Root on Debian: installed with apt-get (Ubuntu ships Chromium as a snap, which apt cannot install).
# Anywhere else: a message says what to install and how, and the browser tests skip; with CI=true a
# missing tool is an error instead.
set -eu
chromium=${CHROMIUM:-/usr/bin/chromium}
missing=""
command -v npm >/dev/null 2>&1 || missing="$missing npm"
[ -x "$chromium" ] || missing="$missing chromium"
[ -z "$missing" ] && exit 0

debian=no
[ -r /etc/os-release ] && (. /etc/os-release && [ "${ID:-}" = debian ]) && debian=yes
if [ "$(id -u)" = 0 ] && [ "$debian" = yes ] && command -v apt-get >/dev/null 2>&1 && [ "$chromium" = /usr/bin/chromium ]; then
    apt-get update -q
    apt-get install -y -q $missing
    exit 0
fi

cat >&2 <<EOF

  Missing:$missing (needed by \`make test\` and \`make book\` only; \`make bench\` needs neither).
  They are installed automatically only as root on Debian. Install them yourself:
    Debian:   sudo apt-get install$missing
    Ubuntu:   sudo apt-get install npm; sudo snap install chromium; export CHROMIUM=/snap/bin/chromium
    Fedora:   sudo dnf install nodejs-npm chromium
    macOS:    brew install node; brew install --cask chromium
  A Chrome or Chromium elsewhere works too: export CHROMIUM=/path/to/chromium
  (macOS: /Applications/Chromium.app/Contents/MacOS/Chromium).
  Until then the browser tests are skipped, and \`make book\` stops without npm.

EOF
case "${CI:-}" in
    1|true|TRUE|True|yes) echo "CI=$CI: a missing browser or npm is an error here, not a skip." >&2; exit 1 ;;
esac
exit 0
