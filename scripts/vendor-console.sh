#!/usr/bin/env bash
# Refresh the web console's vendored front-end libraries (src/cryobox/console/static/vendor/) from npm.
# Versions are pinned here and recorded in static/vendor/README.md; nothing is fetched at run time.
set -euo pipefail
XTERM_VERSION=${XTERM_VERSION:-6.0.0}
FIT_VERSION=${FIT_VERSION:-0.11.0}
repo=$(cd "$(dirname "$0")/.." && pwd)
dest="$repo/src/cryobox/console/static/vendor"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
npm init -y >/dev/null
npm install --no-audit --no-fund --ignore-scripts "@xterm/xterm@$XTERM_VERSION" "@xterm/addon-fit@$FIT_VERSION" >/dev/null
mkdir -p "$dest/xterm" "$dest/addon-fit"
cp node_modules/@xterm/xterm/lib/xterm.mjs "$dest/xterm/xterm.js"
cp node_modules/@xterm/xterm/css/xterm.css "$dest/xterm/xterm.css"
cp node_modules/@xterm/xterm/LICENSE "$dest/xterm/LICENSE"
cp node_modules/@xterm/addon-fit/lib/addon-fit.mjs "$dest/addon-fit/addon-fit.js"
cp node_modules/@xterm/addon-fit/LICENSE "$dest/addon-fit/LICENSE"
# source maps are not shipped: drop the comments that point at them
sed -i '/^\/\/# sourceMappingURL=/d' "$dest/xterm/xterm.js" "$dest/addon-fit/addon-fit.js"
echo "vendored @xterm/xterm@$XTERM_VERSION @xterm/addon-fit@$FIT_VERSION into $dest"
